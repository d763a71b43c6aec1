"""`env.name` as your own code: built-in names, `package.module:attr`, `path/file.py:attr`,
objects passed to the Python API; `env.args`; the errors (exit code 2 on the command line)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from saorl.config import ConfigError, config_to_toml, load_config
from saorl.envs.base import EnvSpec, TaskList
from saorl.envs.factory import build_env

USER_ENV = textwrap.dedent('''
    from dataclasses import dataclass
    from saorl import EnvSpec, StepResult, TaskList

    @dataclass(frozen=True)
    class Item:
        prompt: str
        answer: str
        key: str

    class Echo:
        """Say the word back."""
        offload = False
        stop = (";",)

        @classmethod
        def tasks(cls, words=("ab", "cd"), held=("ef",)):
            return [Item(w, w, w) for w in words], [Item(w, w, w) for w in held]

        @staticmethod
        def demo(task, rng):
            return [(task.prompt, False), (task.answer + ";", True)]

        async def reset(self, task):
            self.task = task
            return [{"role": "user", "content": task.prompt}]

        async def step(self, action_text):
            return StepResult(reward=float(action_text == self.task.answer + ";"), done=True)

    def make(n=3, max_turns=2):
        items = [Item(str(i), str(i), str(i)) for i in range(n)]
        return EnvSpec(TaskList(items, items[:1]), Echo, max_turns=max_turns, stop=(";",))

    def broken(**kwargs):
        raise RuntimeError("the factory is broken")

    def not_a_spec():
        return [1, 2]

    class NoTasks:
        async def reset(self, task): ...
        async def step(self, action_text): ...

    SPEC = EnvSpec(TaskList([Item("a", "a", "a")], []), Echo)
    NUMBER = 7
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_envs.py"
    path.write_text(USER_ENV)
    return path


def env_cfg(name: str, *overrides: str):
    return load_config(None, [f"env.name={name}", *overrides]).env


def test_builtin_names_still_resolve() -> None:
    assert build_env(env_cfg("arithmetic", "env.eval_size=4")).max_turns == 1
    assert build_env(env_cfg("tool_arithmetic", "env.eval_size=4")).stop == ("</calc>",)


def test_module_attr_on_sys_path(user_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(user_file.parent))
    spec = build_env(env_cfg("my_envs:make", "env.args={n = 5, max_turns = 3}"))
    assert [t.key for t in spec.task.train] == ["0", "1", "2", "3", "4"]  # env.args reached it
    assert spec.max_turns == 3 and spec.stop == (";",)
    assert type(spec.make_env()).__name__ == "Echo"
    monkeypatch.delitem(sys.modules, "my_envs")


def test_file_attr_is_stored_absolute_and_resolves_from_elsewhere(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["env.name=my_envs.py:make"])
    assert cfg.env.name == f"{user_file}:make"
    saved = tmp_path / "config.toml"
    saved.write_text(config_to_toml(cfg))
    monkeypatch.chdir(Path(os.sep))  # a resume or a Ray actor elsewhere: same file
    again = load_config(saved)
    assert again.env.name == f"{user_file}:make"
    assert len(build_env(again.env).task.train) == 3


def test_env_class_with_tasks_classmethod(user_file: Path) -> None:
    cfg = env_cfg(f"{user_file}:Echo", 'env.args={words = ["x", "y", "z"]}', "env.max_turns=2")
    spec = build_env(cfg)
    assert [t.key for t in spec.task.train] == ["x", "y", "z"]
    assert [t.key for t in spec.task.held_out] == ["ef"]
    assert spec.max_turns == 2 and spec.max_tool_calls == cfg.max_tool_calls
    assert spec.stop == (";",) and spec.demo is not None
    assert spec.step_timeout_s == cfg.step_timeout_s


def test_an_envspec_attribute_is_copied_not_mutated(user_file: Path) -> None:
    spec = build_env(env_cfg(f"{user_file}:SPEC", "env.step_timeout_s=5"))
    assert spec.step_timeout_s == 5
    from saorl.envs.custom import load_reference

    assert load_reference(f"{user_file}:SPEC").step_timeout_s == 600.0


def test_env_args_round_trip_through_toml() -> None:
    cfg = load_config(None, ["env.name=pkg.mod:make", 'env.args={n = 2, "odd key" = [1, 2]}'])
    assert cfg.env.args == {"n": 2, "odd key": [1, 2]}
    assert load_config(None, []).env.args == {}
    path_cfg = config_to_toml(cfg)
    assert 'args = {n = 2, "odd key" = [1, 2]}' in path_cfg
    from saorl.api import make_config

    with pytest.raises(ConfigError, match=r"env.args: values must be TOML data.*x.y\[1\] is None"):
        make_config({"env.name": "pkg.mod:make", "env.args": {"x": {"y": [1, None]}}})


@pytest.mark.parametrize(
    "name, message",
    [
        ("arithmetc", "is not a built-in environment"),
        ("my_envs.py", "is not a built-in environment"),
        ("pkg.mod:", "is not a built-in environment"),
        ("pkg/mod:make", "is not a built-in environment"),
    ],
)
def test_malformed_names_fail_at_config_time(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        env_cfg(name)
    assert "env.name" in str(err.value) and "path/to/file.py:attr" in str(err.value)


def test_args_with_a_builtin_env_and_weights_without_fns_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"env.args is for your own env.name"):
        env_cfg("arithmetic", "env.args={n = 1}")
    with pytest.raises(ConfigError, match=r"env.reward_weights has 1 entries for 0"):
        env_cfg("arithmetic", "env.reward_weights=[1.0]")


@pytest.mark.parametrize(
    "attr, message",
    [
        ("nope", "has no attribute 'nope'; it defines: Echo, Item, NoTasks, broken, make"),
        ("broken", "the factory raised RuntimeError: the factory is broken (at "),
        ("not_a_spec", "the factory returned a list, not an EnvSpec"),
        ("NUMBER", "names an object of type int"),
        ("NoTasks", "needs a classmethod tasks"),
        ("Item", "has no reset or step: not an Env"),
    ],
)
def test_bad_attributes_are_clear_errors(user_file: Path, attr: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"env.name") as err:
        build_env(env_cfg(f"{user_file}:{attr}"))
    assert message in str(err.value)
    assert str(user_file) in str(err.value)


def test_factory_called_with_wrong_args(user_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"raised TypeError.*env.args: {'m': 1}"):
        build_env(env_cfg(f"{user_file}:make", "env.args={m = 1}"))


def test_missing_module_file_and_failing_import(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"no module named 'no_such_pkg'.*PYTHONPATH"):
        build_env(env_cfg("no_such_pkg.envs:make"))
    with pytest.raises(ConfigError, match=r"file not found: .*missing.py"):
        build_env(env_cfg(f"{tmp_path}/missing.py:make"))
    (tmp_path / "bad_import.py").write_text("import no_such_dependency\n")
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing bad_import failed: ModuleNotFoundError"):
        build_env(env_cfg("bad_import:make"))
    with pytest.raises(ConfigError, match=r"loading .*bad_syntax.py failed: SyntaxError"):
        build_env(env_cfg(f"{tmp_path}/bad_syntax.py:make"))


def test_objects_are_named_by_import_path_when_they_have_one(
    user_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saorl.api import make_config
    from saorl.envs.custom import load_reference

    make = load_reference(f"{user_file}:make")
    assert make_config(env=make).env.name == f"{user_file}:make"  # a file-loaded object
    monkeypatch.syspath_prepend(str(user_file.parent))
    import my_envs  # type: ignore[import-not-found]

    assert make_config(env=my_envs.Echo).env.name == "my_envs:Echo"
    monkeypatch.delitem(sys.modules, "my_envs")

    spec = EnvSpec(TaskList([1, 2], [3]), lambda: None)  # type: ignore[arg-type,return-value]
    cfg = make_config({"run.total_steps": 2}, env=spec)
    assert cfg.env.name.startswith("python-object:EnvSpec#") and cfg.run.total_steps == 2
    assert build_env(cfg.env).task.train == [1, 2]
    assert make_config(env=spec).env.name == cfg.env.name  # same object, same name
    # another process (a Ray actor, a resume) cannot rebuild it: a clear error
    with pytest.raises(ConfigError, match=r"cannot be rebuilt here"):
        build_env(env_cfg("python-object:Gone#99"))
    ray_cfg = make_config(env=spec, overrides=["ray.enabled=true"])
    from saorl.api import train

    with pytest.raises(ConfigError, match=r"Ray actors cannot rebuild"):
        train(ray_cfg)


def test_make_config_forms(tmp_path: Path) -> None:
    from saorl.api import make_config

    toml = tmp_path / "c.toml"
    toml.write_text("[run]\ntotal_steps = 7\n[learner]\nlr = 0.5\n")
    cfg = make_config(toml, {"run.total_steps": 9, "learner": {"batch_size": 4}})
    assert (cfg.run.total_steps, cfg.learner.lr, cfg.learner.batch_size) == (9, 0.5, 4)
    again = make_config(cfg, ["run.name=x"], env="tool_arithmetic")
    assert (again.run.total_steps, again.run.name, again.env.name) == (9, "x", "tool_arithmetic")
    with pytest.raises(ConfigError, match=r"use 'section.field'"):
        make_config({"total_steps": 3})
    with pytest.raises(ConfigError, match=r"run.total_steps"):
        make_config({"run.total_steps": 0})


def test_import_saorl_imports_no_torch() -> None:
    code = (
        "import sys, saorl\n"
        "assert callable(saorl.EnvSpec) and 'saorl.api' not in sys.modules\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pydantic')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

"""Your own environment and reward functions, run as a user runs them: `saorl.train` in a
notebook or script, and `saorl train | eval | value-pretrain` with `env.name` naming a file."""

from __future__ import annotations

import json
import string
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import saorl
from saorl.cli.main import main
from tests.conftest import tiny_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=48",
    "learner.batch_size=8",
    "learner.micro_batch_size=8",
    "learner.sft_steps=0",
    "rollout.max_new_tokens=6",
    "critic.warmup_steps=1",
    "run.progress=false",
    "run.eval_samples=1",
    "run.total_steps=2",
    "run.eval_every=0",
]


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_example_environment_learns(tmp_path: Path) -> None:
    # Synchronous and inline (the example's env does not offload): one seed, one outcome.
    # Measured on seeds 0-3: the mean reward of the last 10 steps beat the first 10 by 0.10-0.14.
    summary = saorl.train(
        {
            "model": {"hidden_size": 64, "intermediate_size": 128},
            "learner": {
                "batch_size": 32,
                "micro_batch_size": 32,
                "sft_steps": 150,
                "sft_lr": 3e-3,
                "lr": 1e-3,
                "lr_warmup_steps": 0,
            },
            "critic.warmup_steps": 2,
            "run": {
                "total_steps": 40,
                "eval_every": 0,
                "concurrency": "sync",
                "seed": 1,
                "output_dir": str(tmp_path),
                "progress": False,
            },
        },
        env=f"{EXAMPLE}:guessing",
    )
    assert summary["steps"] == 40 and Path(summary["run_dir"]).parent == tmp_path
    rewards = [r["rollout/reward_mean"] for r in rows(Path(summary["run_dir"]))[1:]]
    assert len(rewards) == 40
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, (first, last)


REWARDS = textwrap.dedent("""
    import asyncio

    def exact(completion, answer, **kwargs):
        return float(completion.strip() == answer)

    async def longer(completion, **kwargs):
        await asyncio.sleep(0)
        return min(len(completion), 6) / 6

    def never(**kwargs):
        return None

    def flaky(id, **kwargs):   # a column of the row
        if id % 3 == 0:
            raise ValueError(f"cannot score row {id}")
        return 0.0
""")


def test_reward_functions_in_a_run(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"{i}+1", "answer": str(i + 1), "id": i}) + "\n"
            for i in range(40)
        )
    )
    fns = tmp_path / "fns.py"
    fns.write_text(REWARDS)
    names = ", ".join(f'"{fns}:{f}"' for f in ("exact", "longer", "never", "flaky"))
    # A random policy rarely says EOS: every character is a stop string, so each turn is one
    # character long and always reaches the environment and its reward functions.
    stop = json.dumps(list(string.ascii_letters + string.digits + string.punctuation + " "))
    cfg = tiny_config(
        *TINY,
        "env.name=math",
        f"env.dataset={data}",
        "env.use_tool=false",
        "env.eval_size=4",
        "env.instructions=false",
        f"rollout.stop={stop}",
        f"env.reward_fns=[{names}]",
        "env.reward_weights=[1.0, 0.5, 1.0, 1.0]",
        f"run.output_dir={tmp_path}",
    )
    summary = saorl.train(cfg)
    assert summary["steps"] == 2
    train_rows = [r for r in rows(Path(summary["run_dir"])) if "loss/policy" in r]
    assert len(train_rows) == 2
    assert sum(r["rollout/failed"] for r in train_rows) > 0  # flaky raised: episodes failed
    for r in train_rows:
        assert 0.0 <= r["reward/exact"] <= 1.0 and 0.0 <= r["reward/longer"] <= 1.0
        assert r["reward/flaky"] == 0.0 and "reward/never" not in r
        # the episode reward is the weighted sum of what the functions returned
        expected = r["reward/exact"] + 0.5 * r["reward/longer"]
        assert r["rollout/reward_mean"] == pytest.approx(expected)


USER_ENV = textwrap.dedent("""
    from saorl import EnvSpec, StepResult, TaskList

    class Echo:
        offload = False

        async def reset(self, task):
            self.task = task
            return [{"role": "user", "content": task + "="}]

        async def step(self, action_text):
            return StepResult(reward=float(action_text.strip() == self.task), done=True)

    def make(n=12):
        words = [f"{i:02d}" for i in range(n)]
        return EnvSpec(TaskList(words[4:], words[:4]), Echo,
                       demo=lambda t, rng: [(t + "=", False), (t, True)])

    def broken(**kwargs):
        raise RuntimeError("no tasks today")

    NUMBER = 3
""")


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "echo.py").write_text(USER_ENV)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "envs" / "echo.py"


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_such_pkg.envs:make", "no module named 'no_such_pkg'"),
        ("envs/missing.py:make", "file not found"),
        ("envs/echo.py:nope", "has no attribute 'nope'; it defines: Echo, broken, make"),
        ("envs/echo.py:NUMBER", "names an object of type int"),
        ("envs/echo.py:broken", "the factory raised RuntimeError: no tasks today"),
    ],
)
def test_bad_env_strings_exit_2(user_env: Path, capsys, name: str, message: str) -> None:
    code = main(["train", f"env.name={name}", "run.output_dir=runs", *TINY])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "env.name" in err, err
    assert "Traceback" not in err
    assert not Path("runs").exists()  # nothing trained, nothing left behind


def test_resume_eval_and_value_pretrain_with_a_file_env(
    user_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    args = [
        "env.name=envs/echo.py:make",
        "env.args={n = 10}",
        "run.output_dir=runs",
        "run.name=echo",
        "learner.sft_steps=2",
        *TINY,
    ]
    assert main(["train", *args]) == 0
    run = tmp_path / "runs" / "echo"
    assert f'name = "{user_env}:make"' in (run / "config.toml").read_text()  # stored absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the relative path would no longer resolve from here
    # The env is code the run folder names: a resume imports it only when trusted.
    assert main(["train", "--resume", str(run), "run.total_steps=3"]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--trust-remote-code", "run.total_steps=3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    capsys.readouterr()

    out = tmp_path / "eval.jsonl"
    # the run's own env, by its config
    assert main(["eval", str(run), "--trust-remote-code", "--out", str(out)]) == 0
    per_problem = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["key"] for p in per_problem] == ["00", "01", "02", "03"]

    summary = saorl.evaluate(run, limit=2, trust_remote_code=True)  # the same rules
    assert (summary["problems"], summary["k"]) == (2, 1) and 0.0 <= summary["pass@1"] <= 1.0

    critic = tmp_path / "critic.pt"
    code = main(
        [
            "value-pretrain",
            "--rollouts",
            "8",
            "--epochs",
            "1",
            "--out",
            str(critic),
            f"env.name={user_env}:make",
            *TINY,
        ]
    )
    assert code == 0 and critic.is_file()


class Parrot:
    """A notebook-style environment object: no import path another process could use."""

    offload = False

    async def reset(self, task):
        self.task = task
        return [{"role": "user", "content": task}]

    async def step(self, action_text):
        return saorl.StepResult(reward=float(action_text == self.task), done=True)


def test_evaluate_an_env_object(tmp_path: Path) -> None:
    spec = saorl.EnvSpec(saorl.TaskList(["ab"], ["cd", "ef", "gh"]), Parrot)
    summary = saorl.evaluate("builtin:tiny", tiny_config(*TINY), env=spec, limit=2)
    assert summary["problems"] == 2 and summary["accuracy"] == 0.0


@pytest.mark.slow
def test_ray_actors_resolve_a_file_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pytest.importorskip("ray")
    # The learner and rollout actors rebuild the environment from the string; the tasks the
    # driver hands them (dataclasses of the example's file) pickle by reference to the module
    # the actor loaded under the same name.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            "--ray",
            "ray.num_cpus=2",
            f"env.name={EXAMPLE}:guessing",
            "run.output_dir=runs",
            "run.name=ray",
            "learner.sft_steps=2",
            *TINY,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "ray" / "summary.json").read_text())
    assert summary["steps"] == 2

"""`env.reward_fns`: what a reward function receives, sync and async ones, None, weights, and
the failures (raise, wrong type, timeout) that fail one episode."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from saorl.config import ConfigError, load_config
from saorl.envs.base import StepResult
from saorl.envs.factory import build_env
from saorl.envs.rewards import RewardFunctionError, task_columns

REWARDS = textwrap.dedent("""
    import asyncio
    seen = []

    def exact(completion, answer, **kwargs):
        seen.append({"completion": completion, "answer": answer, **kwargs})
        return float(completion.strip() == answer)

    async def length(completion, **kwargs):
        await asyncio.sleep(0)
        return len(completion) / 10

    def only_named(completion, answer):   # no **kwargs: gets only what it names
        return 0.5

    def skip(**kwargs):
        return None

    def boom(**kwargs):
        raise ValueError("bad row")

    def text(**kwargs):
        return "1.0"

    def slow(**kwargs):
        import time
        time.sleep(1)
        return 1.0

    async def slow_async(**kwargs):
        await asyncio.sleep(5)
        return 1.0
""")


# Asks twice: the first turn gets an observation (reward 0.3, which the functions replace).
TWO_TURNS = textwrap.dedent("""
    from saorl import EnvSpec, StepResult, TaskList

    class TwoTurns:
        offload = False

        async def reset(self, task):
            self.turn = 0
            return [{"role": "user", "content": task["question"]}]

        async def step(self, action_text):
            self.turn += 1
            if self.turn == 1:
                return StepResult([{"role": "tool", "content": "again"}], reward=0.3)
            return StepResult(reward=0.7, done=True, info={"mine": 1})

    def make():
        rows = [{"question": "q", "answer": "42", "id": 1}]
        return EnvSpec(TaskList(rows, rows), TwoTurns, max_turns=2)
""")


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def scored_env(tmp_path: Path, rewards_file: Path, fns: list[str], *extra: str):
    envs = tmp_path / "two_turns.py"
    envs.write_text(TWO_TURNS)
    names = ", ".join(f'"{rewards_file}:{f}"' for f in fns)
    cfg = load_config(None, [f"env.name={envs}:make", f"env.reward_fns=[{names}]", *extra])
    spec = build_env(cfg.env)
    return spec.make_env(), spec.task.train[0]


def play(env, task, turns=("first", " 42 ")) -> list[StepResult]:
    async def go():
        await env.reset(task)
        return [await env.step(t) for t in turns]

    return asyncio.run(go())


def test_weighted_sum_of_sync_async_and_none(tmp_path: Path, rewards_file: Path) -> None:
    env, task = scored_env(
        tmp_path,
        rewards_file,
        ["exact", "length", "skip", "only_named"],
        "env.reward_weights=[2.0, 1.0, 5.0, 1.0]",
    )
    first, last = play(env, task)
    assert first.reward == 0.0 and not first.done  # intermediate rewards are the functions'
    assert last.done
    assert last.reward == pytest.approx(2.0 * 1.0 + 0.4 + 0.5)  # `skip` (None) left out
    assert last.info["reward/exact"] == 1.0 and last.info["reward/length"] == 0.4
    assert "reward/skip" not in last.info and last.info["mine"] == 1
    from saorl.envs.custom import load_reference

    seen = load_reference(f"{rewards_file}:exact").__globals__["seen"][-1]
    assert seen["completion"] == " 42 " and seen["answer"] == "42" and seen["id"] == 1
    assert seen["question"] == "q"  # every column of the row
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert seen["messages"][-1]["content"] == " 42 "


def test_all_none_scores_zero(tmp_path: Path, rewards_file: Path) -> None:
    env, task = scored_env(tmp_path, rewards_file, ["skip"])
    assert play(env, task)[-1].reward == 0.0


@pytest.mark.parametrize(
    "fn, message",
    [
        ("boom", "reward function boom raised ValueError: bad row"),
        ("text", "reward function text returned '1.0'; expected a finite float or None"),
        ("slow", "reward function slow took more than 0.2 s"),
        ("slow_async", "reward function slow_async took more than 0.2 s"),
    ],
)
def test_failures_fail_the_episode(
    tmp_path: Path, rewards_file: Path, fn: str, message: str
) -> None:
    env, task = scored_env(tmp_path, rewards_file, ["exact", fn], "env.reward_timeout_s=0.2")
    with pytest.raises(RewardFunctionError, match=message):
        play(env, task)


def test_same_names_get_distinct_metric_keys(tmp_path: Path, rewards_file: Path) -> None:
    other = tmp_path / "more.py"
    other.write_text("def exact(**kwargs):\n    return 0.25\n")
    env, task = scored_env(
        tmp_path,
        rewards_file,
        ["exact"],
        f'env.reward_fns=["{rewards_file}:exact", "{other}:exact"]',
    )
    info = play(env, task)[-1].info
    assert info["reward/exact"] == 1.0 and info["reward/exact_2"] == 0.25


def test_bad_references_are_config_errors(tmp_path: Path, rewards_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"env.reward_fns: .nope. is not an import path"):
        load_config(None, ['env.reward_fns=["nope"]'])
    with pytest.raises(ConfigError, match=r"has no attribute 'missing'"):
        scored_env(tmp_path, rewards_file, ["missing"])
    (tmp_path / "values.py").write_text("X = 3\n")
    cfg = load_config(None, [f'env.reward_fns=["{tmp_path}/values.py:X"]'])
    with pytest.raises(ConfigError, match=r"not a function"):
        build_env(cfg.env)


def test_task_columns() -> None:
    from saorl.envs.arithmetic import Problem
    from saorl.envs.data.datasets import MathProblem

    assert task_columns(Problem("1+1=", "2", "k")) == {"prompt": "1+1=", "answer": "2", "key": "k"}
    assert task_columns({"a": 1}) == {"a": 1}
    assert task_columns(MathProblem("p", "a", "k", row={"question": "p", "x": 2})) == {
        "question": "p",
        "x": 2,
    }
    assert task_columns(7) == {}


FORMS = textwrap.dedent("""
    seen = {}

    def trl_style(prompts, completions, answer, **kwargs):
        seen["trl"] = {"prompts": prompts, "completions": completions, "answer": answer, **kwargs}
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    async def trl_chat(completions, **kwargs):
        seen["chat"] = completions
        return [len(completions[0][0]["content"]) / 10]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen["verl"] = (data_source, solution_str, ground_truth, extra_info)
        return {"score": float(ground_truth in solution_str), "acc": 1.0, "pred": "x"}

    def verl_float(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    def trl_scalar(completions, **kwargs):
        return 1.0

    def kw_list(**kwargs):
        return [0.5]

    def positional_only(completion, /):
        return 1.0
""")

# Rows in TRL's conversational layout (prompt messages) and verl's (reward_model.ground_truth).
ROWS_ENV = textwrap.dedent("""
    from saorl import EnvSpec, StepResult, TaskList

    class OneTurn:
        offload = False
        tools = [{"type": "function", "function": {"name": "lookup"}}]

        async def reset(self, task):
            return list(task["prompt"])

        async def step(self, action_text):
            return StepResult(done=True)

    def make():
        rows = [{"prompt": [{"role": "user", "content": "6*7?"}], "data_source": "toy",
                 "reward_model": {"ground_truth": "42"}, "extra_info": {"i": 0}, "answer": "42"}]
        return EnvSpec(TaskList(rows, rows), OneTurn)
""")


def _forms_env(tmp_path: Path, fns: list[str], *extra: str):
    (tmp_path / "forms.py").write_text(FORMS)
    (tmp_path / "rows_env.py").write_text(ROWS_ENV)
    names = ", ".join(f'"{tmp_path}/forms.py:{f}"' for f in fns)
    cfg = load_config(
        None, [f"env.name={tmp_path}/rows_env.py:make", f"env.reward_fns=[{names}]", *extra]
    )
    spec = build_env(cfg.env)
    return spec.make_env(), spec.task.train[0]


def _seen(tmp_path: Path) -> dict:
    from saorl.envs.custom import load_reference

    return load_reference(f"{tmp_path}/forms.py:seen")


def test_trl_form_gets_a_batch_of_one_and_returns_a_list(tmp_path: Path) -> None:
    (tmp_path / "forms.py").write_text(FORMS)
    envs = tmp_path / "two_turns.py"
    envs.write_text(TWO_TURNS)
    cfg = load_config(
        None, [f"env.name={envs}:make", f'env.reward_fns=["{tmp_path}/forms.py:trl_style"]']
    )
    spec = build_env(cfg.env)
    last = play(spec.make_env(), spec.task.train[0])[-1]
    assert last.reward == 1.0 and last.info["reward/trl_style"] == 1.0
    seen = _seen(tmp_path)["trl"]
    # Standard (text) rows: strings; every column a list of one.
    assert seen["prompts"] == ["q"] and seen["completions"] == [" 42 "]
    assert seen["answer"] == ["42"] and seen["id"] == [1] and seen["question"] == ["q"]


def test_trl_conversational_and_verl_forms(tmp_path: Path) -> None:
    env, task = _forms_env(tmp_path, ["trl_chat", "compute_score", "verl_float"])
    (last,) = play(env, task, turns=("it is 42",))
    seen = _seen(tmp_path)
    assert seen["chat"] == [[{"role": "assistant", "content": "it is 42"}]]
    assert seen["verl"] == ("toy", "it is 42", "42", {"i": 0})
    assert last.info["reward/trl_chat"] == 0.8 and last.info["reward/compute_score"] == 1.0
    assert last.info["reward/compute_score/acc"] == 1.0  # the dict's other numbers, logged
    assert "reward/compute_score/pred" not in last.info
    assert last.reward == pytest.approx(0.8 + 1.0 + 0.25)


def test_declared_form_and_wrong_returns(tmp_path: Path) -> None:
    env, task = _forms_env(tmp_path, ["trl_scalar"])
    with pytest.raises(RewardFunctionError, match=r"TRL form\) returned 1.0; expected a list"):
        play(env, task, turns=("x",))
    # Nothing in the signature says TRL: declared, the list is read as TRL's.
    env, task = _forms_env(tmp_path, ["kw_list"])
    with pytest.raises(RewardFunctionError, match=r"returned \[0.5\]; expected a finite float"):
        play(env, task, turns=("x",))
    env, task = _forms_env(tmp_path, ["kw_list"], "env.reward_signature=trl")
    assert play(env, task, turns=("x",))[-1].reward == 0.5
    with pytest.raises(ConfigError, match=r"positional-only"):
        _forms_env(tmp_path, ["positional_only"])


def test_missing_column_is_a_config_error_at_build(tmp_path: Path, rewards_file) -> None:
    # `exact` names `answer`; these rows have none.
    (tmp_path / "rows.py").write_text(
        "from saorl import EnvSpec, TaskList\n"
        "def make():\n    rows = [{'question': 'q', 'solution': '1'}]\n"
        "    return EnvSpec(TaskList(rows, rows), object)\n"
    )
    cfg = load_config(
        None, [f"env.name={tmp_path}/rows.py:make", f'env.reward_fns=["{rewards_file}:exact"]']
    )
    with pytest.raises(
        ConfigError,
        match=r"exact\(\) requires answer, .*columns: question, "
        r"solution\)",
    ):
        build_env(cfg.env)


def test_the_wrapper_forwards_tools_to_the_chat_template(tmp_path: Path) -> None:
    from saorl.models.tokenizer import build_char_tokenizer
    from saorl.rollout.episode import ChatCodec

    env, task = _forms_env(tmp_path, ["verl_float"])
    assert env.tools == [{"type": "function", "function": {"name": "lookup"}}]
    tok = build_char_tokenizer(with_newlines=True)
    tok.chat_template = (
        "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    messages = asyncio.run(env.reset(task))
    prompt = tok.decode(ChatCodec(tok).prompt_ids(messages, env.tools))
    assert prompt == "[lookup]6*7?"
    with pytest.raises(AttributeError):
        env.no_such_attribute  # noqa: B018

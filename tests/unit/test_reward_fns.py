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
    env, task = scored_env(tmp_path, rewards_file, ["exact", "length", "skip", "only_named"],
                           "env.reward_weights=[2.0, 1.0, 5.0, 1.0]")  # fmt: skip
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
    env, task = scored_env(tmp_path, rewards_file, ["exact"], f'env.reward_fns=["{rewards_file}'
                           f':exact", "{other}:exact"]')  # fmt: skip
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
    from saorl.envs.datasets import MathProblem

    assert task_columns(Problem("1+1=", "2", "k")) == {"prompt": "1+1=", "answer": "2", "key": "k"}
    assert task_columns({"a": 1}) == {"a": 1}
    assert task_columns(MathProblem("p", "a", "k", row={"question": "p", "x": 2})) == {
        "question": "p", "x": 2,
    }  # fmt: skip
    assert task_columns(7) == {}

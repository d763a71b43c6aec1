"""The built-in calculator tool task: the calculator, the demonstrations and the environment."""

from __future__ import annotations

import asyncio
import random

import pytest

from saorl.envs.tool_arithmetic import ToolArithmeticEnv, ToolArithmeticTask, calculate


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("37*58", "2146"),
        ("(2+3)*4", "20"),
        ("-7//2", "-4"),
        ("9%4", "1"),
        ("1/0", "error: unsupported BinOp"),  # true division is not offered
        ("1//0", "error: division by zero"),
        ("__import__('os')", "error: unsupported Call"),
        ("2.5*2", "error: unsupported Constant"),
        ("9" * 70, "error: expression too long"),
        ("99999999*99999999", "error: too large"),
        ("1+", "error: syntax"),
    ],
)
def test_calculator(expr, value):
    assert calculate(expr) == value


def test_held_out_never_sampled_and_demos_use_both_habits():
    task = ToolArithmeticTask(num_digits=2, eval_size=50, seed=1)
    held = {p.key for p in task.held_out}
    rng = random.Random(0)
    samples = [task.sample(rng) for _ in range(500)]
    assert not held & {p.key for p in samples}
    demos = [ToolArithmeticTask.demo(p, rng) for p in samples[:200]]
    with_tool = [d for d in demos if len(d) == 4]
    assert 70 < len(with_tool) < 130  # about half
    d = with_tool[0]
    assert [trained for _, trained in d] == [False, True, False, True]
    a, b = d[0][0].rstrip("=").split("*")
    assert d[1][0] == f"<calc>{a}*{b}</calc>"
    assert d[2][0] == f"<output>{int(a) * int(b)}</output>" and d[3][0] == str(int(a) * int(b))


def test_env_answers_tool_calls_then_grades():
    env = ToolArithmeticEnv()
    task = ToolArithmeticTask(num_digits=2, eval_size=10, seed=1)
    p = task.held_out[0]
    asyncio.run(env.reset(p))
    r = asyncio.run(env.step(f"<calc>{p.key}</calc>"))
    assert not r.done and r.info["tool_call"]
    assert r.observations[0]["content"] == f"<output>{p.answer}</output>"
    bad = asyncio.run(env.step("<calc>1+"))
    assert "error" in bad.observations[0]["content"]
    assert asyncio.run(env.step(p.answer)).reward == 1.0
    assert asyncio.run(env.step("0")).reward == 0.0

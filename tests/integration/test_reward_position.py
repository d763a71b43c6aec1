"""The outcome reward sits on the last model token, for every environment that ships.

A reward off the last model token is one of the critic failures issue 43 lists from published
SAO runs: the value head would be trained towards a reward it never sees. Here each built-in
environment runs real episodes through the rollout worker, its own `reset`, `step` and grader,
with scripted model turns (an answer, and for tool environments a tool call first, and a run
cut by `max_turns` right after a tool call, whose observation must be dropped); every
trajectory must end on a model token and `Batch.from_trajectories` must put the reward there.
"""

from __future__ import annotations

import queue
import random
import time

import pytest

from saorl.config.env import BUILTIN_ENVS
from saorl.envs.factory import build_env
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker
from saorl.types import Batch
from tests.conftest import tiny_config
from tests.integration.test_agent_loop import TEMPLATE, ScriptedEngine

# Environments whose episodes need something outside this process; their trajectories end
# through the same `Episode.finish` (trailing observations dropped), not run here.
ELSEWHERE = {
    "swe": "needs a repository checkout and the sandboxed shell",
    "agent": "agent programs call the training endpoint from programs of their own",
    "openenv": "needs an OpenEnv server",
    "verifiers": "needs a verifiers taskset",
}
OVERRIDES = {"reasoning_gym": ('env.reasoning_gym.datasets=["chain_sum"]',)}


def _scripts(name: str, task, spec) -> dict[str, tuple[list[str], int]]:
    """`{case: (model turns, max_turns)}` for one task of environment `name`."""
    if name == "arithmetic":
        return {"right": ([task.answer], 1), "wrong": ([task.answer + "1"], 1)}
    if name == "tool_arithmetic":
        call = f"<calc>{task.key}</calc>"
        return {"answer": ([task.answer], 4), "tool": ([call, task.answer], 4), "cut": ([call], 1)}
    if name == "math":
        call, answer = "<python>print(1)</python>", f"\\boxed{{{task.answer}}}"
        return {"answer": ([answer], 4), "tool": ([call, answer], 4), "cut": ([call], 1)}
    if name == "reasoning_gym":
        answer = spec.demo(task, random.Random(0))[-1][0]  # its warm-up's answer format
        return {"answer": ([answer], 1), "wrong": (["no"], 1)}
    raise AssertionError(f"no script for {name}")


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_the_reward_sits_on_the_last_model_token(name):
    if name in ELSEWHERE:
        pytest.skip(ELSEWHERE[name])
    spec = build_env(tiny_config(f"env.name={name}", *OVERRIDES.get(name, ())).env)
    task = spec.task.sample(random.Random(0))
    tok = build_char_tokenizer(with_newlines=True)
    tok.chat_template = TEMPLATE
    rewards = {}
    for case, (turns, max_turns) in _scripts(name, task, spec).items():
        out: queue.Queue = queue.Queue()
        limits = AgentLimits(2048, 128, max_turns, spec.max_tool_calls, spec.stop)
        worker = RolloutWorker(
            ScriptedEngine(tok, turns), FixedFeed([task]), tok, out, spec.make_env, limits
        )
        try:
            deadline = time.monotonic() + 60  # environment steps may run on their own loop
            while out.empty() and time.monotonic() < deadline:
                worker.fill()
                worker.step()
                time.sleep(0.001)
            traj = out.get_nowait()
        finally:
            worker.stop_thread()
        assert traj.stop_reason != "env_error", traj.info
        assert traj.loss_mask[-1] == 1, (case, traj.stop_reason)  # ends on a model token
        if case == "tool":  # an observation in the middle, the answer after it
            assert 0 in traj.loss_mask
        if case == "cut":  # max_turns after a tool call: its observation is dropped
            assert traj.stop_reason == "max_turns" and all(traj.loss_mask)
        batch = Batch.from_trajectories([traj], pad_id=tok.pad_token_id)
        last = len(traj.prompt_ids) + len(traj.loss_mask) - 1
        assert batch.action_mask[0, last] == 1 and batch.attention_mask[0, last + 1 :].sum() == 0
        assert batch.rewards[0, last].item() == traj.reward
        assert batch.rewards.sum().item() == traj.reward  # and nowhere else
        rewards[case] = traj.reward
    # The scripts are graded by the environment itself: a right answer earns more.
    assert max(rewards.values()) > 0

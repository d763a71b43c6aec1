"""Failed episodes are never silent: the first of each group (exception type and the user's
file:line) printed with the user's frames, all counted by group, and a first batch of mostly
failures stops the run (exit 2, the error and what to fix named)."""

from __future__ import annotations

import asyncio
import io
import queue
import random

import pytest

from saorl.config import ConfigError
from saorl.rollout.collector import BatchCollector
from saorl.rollout.failures import MAX_DISTINCT, OTHER, FailureLog, failure_info
from saorl.rollout.worker import PromptFeed
from saorl.types import Trajectory


def user_step(action: str) -> None:
    return {}["missing"]  # the user's bug


# The group of its failures: the innermost cause's type and the user's file:line.
HERE = f"KeyError at tests/unit/test_failures.py:{user_step.__code__.co_firstlineno + 1}"


def _failed(key: str = "k", where: str = "step") -> Trajectory:
    try:
        try:
            user_step("x")
        except KeyError as e:
            raise RuntimeError("wrapped") from e  # as saorl's reward wrapper does
    except RuntimeError as e:
        info = failure_info(where, e)
    return Trajectory([1], [], [], [], [], stop_reason="env_error", prompt_key=key, info=info)


def _ok(reason: str = "answer") -> Trajectory:
    return Trajectory([1], [2], [1], [0.0], [0], reward=1.0, stop_reason=reason)


def test_failure_info_keeps_the_innermost_frames() -> None:
    info = _failed().info
    assert info["error"] == "step: RuntimeError: wrapped"
    assert "in user_step" in info["traceback"] and "KeyError: 'missing'" in info["traceback"]
    # Grouped by the innermost cause's type and the user's file:line, not by message.
    assert info["error_group"] == f"step: {HERE}"
    assert info["error_source"] == "environment"


def test_saorl_frames_are_trimmed_and_a_reward_function_is_named() -> None:
    from saorl.envs.rewards import RewardEnv, RewardFn

    def broken(completion: str) -> float:
        return float(completion)  # the user's line

    fns = [RewardFn("broken", broken, 1.0, frozenset({"completion"}))]
    env = RewardEnv(None, fns, 5.0)  # type: ignore[arg-type]
    try:
        asyncio.run(env.score({}, "not a number", []))
    except Exception as e:
        info = failure_info("step", e)
    assert info["error_source"] == "reward function"
    assert info["error_group"].startswith("step: ValueError at tests/unit/test_failures.py:")
    assert "return float(completion)" in info["traceback"]
    assert "saorl/envs/rewards.py" not in info["traceback"]  # saorl's wrapper is not shown


def test_each_group_printed_once_and_counted() -> None:
    out = io.StringIO()
    log = FailureLog(out)
    for i in range(3):
        t = _failed()
        t.info["error"] = f"step: RuntimeError: wrapped {i}"  # texts differ, the place does not
        log.record(t)
    log.record(_ok())
    log.record(_failed(where="reset"))
    assert log.counts == {f"step: {HERE}": 3, f"reset: {HERE}": 1}
    text = out.getvalue()
    assert text.count("saorl: episode failed (task k): step: RuntimeError: wrapped 0") == 1
    assert "wrapped 1" not in text
    assert text.count("in user_step") == 2  # once per group
    assert "(the environment failed;" in text
    for i in range(MAX_DISTINCT + 5):  # errors with no place of their own: by message
        log.record(_message(f"step: timed out after {i} s"))
    assert len(log.counts) == MAX_DISTINCT + 1 and log.counts[OTHER] == 7


def _message(error: str) -> Trajectory:
    return Trajectory([1], [], [], [], [], stop_reason="env_error", info={"error": error})


def _collector(trajs: list[Trajectory]) -> BatchCollector:
    out: queue.Queue[Trajectory] = queue.Queue()
    for t in trajs:
        out.put(t)
    feed = PromptFeed(None, random.Random(0), batch_size=4, max_staleness=1)
    c = BatchCollector([], feed, out, group_size=1, sync=False)
    c.failures = FailureLog(io.StringIO())
    return c


def test_a_first_batch_of_mostly_failures_stops_the_run() -> None:
    # Length-cut episodes never reached the verdict: 4 failures against 1 answer stop it.
    c = _collector(
        [
            _failed(),
            _ok("length"),
            _failed(),
            _ok(),
            _ok("length"),
            _failed(),
            _failed(),
            _ok("length"),
        ]
    )
    match = r"4 of the first 5 episodes .* \(4 times, step: KeyError at .*\): step: .*fix the env"
    with pytest.raises(ConfigError, match=match):
        c.collect(0, 4, 1)


def test_too_few_failures_to_judge_do_not_stop_it() -> None:
    # Most episodes cut by the length budget: 1 failure of 2 judged ones, then 3 of 4.
    c = _collector([_failed(), _ok("length"), _ok("length"), _ok(), _ok("length")])
    assert len(c.collect(0, 4, 1)[0]) == 4
    c = _collector([_failed(), _failed(), _failed(), _ok(), *[_ok("length")] * 3])
    assert len(c.collect(0, 4, 1)[0]) == 4
    c = _collector([*[_failed()] * 4, _ok(), *[_ok("length")] * 3])  # 4 of 4: stop
    with pytest.raises(ConfigError, match=r"4 of the first 4 episodes"):
        c.collect(0, 4, 1)


def test_some_failures_or_later_ones_do_not_stop_it() -> None:
    c = _collector(
        [
            _failed(),
            _ok(),
            _ok(),
            _ok(),
            _ok(),
            *[_failed() for _ in range(8)],
            _ok(),
            _ok(),
            _ok(),
            _ok(),
        ]
    )
    assert len(c.collect(0, 4, 1)[0]) == 4  # 1 of 4 failed
    assert len(c.collect(0, 4, 1)[0]) == 4  # the second batch is not checked
    assert c.failures.counts == {f"step: {HERE}": 9}
    assert c.failed == 9


def test_a_custom_env_step_that_raises_is_recorded_by_the_worker() -> None:
    from saorl.rollout.worker import AgentLimits, RolloutWorker

    class Env:
        offload = False

        async def reset(self, task):
            raise ValueError(f"no such task {task}")

        async def step(self, action_text):  # pragma: no cover - reset fails first
            raise AssertionError

    out: queue.Queue[Trajectory] = queue.Queue()

    worker = RolloutWorker.__new__(RolloutWorker)  # only the episode plumbing is exercised
    worker.make_env, worker.out, worker.active, worker.episodes = Env, out, 0, {}
    worker.traits = {}
    worker.limits = AgentLimits(max_seq_len=8, max_new_tokens=4)
    worker._inline_loop = asyncio.new_event_loop()
    worker._start_episode("t1")
    traj = out.get_nowait()
    assert traj.stop_reason == "env_error"
    assert traj.info["error"] == "reset: ValueError: no such task t1"
    assert "in reset" in traj.info["traceback"]


def test_failed_episodes_are_dumped_with_their_error(tmp_path) -> None:
    import json

    from saorl.models.tokenizer import build_char_tokenizer
    from saorl.monitoring.metrics import MetricsLogger
    from saorl.monitoring.samples import SAMPLES_FILE, SampleLogger

    tok = build_char_tokenizer()
    with MetricsLogger(tmp_path) as log:
        samples = SampleLogger(tmp_path, tok, every=1, count=1, last_step=1, log=log)
        samples.maybe_log(1, [_ok()], [0], {}, failed=[_failed("p7")])
    rows = [json.loads(x) for x in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert [(r["index"], r["stop_reason"]) for r in rows] == [(0, "answer"), (None, "env_error")]
    assert rows[1]["prompt_key"] == "p7"
    assert rows[1]["info"]["error"] == "step: RuntimeError: wrapped"
    assert "in user_step" in rows[1]["info"]["traceback"]

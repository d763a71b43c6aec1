"""The coding environment driven by the real agent loop and a scripted engine: tool calls run in
the sandbox, their output comes back as masked observation tokens, submit grades the diff."""

from __future__ import annotations

import json
import queue
import random
import time

import pytest

from saorl.engines.protocol import Completion, GenerationRequest
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.gen.generator import generate_pool
from saorl.envs.swe.spec import hermes_call
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.tools import CODE_TAG
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from saorl.toolcalls import stop_strings

pytestmark = pytest.mark.slow


class ScriptedEngine:
    """Answers each request with the next scripted turn (no EOS: the turn ends on its stop
    string, as a real engine would stop on `</tool_call>`)."""

    def __init__(self, tok, turns: list[str]) -> None:
        self.tok, self.turns = tok, list(turns)
        self.max_concurrent = 1
        self._queue: list[GenerationRequest] = []

    def add_request(self, r: GenerationRequest) -> None:
        self._queue.append(r)

    def num_unfinished(self) -> int:
        return len(self._queue)

    def step(self) -> list[Completion]:
        out = []
        for r in self._queue:
            ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)[: r.max_new_tokens]
            out.append(Completion(r, ids, [-0.5] * len(ids), [7] * len(ids), "stop"))
        self._queue = []
        return out


class OneTask:
    def __init__(self, task: SweTask) -> None:
        self.task = task

    def sample(self, rng: random.Random) -> SweTask:
        return self.task


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> SweTask:
    held, _ = generate_pool(21, 1, 0, tmp_path_factory.mktemp("swe-cache"))
    return held[0]


def _episode(task: SweTask, turns: list[str], fmt: str = "hermes", max_turns: int = 6):
    tok = build_char_tokenizer(with_newlines=True)
    engine = ScriptedEngine(tok, turns)
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(
        max_seq_len=16384,
        max_new_tokens=4096,
        max_turns=max_turns,
        max_tool_calls=8,
        stop=tuple(stop_strings(fmt, tag=CODE_TAG)),
    )
    work = task.snapshot.parent.parent / "work"
    worker = RolloutWorker(
        engine,
        PromptFeed(OneTask(task), random.Random(0), 1, 1),
        tok,
        out,
        lambda: SweEnv(
            fmt, max_turns=max_turns, max_tool_calls=8, test_timeout_s=5.0, work_dir=work
        ),
        limits,
    )
    worker.fill()
    deadline = time.monotonic() + 120
    while out.empty() and time.monotonic() < deadline:
        worker.step()  # tool calls and grading run off-thread: keep stepping
        time.sleep(0.005)
    worker.stop_thread()
    traj = out.get_nowait()
    text = tok.decode(traj.completion_ids, skip_special_tokens=True)
    model_text = tok.decode(
        [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m]
    )
    assert not list(work.glob("saorl-swe-ws-*")), "the episode's repository copy was not removed"
    return traj, text, model_text


def test_gold_fix_through_the_tools_gets_reward_one(task):
    path, old, new = task.edit
    turns = [
        hermes_call("view", path=path),
        hermes_call("str_replace", path=path, old=old, new=new),
        hermes_call("submit"),
    ]
    traj, text, model_text = _episode(task, turns)
    assert traj.stop_reason == "answer", traj.info.get("error")
    assert traj.reward == 1.0
    info = traj.info
    assert info["resolved"] and info["submitted"] == "tool"
    assert info["tests"] == dict.fromkeys(task.fail_to_pass + task.pass_to_pass, "passed")
    assert (info["turns"], info["tool_calls"]) == (3, 2)
    assert info["changed_files"] == [path] and f"+++ b/{path}" in info["patch"]
    # Tool output (the viewed file, the edit report) sits in mask-0 observation tokens.
    assert model_text == "".join(turns)
    assert "    1  " in text and "Edited " + path in text
    assert "Edited" not in model_text


def test_code_format_shell_fix_and_implicit_submit(task):
    path, old, new = task.edit
    script = (
        "python - <<'EOF'\nimport json, pathlib\n"
        f"p = pathlib.Path({json.dumps(path)})\n"
        f"p.write_text(p.read_text().replace({json.dumps(old)}, {json.dumps(new)}, 1))\n"
        "print('patched')\nEOF"
    )
    turns = [f"<bash>{script}</bash>", "I fixed the bug."]
    traj, text, _ = _episode(task, turns, fmt="code")
    assert traj.reward == 1.0 and traj.info["submitted"] == "implicit"
    assert "<output>\npatched\n</output>" in text


def test_budget_end_auto_submits_and_errors_are_observations(task):
    path, old, new = task.edit
    turns = [
        '<tool_call>{"name": "str_replace", "arguments": {"path": 1}}</tool_call>',
        '<tool_call>{"name": "view"</tool_call>',
        hermes_call("str_replace", path=path, old=old, new=new),
    ]
    traj, text, _ = _episode(task, turns, max_turns=3)
    assert "error: str_replace needs the string argument 'path'" in text
    assert "error: tool call is not valid JSON" in text
    assert traj.stop_reason == "answer" and traj.info["submitted"] == "auto"
    assert traj.reward == 1.0


def test_no_op_submit_gets_zero(task):
    traj, _, _ = _episode(task, [hermes_call("bash", command="ls"), hermes_call("submit")])
    assert traj.reward == 0.0 and not traj.info["resolved"]
    assert traj.info["changed_files"] == []
    assert set(traj.info["tests"]) == set(task.fail_to_pass + task.pass_to_pass)


def test_copy_that_outgrows_its_disk_budget_ends_the_episode(task):
    import asyncio

    async def run() -> tuple:
        env = SweEnv("hermes", max_growth_bytes=1 << 20, work_dir=task.snapshot.parent / "w")
        await env.reset(task)
        small = await env.step(hermes_call("bash", command="head -c 1000 /dev/zero > a.bin"))
        work = env.work
        big = await env.step(hermes_call("bash", command="head -c 3000000 /dev/zero > b.bin"))
        return small, big, work

    small, big, work = asyncio.run(run())
    assert not small.done and small.info["tool_status"] == "ok"
    assert big.done and big.reward == 0.0 and "grew past" in big.info["grade_error"]
    assert not work.exists()

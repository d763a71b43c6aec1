"""The agent loop with a scripted engine and the project's tokenizer: token in, token out."""

from __future__ import annotations

import queue
import random
import time
from dataclasses import dataclass

import pytest

from saorl.engines.protocol import Completion, GenerationRequest
from saorl.envs.base import StepResult
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.episode import ChatCodec
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@dataclass(frozen=True)
class Q:
    text: str
    key: str = "q"


class ScriptedEngine:
    """Answers every request with the next scripted turn; records what it was asked."""

    def __init__(self, tok, turns: list[str], eos: bool = True) -> None:
        self.tok, self.turns, self.eos = tok, list(turns), eos
        self.max_concurrent = 4
        self.version = 3
        self.requests: list[GenerationRequest] = []
        self._queue: list[GenerationRequest] = []

    def add_request(self, r: GenerationRequest) -> None:
        self.requests.append(r)
        self._queue.append(r)

    def num_unfinished(self) -> int:
        return len(self._queue)

    def step(self) -> list[Completion]:
        out = []
        for r in self._queue:
            ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)
            ids = ids[: r.max_new_tokens]
            reason = "length" if len(ids) == r.max_new_tokens else "eos"
            if reason == "eos" and self.eos:
                ids = [*ids, self.tok.eos_token_id]
            lps = [-0.1 * (i + 1) for i in range(len(ids))]
            out.append(Completion(r, ids, lps, [self.version] * len(ids), reason))
            self.version += 1
        self._queue = []
        return out


class ToolEnv:
    """Answers the first `n_tools` turns with an observation, then grades."""

    offload = False

    def __init__(self, n_tools: int = 1, fail: bool = False) -> None:
        self.n_tools, self.fail, self.calls = n_tools, fail, 0

    async def reset(self, task: Q):
        return [{"role": "user", "content": task.text}]

    async def step(self, action_text: str) -> StepResult:
        if self.fail:
            raise RuntimeError("tool server down")
        self.calls += 1
        if self.calls <= self.n_tools:
            obs = [{"role": "tool", "content": f"out{self.calls}"}]
            return StepResult(obs, info={"tool_call": True})
        return StepResult(reward=1.0, done=True)


def _run(tok, turns, env_factory, **limits):
    engine = ScriptedEngine(tok, turns)
    feed = PromptFeed(_Tasks(), random.Random(0), 1, 1)
    out: queue.Queue = queue.Queue()
    lim = AgentLimits(
        **{"max_seq_len": 64, "max_new_tokens": 8, "max_turns": 4, "max_tool_calls": 4, **limits}
    )
    worker = RolloutWorker(engine, feed, tok, out, env_factory, lim)
    worker.fill()
    for _ in range(10):
        worker.step()
    return out.get_nowait(), engine


class _Tasks:
    @staticmethod
    def sample(rng):
        return Q("2+2")


@pytest.fixture
def tok():
    t = build_char_tokenizer()
    t.chat_template = TEMPLATE
    return t


def test_multi_turn_ids_masks_logprobs_versions_align(tok):
    traj, engine = _run(tok, ["calc", "4"], ToolEnv)
    assert traj.stop_reason == "answer" and traj.reward == 1.0
    assert traj.info["turns"] == 2 and traj.info["tool_calls"] == 1
    # The concatenation is exactly the template's rendering of the whole conversation.
    conversation = [
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "calc"},
        {"role": "tool", "content": "out1"},
        {"role": "assistant", "content": "4"},
    ]
    expected = tok.encode(
        tok.apply_chat_template(conversation, tokenize=False), add_special_tokens=False
    )
    assert traj.prompt_ids + traj.completion_ids == expected
    # Model tokens: "calc<eos>" then "4<eos>"; the rest is observation.
    first, second = 5, 2
    obs = len(traj.completion_ids) - first - second
    assert traj.loss_mask == [1] * first + [0] * obs + [1] * second
    assert traj.rollout_logprobs[:first] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert traj.rollout_logprobs[first : first + obs] == [0.0] * obs
    assert traj.versions == [3] * first + [-1] * obs + [4] * second
    assert tok.decode(traj.completion_ids[first : first + obs]) == "<tool>out1<assistant>"
    # The second turn was asked for the whole history, token in.
    assert engine.requests[1].prompt_ids == traj.prompt_ids + traj.completion_ids[: first + obs]


def test_budget_is_clamped_to_the_remaining_context(tok):
    prompt_len = len(ChatCodec(tok).prompt_ids([{"role": "user", "content": "2+2"}]))
    obs_len = len(tok.encode("<tool>out1<assistant>", add_special_tokens=False))
    # Room for the first turn ("ab<eos>"), the observation and 4 more tokens.
    traj, engine = _run(tok, ["ab", "abcdefgh"], ToolEnv, max_seq_len=prompt_len + 3 + obs_len + 4)
    assert engine.requests[0].max_new_tokens == 8
    assert engine.requests[1].max_new_tokens == 4
    assert traj.stop_reason == "context"
    assert traj.loss_mask[-1] == 1


def test_never_ends_on_observation_tokens(tok):
    traj, _ = _run(tok, ["a", "b"], lambda: ToolEnv(n_tools=5), max_turns=2)
    assert traj.stop_reason == "max_turns"
    assert traj.loss_mask[-1] == 1
    assert tok.decode(traj.completion_ids).endswith("b<eos>")


def test_tool_call_limit(tok):
    traj, _ = _run(tok, ["a", "b", "c"], lambda: ToolEnv(n_tools=5), max_tool_calls=1)
    assert traj.stop_reason == "max_tool_calls"
    assert traj.info["tool_calls"] == 2 and traj.loss_mask[-1] == 1


def test_observation_that_would_overflow_is_not_appended(tok):
    prompt_len = len(ChatCodec(tok).prompt_ids([{"role": "user", "content": "2+2"}]))
    traj, _ = _run(tok, ["ab", "cd"], ToolEnv, max_seq_len=prompt_len + 3 + 5)
    assert traj.stop_reason == "context"
    assert traj.loss_mask == [1, 1, 1]


def test_env_error_is_contained(tok):
    traj, _ = _run(tok, ["ab"], lambda: ToolEnv(fail=True))
    assert traj.stop_reason == "env_error"
    assert "tool server down" in traj.info["error"]


def test_no_template_appends_observation_text(tok):
    plain = build_char_tokenizer()
    traj, _ = _run(plain, ["calc", "4"], ToolEnv)
    assert plain.decode(traj.prompt_ids) == "2+2"
    assert plain.decode(traj.completion_ids, skip_special_tokens=True) == "calcout14"


@dataclass(frozen=True)
class _Problem:
    prompt: str
    answer: str
    key: str = "p"


def _run_math_tool(turns: list[str], problem: _Problem, fmt: str, stop: str, max_seq_len: int):
    """One MathToolEnv episode in `fmt` through a real worker, the model's turns scripted;
    returns the trajectory and the tokenizer."""
    from saorl.envs.math.tool import MathToolEnv

    plain = build_char_tokenizer(with_newlines=True)

    class OneTask:
        @staticmethod
        def sample(rng):
            return problem

    def grader(response: str, reference: str) -> float:
        return float(f"\\boxed{{{reference}}}" in response)

    out: queue.Queue = queue.Queue()
    limits = AgentLimits(
        max_seq_len=max_seq_len, max_new_tokens=80, max_turns=5, max_tool_calls=4, stop=(stop,)
    )
    worker = RolloutWorker(
        ScriptedEngine(plain, turns, eos=False),
        PromptFeed(OneTask(), random.Random(0), 1, 1),
        plain,
        out,
        lambda: MathToolEnv(fmt=fmt, grader=grader),
        limits,
    )
    worker.fill()
    deadline = time.monotonic() + 60
    while out.empty() and time.monotonic() < deadline:
        worker.step()  # sandbox calls run off-thread: keep stepping until the episode ends
        time.sleep(0.005)
    worker.stop_thread()
    return out.get_nowait(), plain


def test_math_tool_env_runs_code_in_the_sandbox_and_grades_the_answer():
    turns = ["<python>print(2**20)</python>", "<python>print(1/0)</python>", "\\boxed{1048576}"]
    problem = _Problem("What is 2**20?", "1048576")
    traj, plain = _run_math_tool(turns, problem, "code", "</python>", 1024)
    assert traj.stop_reason == "answer", traj.info.get("error")
    assert traj.reward == 1.0
    assert traj.info["tool_calls"] == 2
    text = plain.decode(traj.completion_ids, skip_special_tokens=True)
    assert "<output>\n1048576\n</output>" in text
    assert "ZeroDivisionError" in text
    # Observation tokens (sandbox output) carry mask 0; the model's own turns mask 1.
    masked_text = plain.decode(
        [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m]
    )
    assert masked_text == "".join(turns)


def test_calls_the_env_cannot_run_are_counted_and_reported():
    """A malformed call and a call to an unknown tool count in `tool_calls_bad` (the run's
    `rollout/tool_calls_bad_frac`, the evaluation's `eval/tool_calls_bad_frac`); a call that
    runs does not, whatever its program prints."""
    from saorl.evaluation.held_out import summarize

    turns = [
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"name": "calc", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>',
        "\\boxed{1}",
    ]
    traj, _ = _run_math_tool(turns, _Problem("What is 1?", "1"), "hermes", "</tool_call>", 2048)
    assert traj.stop_reason == "answer", traj.info.get("error")
    assert traj.info["tool_calls"] == 3
    assert traj.info["tool_calls_bad"] == 2
    metrics = summarize([traj])
    assert metrics["eval/tool_calls_bad_frac"] == pytest.approx(2 / 3)

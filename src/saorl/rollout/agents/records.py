"""Token-level recording of one agent episode served by the training endpoint.

An agent program sends messages; the engine samples token ids. The rules (docs/agents.md):

- A call whose messages are the previous call's messages, then the assistant message the
  endpoint returned for it (content and tool calls as sent), then new messages (tool results,
  the user's next turn) *extends* the episode: its prompt ids are the previous prompt ids, the
  previous call's sampled ids exactly as sampled (never re-tokenized), then the ids of the new
  messages and the next turn's header, cut from the chat template's rendering as the built-in
  agent loop does (`ChatCodec.observation_ids`). Those ids are observation tokens: loss mask 0.
  When the template does not reproduce the sampled text (it renders tool calls its own way, or
  drops earlier reasoning) the new messages are rendered after a placeholder turn instead and
  the call is counted in `agent/retokenize_mismatch`.
- Any other call (the agent rewrote, summarised or dropped history, or branched) starts a new
  *segment*: a trajectory of its own with the rendered prompt as its prompt, trained with the
  episode's reward, unless its fresh prompt ids happen to extend the current segment's tokens.

Each segment is an `Episode` (`saorl.rollout.episode`): its `finish` makes the `Trajectory`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from saorl.rollout.episode import ChatCodec, Episode
from saorl.types import Trajectory


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates take them: text parts joined into one string, None
    content as "", tool-call arguments decoded to objects (templates `tojson` them)."""
    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        m["content"] = content or ""
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        with contextlib.suppress(ValueError):
            fn["arguments"] = json.loads(fn["arguments"])
    return {**call, "function": fn}


def _as_sent(message: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """An assistant message reduced to what identifies it: its text and its calls."""
    content = template_messages([message])[0]["content"]
    calls = []
    for c in message.get("tool_calls") or []:
        fn = _template_call(c).get("function", {}) if isinstance(c, dict) else {}
        calls.append((fn.get("name"), fn.get("arguments")))
    return content.strip(), calls


@dataclass
class LastCall:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    sampled_ids: list[int]
    reply: dict[str, Any]  # the assistant message the endpoint returned


@dataclass
class AgentSession:
    """One live episode of the endpoint: its key, task and recorded segments (thread-safe)."""

    key: str
    task: Any
    group_id: int
    codec: ChatCodec
    segments: list[Episode] = field(default_factory=list)
    calls: int = 0
    mismatches: int = 0
    closed: bool = False
    last: LastCall | None = None
    finish_reasons: list[str] = field(default_factory=list)
    # The last prompt rendered: (messages, tools, text), for `_prompt_text`
    rendered: tuple[list[dict], list[dict] | None, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- prompts ------------------------------------------------------------------------------
    def _render(self, messages: list[dict], tools: list[dict] | None, gen: bool = True) -> str:
        if self.codec.templated:
            return self.codec._render(template_messages(messages), gen, tools)
        return "".join(m["content"] for m in template_messages(messages))

    def _prompt_text(self, messages: list[dict], tools: list[dict] | None) -> str:
        """The prompt rendering of `messages`. An extending call renders the previous call's
        messages again to cut its observation out; those are the messages last rendered, so
        their text is reused (same messages and tools, same text: one render a call, not two)."""
        cached = self.rendered
        if cached is not None and cached[1] == tools and cached[0] == messages:
            return cached[2]
        text = self._render(messages, tools)
        self.rendered = (list(messages), tools, text)
        return text

    def _encode(self, text: str) -> list[int]:
        return self.codec._encode(text)

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], bool]:
        """`(ids, extends)`: the call's prompt ids and whether they extend the current segment."""
        self.codec.check_tools(tools)  # `tools=` the template cannot render: said once
        with self.lock:
            last = self.last
            n = len(self.last.messages) if self.last else 0
            if (
                last is not None
                and self.segments
                and tools == last.tools
                and len(messages) > n
                and messages[:n] == last.messages
                and messages[n].get("role") == "assistant"
                and _as_sent(messages[n]) == _as_sent(last.reply)
            ):
                head = last.prompt_ids + last.sampled_ids
                return head + self._observation(last, messages[n + 1 :], messages, tools), True
            ids = self._encode(self._prompt_text(messages, tools))
            return ids, self._extends(ids)

    def extends(self, ids: list[int]) -> bool:
        """Whether `ids` start with the current segment's tokens (its prompt, what was
        sampled and the observations since): a call with them continues the segment."""
        with self.lock:
            return self._extends(ids)

    def _extends(self, ids: list[int]) -> bool:
        current = self.segments[-1].ids if self.segments else None
        return current is not None and ids[: len(current)] == current

    def _observation(
        self, last: LastCall, new: list[dict], messages: list[dict], tools: list[dict] | None
    ) -> list[int]:
        decoded = self.codec.tok.decode(last.sampled_ids, skip_special_tokens=False)
        prefix = self._prompt_text(last.messages, tools) + decoded
        full = self._prompt_text(messages, tools)
        if full.startswith(prefix):
            return self._encode(full[len(prefix) :])
        self.mismatches += 1
        if not self.codec.templated:
            return self._encode("".join(m["content"] for m in template_messages(new)))
        stub = [{"role": "user", "content": "x"}]
        head = self._render(stub, tools, gen=False)
        return self._encode(self._render(stub + new, tools)[len(head) :])

    # -- recording ----------------------------------------------------------------------------
    def record(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        prompt_ids: list[int],
        extends: bool,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        finish_reason: str,
        reply: dict[str, Any],
    ) -> None:
        """Add one finished call: its sampled ids, log-probs and versions as the engine gave
        them, after the observation ids that lead from the segment's tokens to its prompt."""
        with self.lock:
            if self.closed:  # the episode ended (timed out) while this call ran
                return
            # Re-checked here: a concurrent call of the same episode may have grown the
            # segment since this call's prompt was built (then this one branches off it).
            seg = self.segments[-1] if self.segments else None
            if extends and seg is not None and prompt_ids[: len(seg.ids)] == seg.ids:
                seg.add_observation(prompt_ids[len(seg.ids) :])
            else:
                seg = Episode(None, self.task, [], list(prompt_ids), group_id=self.group_id)  # type: ignore[arg-type]
                self.segments.append(seg)
            seg.add_turn(list(ids), list(logprobs), list(versions))
            seg.info["finish"] = finish_reason
            seg.tool_calls += int(bool(reply.get("tool_calls")))
            self.calls += 1
            self.finish_reasons.append(finish_reason)
            self.last = LastCall(list(messages), tools, list(prompt_ids), list(ids), reply)

    def trajectories(self, reward: float, info: dict[str, Any], key: str) -> list[Trajectory]:
        """The segments as trajectories, each with the episode's reward; closes the session."""
        with self.lock:
            self.closed = True
            stats = {
                "agent/calls": self.calls,
                "agent/segments": len(self.segments),
                "agent/retokenize_mismatch": self.mismatches,
            }
            out = []
            for seg in self.segments:
                seg.reward = reward
                finish = seg.info.pop("finish", "eos")
                seg.info.update({**info, **stats})
                out.append(seg.finish("length" if finish == "length" else "answer", key=key))
            return out

    def conversation(self) -> list[dict[str, Any]]:
        """The last call's messages and the reply to it: the episode's messages, for scoring."""
        with self.lock:
            if self.last is None:
                return []
            return template_messages([*self.last.messages, self.last.reply])

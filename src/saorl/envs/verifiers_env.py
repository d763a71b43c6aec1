"""verifiers tasksets as the environment (`env.name = "verifiers"`, docs/verifiers.md).

    env.verifiers.taskset = "my-taskset"  # or "path/to/taskset.py"
    env.args = { taskset = { ... }, agent = { harness = { id = "null" } } }   # verifiers' [env]

Each episode is one verifiers episode, run as an agent program (`saorl.envs.agent`) by
`saorl.envs.verifiers_runner` under `env.verifiers.python`, the interpreter that has verifiers
installed: saorl itself never imports verifiers (it pins `openai<3`, the Agents SDK needs
`openai>=3`). One runner process per rollout worker runs all its episodes (`serve`), since
importing verifiers costs seconds. verifiers' training client renders the prompts with the
policy's tokenizer and calls the worker's training endpoint token-in, token-out
(`/inference/v1/generate`); the episode's reward is the rubric's weighted sum, its metrics and
named rewards are `env/*`.

The tasks are the taskset's, listed once when the environment is built (`prepare`, which also
builds the harness runtimes with uv on the first run): the last `env.eval_size` are held out,
training samples the others.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.envs.agent import MODEL_NAME, AgentProgram, _read_result
from saorl.envs.base import AgentFailure, EnvSpec, TaskList
from saorl.envs.data.files import held_out_size
from saorl.security.child_python import module_argv

RUNNER = "saorl.envs.verifiers_runner"
# For a tokenizer without a chat template (the built-in char model): one line, no newlines
# (its vocabulary has none), tool calls in the hermes form the default renderer parses.
PLAIN_TEMPLATE = (
    "{% if tools %}tools: {{ tools | tojson }} {% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}"
    '{% for tc in m.tool_calls or [] %}<tool_call>{"name": "{{ tc.function.name }}", '
    '"arguments": {{ tc.function.arguments | tojson }}}</tool_call>{% endfor %}'
    "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass(frozen=True)
class VerifiersTask:
    """One task of the taskset: its position, verifiers' task key, the start of its prompt."""

    index: int
    key: str
    prompt: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index}


class Renderer:
    """What verifiers' renderer is built from in each process that runs episodes: the policy's
    tokenizer (its directory, or a copy saved once with a plain chat template when it has
    none) and the `renderers` config (`env.args.renderer`; default: auto from the model)."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config
        self.model = ""
        self._lock = threading.Lock()

    def bind(self, tokenizer: Any) -> None:
        with self._lock:
            if self.model:
                return
            path = str(getattr(tokenizer, "name_or_path", "") or "")
            if os.path.isdir(path) and getattr(tokenizer, "chat_template", None):
                self.model = path
                return
            folder = tempfile.mkdtemp(prefix="saorl-verifiers-tokenizer-")
            if not getattr(tokenizer, "chat_template", None):
                tokenizer = copy.deepcopy(tokenizer)  # the worker's own stays as it is
                tokenizer.chat_template = PLAIN_TEMPLATE
            tokenizer.save_pretrained(folder)
            # no model name to resolve a renderer from: its chat template, hermes-style tool
            # calls (renderers names that parser "qwen3"; it needs <tool_call> as one token)
            self.config = self.config or {"name": "default", "tool_parser": "qwen3"}
            self.model = folder


class Runner:
    """The `serve` process of one event loop (a rollout worker's) and its episodes in flight."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.lock = asyncio.Lock()
        self.reader: asyncio.Future | None = None

    async def _process(self) -> asyncio.subprocess.Process:
        async with self.lock:
            if self.proc is None:  # the first episode, or the last process died
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=self.env,
                    limit=1 << 24,
                )
                self.reader = asyncio.ensure_future(self._read(self.proc))
            return self.proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:  # not a reply; the runner sends nothing else here
                continue
            future = self.pending.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)
        code = await proc.wait()
        if self.proc is proc:
            self.proc = None
        failed = AgentFailure(
            "exit", f"the verifiers runner exited with {code} (its stderr is ours)"
        )
        for future in self.pending.values():
            if not future.done():
                future.set_exception(failed)
        self.pending.clear()

    async def close(self) -> None:
        """End the process: its stdin closes, it cancels its episodes and exits."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def episode(self, index: int, base_url: str) -> dict[str, Any]:
        proc = await self._process()
        assert proc.stdin is not None
        n = next(self.ids)
        future = self.pending[n] = asyncio.get_running_loop().create_future()
        proc.stdin.write(json.dumps({"id": n, "index": index, "base_url": base_url}).encode())
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
        try:
            message = await future
        except asyncio.CancelledError:  # timed out, or the run stops: end it there too
            self.pending.pop(n, None)
            if proc.returncode is None:
                proc.stdin.write(json.dumps({"cancel": n}).encode() + b"\n")
            raise
        if "error" in message:
            raise AgentFailure("verifiers", message["error"])
        return message["result"]


class VerifiersProgram(AgentProgram):
    """One verifiers episode: task `index` run by the worker's runner process."""

    metric_prefix = ""  # the runner names its metrics env/...

    def __init__(self, cfg: EnvConfig, renderer: Renderer, settings: dict[str, Any]) -> None:
        super().__init__(cfg, None, None, None)
        self.python = cfg.verifiers.python or sys.executable
        self.renderer = renderer
        self.settings = settings

    def bind_tokenizer(self, tokenizer: Any) -> None:
        self.renderer.bind(tokenizer)

    def _runner(self) -> Runner:
        loop = asyncio.get_running_loop()
        if loop not in RUNNERS:
            settings = {
                **self.settings,
                "model": MODEL_NAME,
                "renderer_model": self.renderer.model,
                "renderer": self.renderer.config,
            }
            env = {**os.environ, "SAORL_VERIFIERS": json.dumps(settings)}
            RUNNERS[loop] = Runner(module_argv(RUNNER, "serve", python=self.python), env)
        return RUNNERS[loop]

    async def aclose(self) -> None:
        """The worker stops: end its runner process."""
        runner = RUNNERS.pop(asyncio.get_running_loop(), None)
        if runner is not None:
            await runner.close()

    async def run(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        conversation: Callable[[], list[dict]],
        worker: str = "",
        local: Callable[[], Any] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        # `local` (the in-process client) is unused: verifiers' runner is another process and
        # reaches the endpoint over HTTP.
        result = await self._runner().episode(task.index, base_url)
        reward, metrics = _read_result(result, self.metric_prefix)
        if reward is None:
            raise AgentFailure("no_reward", "the verifiers episode gave no reward")
        return reward, metrics


# One runner per event loop that runs episodes; it ends with the loop's process (its stdin
# closes) and is started again by the next episode when it died.
RUNNERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runner] = weakref.WeakKeyDictionary()


def prepare(cfg: EnvConfig, settings: dict[str, Any]) -> list[VerifiersTask]:
    """The taskset's tasks, from the runner (which builds harness runtimes the first time;
    its stderr, with that line, goes to ours)."""
    python = cfg.verifiers.python or sys.executable
    try:
        out = subprocess.run(
            module_argv(RUNNER, "prepare", python=python),  # isolated: saorl's own first
            env={**os.environ, "SAORL_VERIFIERS": json.dumps(settings)},
            stdout=subprocess.PIPE,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ConfigError(
            f"env.verifiers.taskset {cfg.verifiers.taskset!r}: listing its tasks with {python} "
            f"failed ({e}); is verifiers installed there (env.verifiers.python, docs/verifiers.md)?"
        ) from None
    rows = json.loads(out.strip().splitlines()[-1])["tasks"]
    return [VerifiersTask(r["index"], r["key"], r["prompt"]) for r in rows]


def build_verifiers_spec(cfg: EnvConfig, held_out_only: bool) -> EnvSpec:
    args = dict(cfg.args)
    renderer = Renderer(args.pop("renderer", None))
    settings = {"env": cfg.verifiers.taskset, "args": args}
    tasks = prepare(cfg, settings)
    if not tasks:
        raise ConfigError(
            f"env.verifiers.taskset {cfg.verifiers.taskset!r}: the taskset has no tasks"
        )
    size = held_out_size(cfg, len(tasks), need_train=not held_out_only)
    train = tasks[:-size]
    held_out = tasks[-size:]
    return EnvSpec(
        TaskList(train, held_out),
        lambda: VerifiersProgram(cfg, renderer, settings),  # type: ignore[arg-type,return-value]
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
    )

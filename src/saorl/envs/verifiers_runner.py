"""The verifiers side of `env.name = "verifiers"` (docs/verifiers.md): a program run with the
interpreter that has verifiers 0.4 installed (`env.verifiers.python`), never imported by the
trainer. Its settings come as JSON in `$SAORL_VERIFIERS` (`env`, `args`, `renderer_model`,
`renderer`).

    python -m saorl.envs.verifiers_runner prepare   # the taskset's tasks as JSON; builds the
                                                    # harness runtimes (uv) the first time
    python -m saorl.envs.verifiers_runner serve     # episodes, as JSON lines on stdin/stdout

`serve` runs for as long as its rollout worker: importing verifiers costs seconds of CPU, so
one process runs all of a worker's episodes, concurrently. Each request line
`{"id": n, "index": i, "base_url": ...}` is one verifiers episode (`Env.run_episode`) of task
`i`, answered `{"id": n, "result": {"reward": ..., "env/...": ...}}` or `{"id": n, "error":
...}`; `{"cancel": n}` stops one. Its model calls are made by verifiers' training client
(`TrainClientConfig`), which renders the prompts with the policy's tokenizer and calls the
training endpoint's `/inference/v1/generate` at the episode's `base_url`, so saorl records the
tokens the engine sampled as they were sampled. Every episode gets an environment of its own
(its interception server and tool servers live and end with it).

Harness programs run through `uv` (`uv sync --script`, packages from the package index) the
first time; `prepare` does that before training, logs it, and keeps a note of each built
interpreter beside verifiers' script cache, so later runs (and every episode) reuse them
without running uv: offline after the first run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

NOTE = ".saorl-python"  # beside each prepared script: the interpreter uv built for it


def _settings() -> dict[str, Any]:
    return json.loads(os.environ.get("SAORL_VERIFIERS") or "{}")


@functools.cache  # the import paths are set once per process
def taskset_id(env: str) -> str:
    """The id verifiers' `load_environment` resolves: a module or package name, or a
    `path/to/taskset.py` (its folder goes on the import path, its stem is the id)."""
    folder = os.getcwd()  # a module next to the config, as `python -m` finds it
    ident = env
    if env.endswith(".py") or os.sep in env:
        path = Path(env).resolve()
        folder = str(path.parent)
        ident = path.stem
    sys.path.insert(0, folder)
    # tool servers run as `python -m <their module>` in processes of their own
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
    return ident


def load_env(settings: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    args = dict(settings.get("args") or {})
    taskset = {**dict(args.pop("taskset", None) or {}), "id": taskset_id(settings["env"])}
    # verifiers' default runtime is a Prime sandbox (a network service); the single-agent
    # seat runs its harness as a local process unless env.args pins another runtime
    fields = vf.env_config_type(taskset["id"]).model_fields
    if "agent" in fields and "runtime" not in (args.get("agent") or {}):
        args["agent"] = {**(args.get("agent") or {}), "runtime": {"type": "subprocess"}}
    return vf.load_environment(vf.resolve_env_config({**args, "taskset": taskset}))


def _note_path(script: str) -> Path:
    return Path(script + NOTE)


def reuse_runtimes() -> None:
    """Hand verifiers the interpreters built in earlier runs, so it runs no uv for them."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    for note in Path(SubprocessRuntime.scripts_dir).glob(f"*.py{NOTE}"):
        python = note.read_text().strip()
        script = str(note)[: -len(NOTE)]
        if Path(python).exists() and Path(script).exists():
            SubprocessRuntime._interpreters.setdefault(script, python)


def _note_runtimes() -> list[tuple[str, str]]:
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    built = []
    for script, python in SubprocessRuntime._interpreters.items():
        if not _note_path(script).exists():
            _note_path(script).write_text(python)
            built.append((script, python))
    return built


async def _prepare(settings: dict[str, Any]) -> dict[str, Any]:
    import verifiers.v1 as vf
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    env = load_env(settings)
    if not env.taskset.bounded:
        raise SystemExit(
            f"verifiers taskset {settings['env']!r} is infinite: bound it in env.args "
            "(its own size setting) so saorl can hold tasks out and sample the rest"
        )
    tasks = [
        {"index": i, "key": task.key, "prompt": task.data.prompt_text[:200]}
        for i, task in enumerate(env.taskset)
    ]
    reuse_runtimes()
    started = time.monotonic()
    for cfg in {c.model_dump_json(): c for c in env.config.agent_harnesses().values()}.values():
        runtime = SubprocessRuntime(vf.SubprocessConfig())
        await runtime.start()
        try:
            await vf.load_harness(cfg).setup(runtime)
        finally:
            await runtime.teardown()
    for script, python in _note_runtimes():
        print(
            f"saorl: verifiers: built a harness runtime with uv in "
            f"{time.monotonic() - started:.1f} s (first run only; packages from the package "
            f"index): {python} for {script}; later runs reuse it offline",
            file=sys.stderr,
            flush=True,
        )
    return {"tasks": tasks}


def _client(settings: dict[str, Any], base_url: str) -> Any:
    import verifiers.v1 as vf

    return vf.TrainClientConfig(
        base_url=base_url,  # the episode's own: its path names the episode
        api_key_var="SAORL_VERIFIERS_API_KEY",  # unset: the path is the credential
        renderer_model_name=settings["renderer_model"],
        renderer=settings.get("renderer"),
        # saorl's episode timeout bounds the calls; a call waits for the engine's batch
        timeout={"connect": 30.0, "read": None},
    )


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def episode_result(episode: Any) -> dict[str, Any]:
    """`{"reward": ..., "env/<metric>": ..., "env/reward/<name>": ...}` of a finished episode:
    the rubric's weighted sum over its traces (one for a single-agent env), its metrics."""
    out: dict[str, Any] = {"reward": sum(t.reward for t in episode.traces)}
    for trace in episode.traces:
        out.update({f"env/{k}": float(v) for k, v in trace.metrics.items() if _finite(v)})
        out.update({f"env/reward/{k}": r.score for k, r in trace.rewards.items() if r is not None})
    return out


async def run_episode(settings: dict[str, Any], task: Any, base_url: str) -> dict[str, Any]:
    """One verifiers episode of `task`, its model calls to `base_url`; raises if it failed."""
    import verifiers.v1 as vf

    env = load_env(settings)
    ctx = vf.ModelContext(
        model=settings.get("model", "policy"),
        client=_client(settings, base_url),
        sampling=vf.SamplingConfig(**(settings.get("sampling") or {})),
    )
    async with env.serving():
        episode = await env.run_episode(task, ctx)
    _note_runtimes()
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if errors or not episode.ok:
        shown = "; ".join(f"{e.type}: {e.message}"[:300] for e in errors) or "not ok"
        raise RuntimeError(f"the verifiers episode failed: {shown}")
    return episode_result(episode)


async def serve(settings: dict[str, Any]) -> None:
    """Episodes for the requests on stdin until it closes (see the module docstring)."""
    tasks = list(load_env(settings).taskset)
    reuse_runtimes()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: dict[int, asyncio.Task] = {}
    # stdout is the replies' channel: whatever else writes to it (a library, a child process
    # inheriting it) goes to stderr instead
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    async def one(n: int, request: dict[str, Any]) -> None:
        try:
            index = int(request["index"])
            if not 0 <= index < len(tasks):
                raise IndexError(f"the taskset has no task {index}")
            result = await run_episode(settings, tasks[index], request["base_url"])
            reply({"id": n, "result": result})
        except asyncio.CancelledError:
            pass
        except Exception as e:  # the episode fails; the others and the process go on
            reply({"id": n, "error": f"{type(e).__name__}: {e}"[:2000]})
        finally:
            running.pop(n, None)

    while line := await reader.readline():
        request = json.loads(line)
        if "cancel" in request:
            if (task := running.pop(request["cancel"], None)) is not None:
                task.cancel()
            continue
        running[request["id"]] = asyncio.create_task(one(request["id"], request))
    for task in running.values():  # the trainer is gone
        task.cancel()


def main(argv: list[str]) -> int:
    # verifiers finds `uv` on PATH: the one installed beside this interpreter comes first
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    settings = _settings()
    if argv[:1] == ["prepare"]:
        print(json.dumps(asyncio.run(_prepare(settings))))
    elif argv[:1] == ["serve"]:
        asyncio.run(serve(settings))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

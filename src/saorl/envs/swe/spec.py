"""`env.name = "swe"`: the task pool, environment factory and demonstrations for the loop."""

from __future__ import annotations

import json
import random
import threading

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import EnvSpec, Segments
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.grading import check_pytest
from saorl.envs.swe.sandbox_tools import replace_once
from saorl.envs.swe.task import SweTask, TaskPool
from saorl.envs.swe.tools import CODE_TAG, ToolRunner, instructions
from saorl.envs.swe.workspace import UnsafeCacheDir, swe_cache_dir
from saorl.toolcalls import ToolFormat, stop_strings


def hermes_call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class GoldDemo:
    """Demonstrations for the supervised warm-up: the gold fix as one `str_replace`, its real
    observation, then `submit` (hermes format, generated tasks: they know their fix)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._cache: dict[str, Segments] = {}
        self._lock = threading.Lock()

    def __call__(self, task: SweTask, rng: random.Random) -> Segments:
        with self._lock:
            if task.key in self._cache:
                return self._cache[task.key]
        if task.edit is None:
            raise ConfigError(f"learner.sft_steps: task {task.key} has no known fix to demonstrate")
        path, old, new = task.edit
        text = (task.base_dir() / path).read_text(encoding="utf-8")
        observation = replace_once(text, old, new, path)[1]
        demo = [
            (instructions(self.fmt) + task.prompt, False),
            (hermes_call("str_replace", path=path, old=old, new=new), True),
            (observation, False),
            (hermes_call("submit"), True),
        ]
        with self._lock:
            self._cache[task.key] = demo
        return demo


def build_swe_spec(cfg: EnvConfig, held_out_only: bool = False) -> EnvSpec:
    try:
        cache = swe_cache_dir(cfg.swe.cache_dir)
    except UnsafeCacheDir as e:
        raise ConfigError(f"env.swe.cache_dir: {e}") from None
    if cfg.swe.source == "generated":
        from saorl.envs.swe.gen.generator import generate_pool

        if cfg.swe.task_envs == "venv":
            raise ConfigError(
                "env.swe.task_envs: 'venv' builds environments from a repository's metadata, "
                "which generated tasks do not have; use 'auto' or 'none' with env.swe.source "
                "= 'generated'"
            )

        num_train = 0 if held_out_only else cfg.swe.num_tasks  # held-out tasks come first
        held_out, train = generate_pool(cfg.seed, cfg.held_out_count(), num_train, cache)
    elif cfg.swe.source == "swebench":
        from saorl.envs.swe.swebench import load_swebench
        from saorl.envs.swe.validate import prepare_tasks

        if not cfg.swe.tasks:
            raise ConfigError(
                "env.swe.tasks: env.swe.source='swebench' needs the path of a SWE-bench .jsonl"
            )
        check_pytest()
        tasks = load_swebench(cfg.swe.tasks, cfg.swe.repos_root, cache)
        tasks = prepare_tasks(tasks, cfg.swe, cache)  # environments built, tasks validated
        n_eval = min(cfg.held_out_count(), len(tasks))
        if held_out_only and cfg.eval_size is None:
            n_eval = len(tasks)  # evaluating a task file: all of it unless eval_size is set
        held_out = tasks[len(tasks) - n_eval :]
        train = tasks[: len(tasks) - n_eval]
    else:
        raise ConfigError(f"env.swe.source: unknown source {cfg.swe.source!r}")
    runner = ToolRunner(cfg.swe.command_timeout_s, cfg.swe.max_output_chars)

    def make_env() -> SweEnv:
        return SweEnv(
            cfg.tool_format,
            runner,
            max_turns=cfg.max_turns,
            max_tool_calls=cfg.max_tool_calls,
            test_timeout_s=cfg.swe.test_timeout_s,
            grade_timeout_s=cfg.swe.grade_timeout_s,
            work_dir=cache / "work",
        )

    demo = GoldDemo(cfg.tool_format) if cfg.tool_format == "hermes" else None
    return EnvSpec(
        TaskPool(train, held_out),
        make_env,
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
        stop=tuple(stop_strings(cfg.tool_format, tag=CODE_TAG)),
        demo=demo if cfg.swe.source == "generated" else None,
    )

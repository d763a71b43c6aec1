"""Evaluation: run whole episodes on held-out problems and score them.

Used by `saorl train` (held-out accuracy during training) and `saorl eval` (a model or run on
the held-out problems of a config: `run_eval`, `write_results`). Episodes go through the same
agent loop as training rollouts (`RolloutWorker`), so a tool task is evaluated with its tool.
pass@1 is averaged over k samples per problem (avg@k); pass@k uses the unbiased estimator of
Chen et al. (2021) over the same k samples; maj@k grades the majority vote of the k samples
(`majority`). `saorl eval --prompt-template` opens each episode with a published prompt
(`saorl.evaluation.prompts`).
"""

from __future__ import annotations

import dataclasses
import math
import queue
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from torch import nn

from saorl.config import Config, ConfigError, EnvConfig, ModelConfig, load_config
from saorl.engines.factory import build_engine
from saorl.envs.base import EnvSpec, task_key
from saorl.evaluation.prompts import prompt_template as resolve_template
from saorl.rollout.failures import FailureLog
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker
from saorl.types import Trajectory


def run_episodes(
    model: nn.Module,
    tokenizer: Any,
    spec: EnvSpec,
    problems: list[Any],
    cfg: Config,
    *,
    greedy: bool = False,
    seed: int = 0,
    on_done: Any = None,
) -> list[Trajectory]:
    """One episode per entry of `problems` sampled from `model`; completion order.

    The engine is `rollout.engine`'s (`saorl.engines.factory.build_engine`; the HF engine
    samples from `model` itself, no copy), with `cfg`'s sampling settings (`rollout.*`:
    temperature, top_p, max_new_tokens, stop strings added to the environment's own) and
    context (`model.max_seq_len`), at least 256 episodes at a time."""
    roll = cfg.rollout
    max_seq_len = cfg.model.max_seq_len
    # No MoE routing is recorded: evaluation episodes are never trained on.
    cfg = cfg.model_copy(
        update={"algorithm": cfg.algorithm.model_copy(update={"routing_replay": False})}
    )
    engine = build_engine(
        cfg,
        model,
        tokenizer,
        seed=seed,
        share_model=True,
        max_concurrent=max(roll.max_concurrent, 256),
    )
    limits = AgentLimits(
        max_seq_len,
        roll.max_new_tokens,
        spec.max_turns,
        spec.max_tool_calls,
        (*spec.stop, *roll.stop),
        greedy=greedy,
        env_timeout_s=spec.step_timeout_s,
        score_truncated=roll.score_truncated,
        max_agent_processes=roll.max_agent_processes,
    )
    out: queue.Queue[Trajectory] = queue.Queue()
    worker = RolloutWorker(engine, FixedFeed(problems), tokenizer, out, spec.make_env, limits)
    results: list[Trajectory] = []
    try:
        while len(results) < len(problems):
            worker.fill()
            if engine.num_unfinished():
                worker.step()
            else:
                worker.step()  # collect environment results only
                time.sleep(0.001)
            while not out.empty():
                results.append(out.get_nowait())
                if on_done is not None:
                    on_done()
    finally:
        worker.stop_thread()
        engine.close()
    model.train()
    return results


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def vote(text: str) -> str | None:
    """What a sample votes for in maj@k: its final boxed answer as the math grader reads it
    (`final_answer`: several boxes of one answer are one vote), normalised (`normalize_answer`:
    `\\dfrac{1}{2}` and `\\frac12`-style spacing variants vote together; `1/2` and `0.5` do not);
    a text without a box votes with the whole text, normalised (envs that answer bare, such
    as 'arithmetic'); None (no vote) for an empty text."""
    from saorl.envs.math.grader import final_answer
    from saorl.envs.math.normalize import normalize_answer

    answer = final_answer(text)
    return normalize_answer(text.strip() if answer is None else answer) or None


def majority(votes: list[str | None], rewards: list[float]) -> tuple[str | None, float]:
    """The majority answer of one problem's samples and its grade (maj@k for the problem).

    The answer given by the most samples wins; a tie goes to the smallest answer in string
    order, a rule that depends neither on the order samples finished in nor on which answer is
    right. Its grade is the mean reward of the samples that gave it (they are graded on the same
    answer, so they agree). No vote at all: (None, 0.0).
    """
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None, 0.0
    winner = min(counts, key=lambda answer: (-counts[answer], answer))
    graded = [r for v, r in zip(votes, rewards, strict=True) if v == winner]
    return winner, sum(graded) / len(graded)


def summarize(trajs: list[Trajectory], prefix: str = "eval/") -> dict[str, float]:
    """Accuracy (mean reward), tool calls, turns and stop reasons of a set of episodes."""
    n = max(len(trajs), 1)
    out = {
        f"{prefix}accuracy": sum(t.reward for t in trajs) / n,
        f"{prefix}tool_calls_mean": sum(t.info.get("tool_calls", 0) for t in trajs) / n,
        f"{prefix}turns_mean": sum(t.info.get("turns", 0) for t in trajs) / n,
    }
    calls = sum(t.info.get("tool_calls", 0) for t in trajs)
    bad = sum(t.info.get("tool_calls_bad", 0) for t in trajs)
    out[f"{prefix}tool_calls_bad_frac"] = bad / max(calls, 1)
    reasons: dict[str, int] = defaultdict(int)
    for t in trajs:
        reasons[t.stop_reason] += 1
    for r, c in reasons.items():
        out[f"{prefix}stop/{r}"] = c / n
    return out


def per_problem(trajs: list[Trajectory], k: int) -> dict[str, dict[str, float]]:
    """pass@1 (avg over samples) and pass@k per problem key."""
    by_key: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_key[t.prompt_key].append(t.reward)
    return {
        key: {
            "samples": len(rs),
            "correct": sum(r > 0 for r in rs),
            "pass@1": sum(rs) / len(rs),
            f"pass@{k}": pass_at_k(len(rs), sum(r > 0 for r in rs), min(k, len(rs))),
        }
        for key, rs in by_key.items()
    }


def evaluate_policy(
    model: nn.Module, tokenizer: Any, spec: EnvSpec, cfg: Config, seed: int
) -> dict[str, float]:
    """`eval/accuracy` (avg@k at the rollout temperature) and `eval/accuracy_greedy`.

    `eval/accuracy` is the mean reward over `run.eval_samples` samples per held-out problem:
    the success rate of the policy RL optimises (the paper reports avg@k the same way).
    """
    held = list(spec.task.held_out)
    greedy = run_episodes(model, tokenizer, spec, held, cfg, greedy=True, seed=seed)
    sampled = run_episodes(model, tokenizer, spec, held * cfg.run.eval_samples, cfg, seed=seed)
    metrics = summarize(sampled)
    metrics["eval/accuracy_greedy"] = summarize(greedy)["eval/accuracy"]
    if not spec.max_tool_calls:  # a task without tools: the count is always 0
        metrics.pop("eval/tool_calls_mean")
        metrics.pop("eval/tool_calls_bad_frac")
    return metrics


def _load_model(model: str, cfg: ModelConfig) -> tuple[nn.Module, Any]:
    """A run directory (its `final/` policy), a checkpoint file of a run
    (`runs/NAME/checkpoints/step_X.pt`), a Hugging Face directory, or `builtin:tiny`, on
    `model.device`; `cfg` is the `[model]` section (dtype, device, built-in shape)."""
    from saorl.checkpoint.io import CheckpointError, load_state_file
    from saorl.models.loading import load_policy, resolve_device
    from saorl.models.lora import merged_checkpoint_policy

    path = Path(model)
    if path.is_file() and path.suffix == ".pt":
        run_config = path.parent.parent / "config.toml"
        if not run_config.is_file():
            raise ConfigError(
                f"{path}: a checkpoint must sit in RUN/checkpoints/ beside RUN/config.toml"
            )
        state = load_state_file(path)  # refuses a file that would run code
        if not isinstance(state.get("policy"), dict):
            hf = path.with_suffix(".hf")
            if hf.is_dir():  # an FSDP run keeps its weights in sharded files beside the .pt
                raise CheckpointError(f"{path}: its weights are sharded; evaluate {hf} instead")
            raise CheckpointError(f"{path}: holds no policy weights (not a saorl checkpoint)")
        # The weights' shape is the run's own, whatever config the evaluation uses.
        # trust_remote_code is this command's, never the run's saved one.
        run_model = load_config(run_config).model.model_copy(
            update={"trust_remote_code": cfg.trust_remote_code}
        )
        policy, tokenizer = load_policy(run_model)
        try:  # a LoRA run's checkpoint holds base and adapters: merged into the plain model
            policy.load_state_dict(merged_checkpoint_policy(state["policy"], run_model))
        except (RuntimeError, ValueError, TypeError) as e:
            why = f"{type(e).__name__}: {str(e)[:300]}"
            raise CheckpointError(f"{path}: its policy does not fit {run_config} ({why})") from None
    else:
        if (path / "final" / "config.json").exists():
            path = path / "final"
        elif (path / "config.toml").is_file() and not (path / "config.json").exists():
            raise ConfigError(
                f"{path}: the run has no final/ policy yet; evaluate one of its checkpoints: "
                f"saorl eval {path / 'checkpoints' / 'step_X.pt'}"
            )
        name = model if model.startswith("builtin:") else str(path)
        policy, tokenizer = load_policy(cfg.model_copy(update={"name_or_path": name}))
    return policy.to(resolve_device(cfg.device)), tokenizer


def run_eval(
    model: str,
    cfg: Config,
    *,
    k: int = 1,
    limit: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    concurrency: int = 8,
    progress: bool = True,
    prompt_template: str = "saorl",
    greedy: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Evaluate `model` on the held-out problems of the config `cfg`; returns (summary,
    per-problem rows). `greedy`: argmax decoding (temperature 0 over HTTP) instead of sampling.

    The problems are `build_env(cfg.env, held_out_only=True)`'s, the first `limit` of them;
    sampling is `cfg.rollout`'s (temperature, top_p, max_new_tokens, stop), the context
    `model.max_seq_len`, the seed `run.seed`. With `base_url`, `model` is the served model's
    name and episodes go over HTTP. `prompt_template`: a name in
    `saorl.evaluation.prompts.PROMPT_TEMPLATES` or a text with `{problem}` (ValueError otherwise).
    """
    import concurrent.futures

    import torch
    from rich.progress import Progress

    from saorl.envs.factory import build_env

    template = resolve_template(prompt_template)  # a bad one fails before any model loads
    env_cfg = cfg.env
    roll = cfg.rollout
    if env_cfg.name == "swe" and env_cfg.swe.source == "generated" and limit:
        # Generated tasks are made (and validated) on demand; the first N never depend on
        # how many follow, so only the ones evaluated are made.
        env_cfg = env_cfg.model_copy(update={"eval_size": min(limit, env_cfg.held_out_count())})
    spec = build_env(env_cfg, held_out_only=True)
    spec = dataclasses.replace(spec, make_env=template.wrap(spec.make_env))
    problems = list(spec.task.held_out)[: limit or None]
    if (
        template.user is not None
        and problems
        and not isinstance(getattr(problems[0], "prompt", None), str)
    ):
        raise ValueError(
            f"--prompt-template {prompt_template!r}: the tasks of env {env_cfg.name!r} have no "
            "text `prompt` to put in it (env 'math' has)"
        )
    jobs = [p for p in problems for _ in range(k)]
    stop = (*spec.stop, *roll.stop)
    with Progress(disable=not progress, transient=True) as bar:
        task_id = bar.add_task(f"eval {len(problems)} problems x {k}", total=len(jobs))

        def tick() -> None:
            bar.advance(task_id)

        if base_url:
            from saorl.evaluation.openai_client import chat_episode

            def one(p: Any) -> Any:
                ep = chat_episode(
                    base_url,
                    model,
                    spec.make_env(),
                    p,
                    max_turns=spec.max_turns,
                    max_tool_calls=spec.max_tool_calls,
                    stop=stop,
                    temperature=0.0 if greedy else roll.temperature,
                    top_p=roll.top_p,
                    max_tokens=roll.max_new_tokens,
                    api_key=api_key,
                )
                tick()
                return ep

            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                episodes = list(pool.map(one, jobs))
            texts = [e.text for e in episodes]
        else:
            torch.manual_seed(cfg.run.seed)  # fixes builtin:tiny's random weights
            policy, tokenizer = _load_model(model, cfg.model)
            policy.eval()
            episodes = run_episodes(
                policy, tokenizer, spec, jobs, cfg, greedy=greedy, seed=cfg.run.seed, on_done=tick
            )
            texts = [tokenizer.decode(t.completion_ids, skip_special_tokens=True) for t in episodes]
    stats = per_problem(episodes, k)  # type: ignore[arg-type]
    # A coding agent's answer is its repository changes, not a text to vote on.
    voting = env_cfg.name != "swe"
    rows = []
    for p in problems:
        samples = [
            {
                "reward": e.reward,
                "stop_reason": e.stop_reason,
                "tool_calls": e.info.get("tool_calls", 0),
                "text": txt,
                **({"answer": vote(txt)} if voting else {}),
                **({"error": e.info["error"]} if "error" in e.info else {}),
            }
            for e, txt in zip(episodes, texts, strict=True)
            if e.prompt_key == task_key(p)
        ]
        row = {
            "key": task_key(p),
            "prompt": getattr(p, "prompt", None),
            "reference": getattr(p, "answer", None),  # your own tasks need neither
            **stats.get(task_key(p), {}),
        }
        row[f"avg@{k}"] = row.get("pass@1", 0.0)
        if voting:
            answers = [s["answer"] for s in samples]
            row["majority_answer"], row[f"maj@{k}"] = majority(
                answers, [s["reward"] for s in samples]
            )
        rows.append({**row, "samples": samples})
    n = max(len(rows), 1)

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in rows) / n

    summary = {
        "model": model,
        "problems": len(rows),
        "k": k,
        "greedy": greedy,
        **template.describe(),
        f"avg@{k}": mean("pass@1"),
        "pass@1": mean("pass@1"),  # = avg@k: the name earlier versions wrote
        f"pass@{k}": mean(f"pass@{k}"),
        **({f"maj@{k}": mean(f"maj@{k}")} if voting else {}),
        **{key.removeprefix("eval/"): v for key, v in summarize(episodes).items()},  # type: ignore[arg-type]
    }
    # Endpoint replies that were no chat completion: failed episodes, counted by reason.
    bad = Counter(str(e.info.get("error")) for e in episodes if e.stop_reason == "bad_reply")
    if bad:
        summary["bad_replies"] = dict(sorted(bad.items()))
    # Failed episodes (env, reward function, agent): the first of each kind printed with its
    # traceback, all counted by type and place, as in training (`saorl.rollout.failures`).
    failures = FailureLog()
    for e in episodes:
        failures.record(e)  # type: ignore[arg-type]
    if failures.counts:
        summary["errors"] = failures.counts
    return summary, rows


def model_label(model: str) -> str:
    """A directory name for `model`: a local path's last two parts (`runs_exp1`,
    `exp1_final`), else the hub id or name (`Qwen_Qwen3-1.7B`, `builtin_tiny`)."""
    import re

    path = Path(model)
    text = "_".join(path.resolve().parts[-2:]) if path.exists() else model
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.") or "model"


def check_paths(model: str, out: str | None, served: bool) -> None:
    """Before `saorl eval` runs anything: refuse an `--out` that cannot take the results, a
    checkpoint MODEL that no longer exists (pruned by the run that wrote it), and a damaged
    checkpoint Hugging Face copy (`saorl.checkpoint.digest`)."""
    from saorl.checkpoint.digest import check

    if out is not None:
        path = Path(out)
        if path.is_dir():
            example = path / "results.jsonl"
            raise ConfigError(
                f"--out {out} is a directory; give the JSONL file to write ({example})"
            )
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise ConfigError(f"--out {out}: {above} is a file, not a directory")
    model_path = Path(model)
    checkpoint = model_path.suffix in (".pt", ".hf") or model_path.parent.name == "checkpoints"
    if served or not checkpoint:
        return
    if not model_path.exists():
        now = sorted(p.name for p in model_path.parent.glob("step_*.pt"))
        there = f"; the checkpoints there now: {', '.join(now[-3:])}" if now else ""
        raise ConfigError(
            f"{model} no longer exists (a checkpoint deleted since, e.g. by its run keeping only "
            f"run.keep_last_checkpoints){there}"
        )
    if model_path.suffix == ".hf" and model_path.is_dir():
        check(model_path)


def task_name(env: Any) -> str:
    """The name of an evaluation's task (`env`: the `[env]` section): the dataset file's stem
    (env 'math'), the task file's stem or `swe_generated` (env 'swe'), the attribute's name of
    your own env ('module:attr', 'file.py:attr'), else the env's name; an agent program's is
    that of its tasks (`env.agent.tasks`)."""
    if env.name == "agent":
        return task_name(env.model_copy(update={"name": env.agent.tasks}))
    if env.name == "math":
        return Path(env.eval_dataset or env.dataset).stem
    if env.name == "swe":
        return Path(env.swe.tasks).stem if env.swe.source == "swebench" else "swe_generated"
    return env.name.rpartition(":")[2]


def default_results_path(model: str, name: str, run_dir: Path | None = None) -> Path:
    """Where `saorl eval` writes without `--out`: RUN/evals/WHICH/NAME.jsonl when `model`
    belongs to the run `run_dir` (WHICH: `final`, or the checkpoint's name `step_X`), else
    evals/MODEL/NAME.jsonl in the current folder (MODEL: `model_label`), so evaluations of two
    models never overwrite each other."""
    if run_dir is not None:
        path = Path(model)
        which = path.stem if path.parent.name == "checkpoints" else "final"
        return run_dir / "evals" / which / f"{name}.jsonl"
    return Path("evals") / model_label(model) / f"{name}.jsonl"


def write_results(
    model: str,
    env: EnvConfig,
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    out: str | None,
    run_dir: Path | None = None,
) -> Path:
    """Write `saorl eval`'s results on `env` (the `[env]` evaluated) and print its table;
    returns the per-problem JSONL path: `out`, else `default_results_path` (`run_dir`: the run
    `model` belongs to, if any); the summary goes beside it (NAME.summary.json)."""
    import json

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from saorl.monitoring.terminal import printable

    name = task_name(env)
    if env.name == "swe":  # SWE-bench's name for the success rate
        summary = {"resolved_rate": summary["accuracy"], **summary}
    path = Path(out) if out else default_results_path(model, name, run_dir)
    from saorl.security.safe_io import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    write_atomic(path.with_suffix(".summary.json"), json.dumps(summary, indent=2))
    agent = f" (agent {env.agent.function or env.agent.command})" if env.name == "agent" else ""
    # Names and values come from data and endpoints: control characters escaped, and Text,
    # not markup, so `[link=...]` in a name stays text. The header is a line of its own: as
    # the table's title it was wrapped and cut to the table's width ("... on agent ").
    print(printable(f"saorl eval: {model} on {name}{agent}"))
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key != "prompt_template_text":  # in the summary file; too long for the table
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            table.add_row(Text(printable(key)), Text(printable(shown)))
    Console().print(table)
    return path

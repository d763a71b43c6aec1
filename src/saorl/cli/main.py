"""The `saorl` command line.

    saorl train [--config FILE.toml] [--print-config] [--help-config] [--resume RUN_DIR]
                [--trust-remote-code] [section.field=value ...]
    saorl eval MODEL [--config FILE.toml] [--print-config] [--k K] [--limit N] [--out FILE]
               [--base-url URL] [--api-key KEY] [--prompt-template T] [--trust-remote-code]
               [section.field=value ...]
    saorl report RUN_DIR [RUN_DIR ...] [--out PATH]
    saorl model fetch NAME [--force] | import-gguf FILE.gguf --out DIR | list
    saorl compare [--config FILE.toml] [--arms a,b,c] [--out DIR] [--push-every K] [--steps N]
                  [--seeds N] [--jobs J] [section.field=value ...]
                  [section.field=value ...]

Nothing heavy is imported at module level: `saorl --help`, `saorl train --help`,
`--print-config` and `--help-config` never import torch; the training loop is imported only
when a run starts; `saorl report` imports matplotlib only when it draws. Exit codes: 0 success,
1 `saorl compare` finished but some arm failed (the report still lists it), 2 bad command line,
config, input file or run directory (message on stderr, no traceback; also a run folder another
process writes, a full disk), 3 training stopped because too many steps in a row had a NaN/Inf
gradient, 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (`saorl.run.signals`: after a checkpoint).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saorl import api
from saorl.cli.parser import build_parser
from saorl.config import (
    Config,
    ConfigError,
    EnvConfig,
    RunConfig,
    config_to_toml,
    describe_config,
)
from saorl.envs.swe import commands as swe_commands
from saorl.monitoring.terminal import escaped_output, printable
from saorl.security.trust import FLAG, load_trusted


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `saorl` console script and of `python -m saorl`."""
    parser = build_parser()
    # parse_known_args so that overrides may follow options: `train --print-config a.b=1`.
    args, extra = parser.parse_known_args(None if argv is None else list(argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    # Data (task ids, problem text, error messages quoting it) reaches stderr and the plain
    # text of the swe commands escaped: never a terminal control sequence.
    with escaped_output(stdout=args.command in swe_commands.COMMANDS):
        return _run(parser, args, extra)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    if args.command in swe_commands.COMMANDS:
        return swe_commands.run(args, extra)
    if args.command == "model":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _model(args)
    if args.command == "report":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _report(args)
    flags = [a for a in extra if a.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}{_flag_hint(flags)}")
    args.overrides = [*args.overrides, *extra]
    if args.command == "eval":
        return _eval(args)
    if args.command == "value-pretrain":
        return _value_pretrain(args)
    return _compare(args) if args.command == "compare" else _train(args)


def _flag_hint(flags: list[str]) -> str:
    """Point a flag named like a config field (`--max-new-tokens`) at its override."""
    fields = {s: getattr(f.annotation, "model_fields", {}) for s, f in Config.model_fields.items()}
    keys = []
    for flag in flags:
        name = flag.lstrip("-").partition("=")[0].replace("-", "_")
        keys += [f"{name}.name"] if "name" in fields.get(name, {}) else []  # --env: env.name
        keys += [f"{s}.{name}" for s, names in fields.items() if name in names]
    hint = " or ".join(f"{k}=..." for k in keys)
    return f" (config fields are overrides: {hint})" if keys else ""


def _value_pretrain(args: argparse.Namespace) -> int:
    import json

    try:
        cfg = load_trusted(args.config, None, args.overrides, args.trust_remote_code)
        from saorl.learner.value_pretrain import value_pretrain  # imports torch

        result = value_pretrain(cfg, Path(args.out), rollouts=args.rollouts, epochs=args.epochs)
    except ConfigError as exc:
        return _config_failure(exc, "value-pretrain")
    print(json.dumps(result, indent=2))
    return 0


def _train(args: argparse.Namespace) -> int:
    if args.help_config:
        print(describe_config())
        return 0
    try:
        overrides = [*args.overrides, *_ray_overrides(args)]
        cfg = api.train_config(
            args.config,
            overrides,
            resume=args.resume,
            flag="--resume",
            trust_remote_code=args.trust_remote_code,
            trust_flag=FLAG,
        )
    except ConfigError as exc:
        return _config_failure(exc)
    if args.print_config:
        sys.stdout.write(config_to_toml(cfg))
        return 0

    from saorl.checkpoint.io import list_checkpoints
    from saorl.learner.learner import NonFiniteError
    from saorl.run import lock as run_lock
    from saorl.run.signals import SignalExit, exit_code, stopped_message

    if args.resume is not None and not list_checkpoints(Path(args.resume)):
        # Refused before anything runs: a folder that is no run is left exactly as it was.
        where = Path(args.resume) / "checkpoints"
        why = "nothing to resume (start a new run without --resume)"
        return _config_failure(ConfigError(f"--resume: no checkpoint in {where}: {why}"))
    output_dir = Path(cfg.run.output_dir)
    before = run_lock.entries(output_dir)
    try:
        summary = api.train(cfg, resume=args.resume)
    except ConfigError as exc:
        if args.resume is None and not getattr(exc, "keep_run", False):
            run_lock.remove_failed_run(cfg, output_dir, before)
        return _config_failure(exc)
    except NonFiniteError as exc:
        print(f"saorl train: stopped: {exc}", file=sys.stderr)
        return 3
    except SignalExit as exc:
        print(f"{exc}\n{run_lock.resume_hint(cfg.ray.address)}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("saorl train: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # a Ray actor died: what, and where to go on from
        # (or a rollout actor died past run.max_worker_restarts: the collector's error)
        if "ActorFailure" not in (type(exc).__name__, type(exc.__cause__).__name__):
            raise
        hint = run_lock.resume_hint(cfg.ray.address)
        print(f"saorl train: error: {exc}\n{hint}", file=sys.stderr)
        return 1
    if exit_code(summary or {}):
        print(stopped_message(summary), file=sys.stderr)
        return exit_code(summary)
    _print_summary(cfg.run, summary or {})
    return 0


def _ray_overrides(args: argparse.Namespace) -> list[str]:
    """`--ray` / `--ray-address` as config overrides (they win over --config)."""
    if args.ray_address:
        return ["ray.enabled=true", f"ray.address={args.ray_address}"]
    return ["ray.enabled=true"] if args.ray else []


def _model(args: argparse.Namespace) -> int:
    """`saorl model fetch NAME`, `saorl model import-gguf FILE --out DIR`, `saorl model list`."""
    from saorl.models import fetch

    if args.model_command == "list":
        for known in fetch.KNOWN.values():
            folder = fetch.model_folder(known.name)
            state = "fetched" if fetch.is_fetched(folder) else "not fetched"
            print(f"{known.name}  {state}  {folder}\n    {known.about}; {known.license}")
        return 0
    try:
        if args.model_command == "fetch":
            folder = fetch.fetch(args.name, force=args.force)
        else:
            folder = fetch.import_gguf(Path(args.file), Path(args.out))
    except ConfigError as exc:
        print(f"saorl model: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


def _report(args: argparse.Namespace) -> int:
    from saorl.monitoring.report import (  # matplotlib: when drawing
        REPORT_FILE,
        report_run,
        report_runs,
    )

    dirs = [Path(d) for d in args.run_dir]
    out = None if args.out is None else Path(args.out)
    try:
        if len(dirs) > 1:
            png = report_runs(dirs, out)
        else:
            if out is not None and out.suffix.lower() != ".png":
                out = out / REPORT_FILE
            png = report_run(dirs[0], out)
    except (OSError, ValueError) as exc:  # a missing or unreadable run, an unwritable --out
        print(f"saorl report: error: {exc}", file=sys.stderr)
        return 2
    print(png)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from saorl.experiments.compare import failed_runs, run_compare, split_arms

    for flag, value in (
        ("--push-every", args.push_every),
        ("--steps", args.steps),
        ("--seeds", args.seeds),
        ("--jobs", args.jobs),
    ):
        if value is not None and value < 1:
            print(f"saorl compare: error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(
            f"saorl compare: error: --out {args.out} is a file; give a directory", file=sys.stderr
        )
        return 2
    arms = split_arms(args.arms)
    if not arms:  # `--arms ""` must not silently mean every default arm
        print(f"saorl compare: error: --arms {args.arms!r} names no arm", file=sys.stderr)
        return 2
    try:
        index = run_compare(
            None if args.config is None else Path(args.config),
            args.overrides,
            arms,
            Path(args.out),
            push_every=args.push_every,
            steps=args.steps,
            seeds=args.seeds,
            jobs=args.jobs,
        )
    except ConfigError as exc:
        print(f"saorl compare: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saorl compare: interrupted (rerun the same command to continue)", file=sys.stderr)
        return 130
    print(f"{(index.parent / 'arms.txt').read_text()}{index}")  # the arms table, the report
    failed = failed_runs(index.parent)
    if failed:
        print(f"saorl compare: failed runs: {', '.join(failed)} (see {index})", file=sys.stderr)
        return 1
    return 0


def _eval(args: argparse.Namespace) -> int:
    for flag, value in (("--k", args.k), ("--limit", args.limit)):
        if value is not None and value < 1:
            print(f"saorl eval: error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    try:
        cfg = api.eval_config(
            args.model,
            args.config,
            args.overrides,
            trust_remote_code=args.trust_remote_code,
            trust_flag=FLAG,
        )
    except ConfigError as exc:
        return _config_failure(exc, "eval")
    if args.print_config:
        sys.stdout.write(config_to_toml(cfg))
        return 0
    started = time.monotonic()
    try:
        summary, path = api.run_evaluation(
            args.model,
            cfg,
            k=args.k,
            limit=args.limit,
            base_url=args.base_url,
            api_key=args.api_key,
            out=args.out,
            progress=sys.stderr.isatty(),
            greedy=args.greedy,
            prompt_template=args.prompt_template,
        )
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"saorl eval: error: {exc}", file=sys.stderr)
        return 2
    print(printable(f"per-problem results: {path}"))
    print(printable(_eval_headline(args.model, cfg.env, summary, time.monotonic() - started)))
    return 0


def _eval_headline(model: str, env: EnvConfig, summary: dict[str, Any], seconds: float) -> str:
    """The last line of `saorl eval` on `env`: the task, the score, how many problems, how
    long."""
    from saorl.evaluation.held_out import task_name

    k = summary.get("k", 1)
    score = f"avg@{k} {summary.get(f'avg@{k}', 0.0):.3f}"
    if k > 1:
        score += f", pass@{k} {summary.get(f'pass@{k}', 0.0):.3f}"
    failed = sum((summary.get("errors") or {}).values())
    fails = f", {failed} episodes failed (above)" if failed else ""
    return (
        f"saorl eval: {model} on {task_name(env)}: {score} over "
        f"{summary.get('problems', 0)} problems{fails}; {_duration(seconds)}"
    )


def _config_failure(exc: ConfigError, command: str = "train") -> int:
    print(f"saorl {command}: error: {exc}", file=sys.stderr)
    return 2


def _print_summary(run: RunConfig, summary: dict[str, Any]) -> None:
    run_dir = summary.get("run_dir") or str(Path(run.output_dir) / run.name)
    for key, value in sorted(summary.items()):
        if key == "run_dir" or not isinstance(value, int | float | str):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(printable(f"{key}: {shown}"))
    if c := summary.get("collapse"):  # the whole run's verdict (eval_drop too)
        print(printable(f"collapse: {c['signal']} at step {c['detected_step']}: {c['reason']}"))
    for message, count in (summary.get("errors") or {}).items():
        print(printable(f"failed episodes: {count} x {message}"))
    print(printable(f"run directory: {run_dir}"))
    print(printable(_train_headline(summary)))


def _train_headline(summary: dict[str, Any]) -> str:
    """The last line of `saorl train`: held-out accuracy before -> after, steps, wall time."""

    def acc(key: str) -> str:
        value = summary.get(key)
        return "-" if value is None else f"{value:.3f}"

    before = "initial_eval_accuracy"
    after = "final_eval_accuracy"
    greedy = f"{acc(before + '_greedy')} -> {acc(after + '_greedy')}"
    warmup = summary.get("warmup_seconds")
    steps = summary.get("wall_seconds") or 0.0
    took = _duration(steps) + " of RL steps"
    if warmup is not None:
        took = f"{_duration(warmup + steps)} ({_duration(warmup)} warm-up, {took})"
    return (
        f"saorl train: held-out accuracy {acc(before)} -> {acc(after)} (greedy {greedy}) "
        f"in {summary.get('steps', 0)} steps; {took}"
    )


def _duration(seconds: float) -> str:
    """`7.2 s`, `2 min 59 s`, `1 h 05 min`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s // 60 % 60:02d} min"

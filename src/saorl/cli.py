"""The `saorl` command line.

    saorl train [--config FILE.toml] [--print-config] [--help-config] [--resume RUN_DIR]
                [--trust-remote-code] [section.field=value ...]
    saorl eval MODEL [--config FILE.toml] [--print-config] [--k K] [--limit N] [--out FILE]
               [--base-url URL] [--api-key KEY] [--prompt-template T] [--trust-remote-code]
               [section.field=value ...]
    saorl report RUN_DIR [RUN_DIR ...] [--out PATH]
    saorl compare [--config FILE.toml] [--arms a,b,c] [--out DIR] [--push-every K] [--steps N]
                  [--seeds N] [--jobs J] [section.field=value ...]
                  [section.field=value ...]

Nothing heavy is imported at module level: `saorl --help`, `saorl train --help`,
`--print-config` and `--help-config` never import torch; the training loop is imported only
when a run starts; `saorl report` imports matplotlib only when it draws. Exit codes: 0 success,
1 `saorl compare` finished but some arm failed (the report still lists it), 2 bad command line,
config, input file or run directory (message on stderr, no traceback; also a run folder another
process writes, a full disk), 3 training stopped because too many steps in a row had a NaN/Inf
gradient, 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (`saorl.signals`: after a checkpoint).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saorl import __version__, api
from saorl.config import Config, ConfigError, config_to_toml, describe_config
from saorl.envs.swe import commands as swe_commands
from saorl.terminal import escaped_output, printable
from saorl.trust import FLAG, load_trusted

_TRAIN_EPILOG = """\
overrides are section.field=value, applied after --config, later ones winning; a value is
parsed as TOML when it parses (1e-4, true, ["a"], "x") and is a plain string otherwise.

examples:
  saorl train                                   # built-in CPU demo
  saorl train --config examples/sao.toml learner.lr=1e-5 run.name=exp1
  saorl train algorithm.eps_low=0.8 algorithm.eps_high=3.0 --print-config
  saorl train --resume runs/exp1                # continue; reads runs/exp1/config.toml
  saorl train --ray                             # learner and rollout workers as Ray actors
  saorl train --ray-address auto --config examples/cluster_qwen3_30b_a3b.toml   # a cluster
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommands are added here."""
    parser = argparse.ArgumentParser(
        prog="saorl",
        description="Asynchronous RL post-training of language models with SAO "
        "(Single-rollout Asynchronous Optimization).",
    )
    parser.add_argument("--version", action="version", version=f"saorl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train a policy (defaults: the built-in CPU demo)",
        description="Train a policy with SAO. With no arguments, runs the built-in CPU demo.",
        epilog=_TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    train.add_argument("--config", metavar="FILE.toml", help="TOML file, one table per section")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config as TOML and exit"
    )
    train.add_argument(
        "--help-config", action="store_true", help="list every config field and exit"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (its config.toml is the base config unless --config)",
    )
    train.add_argument(
        "--ray",
        action="store_true",
        help="run the learner and the rollout workers as Ray actors on a local Ray "
        "(ray.enabled=true; needs the 'ray' extra)",
    )
    train.add_argument(
        "--ray-address",
        metavar="auto|HOST:PORT",
        help="join a running Ray cluster (ray start --head) instead; implies --ray",
    )
    _add_trust_flag(train)
    train.add_argument(
        "overrides", nargs="*", metavar="section.field=value", help="config overrides"
    )
    report = commands.add_parser(
        "report",
        help="plot a run's metrics.jsonl into RUN_DIR/report.png, or compare several runs",
        description="Plot the curves of a run (reward, held-out accuracy, losses, DIS masking, "
        "staleness, throughput) from RUN_DIR/metrics.jsonl into RUN_DIR/report.png. With "
        "several run directories, draw them on one comparison PNG (one colour per run, "
        "collapse steps marked) in the first one's parent directory, or --out.",
        allow_abbrev=False,
    )
    report.add_argument("run_dir", nargs="+", metavar="RUN_DIR", help="a run directory (runs/NAME)")
    report.add_argument(
        "--out",
        metavar="PATH",
        help="the PNG to write (a path ending in .png, else a directory for compare.png); "
        "with one RUN_DIR the default stays RUN_DIR/report.png",
    )
    _add_compare_parser(commands)
    _add_eval_parser(commands)
    swe_commands.add_parsers(commands)  # swe-mine, swe-validate
    vp = commands.add_parser(
        "value-pretrain",
        help="fit the critic on rollouts of the initial policy; save it for critic.init_from",
        description="Roll out the initial policy (after the same warm-up as saorl train) on "
        "training prompts, fit the critic on the outcomes, report held-out explained variance "
        "and save the critic. Then: saorl train critic.init_from=OUT.",
        allow_abbrev=False,
    )
    vp.add_argument("--config", metavar="FILE.toml")
    vp.add_argument("--rollouts", type=int, default=1024, help="rollouts of the initial policy")
    vp.add_argument("--epochs", type=int, default=3, help="passes over the training rollouts")
    vp.add_argument("--out", default="runs/value_pretrain/critic.pt")
    _add_trust_flag(vp)
    vp.add_argument("overrides", nargs="*", metavar="section.field=value")
    return parser


def _add_trust_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG,
        action="store_true",
        help="run code a model directory names (auto_map) and code a run folder's saved config "
        "names (env.name, env.reward_fns, env.tools, env.swe_pip_args): only for folders you "
        "trust",
    )


_COMPARE_EPILOG = """
examples:
  saorl compare --steps 300                           # the five algorithms, 300 steps each
  saorl compare --arms sao,sao_k1,sao_no_freeze --out runs/ablate
  saorl compare --arms sao,grpo --push-every 4        # weights reach engines every 4 steps
  saorl compare --arms sao,lr_hi:learner.lr=3e-4 run.seed=1
  saorl compare --seeds 3 --jobs 2                    # 3 seeds per arm, 2 runs at a time
"""


def _add_compare_parser(commands: Any) -> None:
    from saorl.compare import ARMS, DEFAULT_ARMS  # no torch: the loop is imported per run

    cmp = commands.add_parser(
        "compare",
        help="train several algorithms / ablations under identical settings and report",
        description="Train one run per arm into OUT/ARM, one after another, with the same "
        "config, seed, task, step budget and asynchrony; then write OUT/compare.png, "
        "OUT/summary.csv and OUT/index.html. Rerunning skips finished arms and resumes "
        "interrupted ones from their checkpoints.",
        epilog=textwrap.fill(
            f"arms: built-in {', '.join(ARMS)}; a custom arm is "
            "NAME:section.field=value,section.field=value (a built-in NAME adds its own "
            "overrides first). Every arm gets the same base config, overrides, seed and budget.",
            width=88,
        )
        + "\n"
        + _COMPARE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    cmp.add_argument("--config", metavar="FILE.toml", help="base TOML config of every arm")
    cmp.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        help=f"comma-separated arms (default {','.join(DEFAULT_ARMS)})",
    )
    cmp.add_argument("--out", default="runs/compare", help="output directory (runs/compare)")
    cmp.add_argument(
        "--push-every",
        type=int,
        metavar="K",
        help="push weights to the engines every K policy versions (learner.push_every), "
        "forcing staler rollouts",
    )
    cmp.add_argument("--steps", type=int, metavar="N", help="run.total_steps of every arm")
    cmp.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="runs per arm, seeds run.seed .. run.seed+N-1, into OUT/ARM/seedS; the report "
        "gives mean, spread and collapse fraction per arm (default 1: OUT/ARM)",
    )
    cmp.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="J",
        help="runs at a time, each in its own process (default 1; more only with 2 cores per "
        "run to spare, or runs slow each other down and measure less asynchrony)",
    )
    cmp.add_argument(
        "overrides", nargs="*", metavar="section.field=value", help="overrides for every arm"
    )


_EVAL_EPILOG = """\
the task, its held-out problems, sampling, lengths and device come from a config, as for
saorl train: --config FILE.toml, else the config.toml of the run MODEL belongs to (a run
directory, its final/ or one of its checkpoints), else the defaults (the built-in arithmetic
task); overrides apply on top.

examples:
  saorl eval runs/exp1 --k 4                # the run's task and held-out set: avg@4, pass@4, maj@4
  saorl eval runs/exp1/checkpoints/step_00000200.pt env.eval_size=64
  saorl eval runs/exp1/checkpoints/step_00000200.hf   # a checkpoint's Hugging Face copy
  saorl eval /models/Qwen3-4B --config examples/eval_math.toml --k 8     # all of aime25
  saorl eval /models/Qwen3-4B --config examples/eval_math.toml env.eval_dataset=data/test.jsonl
  saorl eval Qwen3-4B --base-url http://localhost:8000/v1 --config examples/eval_math.toml \\
      --prompt-template boxed env.use_tool=false     # the prompt published results use
"""


def _add_eval_parser(commands: Any) -> None:
    ev = commands.add_parser(
        "eval",
        help="evaluate a model or run on held-out problems: avg@k (pass@1), pass@k, maj@k",
        description=textwrap.fill(
            "Evaluate MODEL (a run directory, one of its checkpoints, a Hugging Face model "
            "directory, 'builtin:tiny', or with --base-url a served model's name) on the "
            "held-out problems of the config's env: avg@k (pass@1), pass@k and maj@k. "
            "Writes one JSON line per problem to --out and a summary to OUT.summary.json.",
            width=88,
        ),
        epilog=_EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    ev.add_argument("model", metavar="MODEL")
    ev.add_argument(
        "--config",
        metavar="FILE.toml",
        help="base config instead of the run's config.toml (or the defaults)",
    )
    ev.add_argument(
        "--print-config", action="store_true", help="print the resolved config as TOML and exit"
    )
    ev.add_argument("--k", type=int, default=1, help="samples per problem (default 1)")
    ev.add_argument("--limit", type=int, metavar="N", help="the first N held-out problems only")
    ev.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    ev.add_argument("--out", metavar="FILE", help="per-problem JSONL (evals/MODEL/NAME.jsonl)")
    ev.add_argument("--base-url", metavar="URL", help="OpenAI-compatible endpoint, e.g. .../v1")
    ev.add_argument("--api-key", metavar="KEY", help="the endpoint's API key")
    ev.add_argument(
        "--prompt-template",
        default="saorl",
        metavar="NAME|TEXT",
        help="saorl (the env's own), boxed, qwen_math, or a text with {problem}",
    )
    _add_trust_flag(ev)
    ev.add_argument("overrides", nargs="*", metavar="section.field=value", help="config overrides")


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
        from saorl.value_pretrain import value_pretrain  # imports torch

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

    from saorl import run_lock
    from saorl.checkpoint import list_checkpoints
    from saorl.learner import NonFiniteError
    from saorl.signals import SignalExit, exit_code, stopped_message

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
        print(f"{exc}\n{run_lock.resume_hint()}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("saorl train: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # a Ray actor died: what, and where to go on from
        if type(exc).__name__ != "ActorFailure":
            raise
        print(f"saorl train: error: {exc}\n{run_lock.resume_hint()}", file=sys.stderr)
        return 1
    if exit_code(summary or {}):
        print(stopped_message(summary), file=sys.stderr)
        return exit_code(summary)
    _print_summary(cfg, summary or {})
    return 0


def _ray_overrides(args: argparse.Namespace) -> list[str]:
    """`--ray` / `--ray-address` as config overrides (they win over --config)."""
    if args.ray_address:
        return ["ray.enabled=true", f"ray.address={args.ray_address}"]
    return ["ray.enabled=true"] if args.ray else []


def _report(args: argparse.Namespace) -> int:
    from saorl.report import REPORT_FILE, report_run, report_runs  # matplotlib: when drawing

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
    from saorl.compare import failed_runs, run_compare, split_arms

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
    try:
        from saorl.evaluation import check_paths, run_eval, write_results  # imports torch

        check_paths(args.model, args.out, served=args.base_url is not None)
        summary, rows = run_eval(
            args.model,
            cfg,
            k=args.k,
            limit=args.limit,
            base_url=args.base_url,
            api_key=args.api_key,
            progress=sys.stderr.isatty(),
            greedy=args.greedy,
            prompt_template=args.prompt_template,
        )
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"saorl eval: error: {exc}", file=sys.stderr)
        return 2
    path = write_results(args.model, cfg, summary, rows, args.out)
    print(printable(f"per-problem results: {path}"))
    return 0


def _config_failure(exc: ConfigError, command: str = "train") -> int:
    print(f"saorl {command}: error: {exc}", file=sys.stderr)
    return 2


def _print_summary(cfg: Config, summary: dict[str, Any]) -> None:
    run_dir = summary.get("run_dir") or str(Path(cfg.run.output_dir) / cfg.run.name)
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

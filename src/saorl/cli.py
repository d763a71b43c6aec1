"""The `saorl` command line.

    saorl train [--config FILE.toml] [--print-config] [--help-config] [--resume RUN_DIR]
                [section.field=value ...]
    saorl report RUN_DIR

Nothing heavy is imported at module level: `saorl --help`, `saorl train --help`,
`--print-config` and `--help-config` never import torch; the training loop is imported only
when a run starts; `saorl report` imports matplotlib only when it draws. Exit codes: 0 success,
2 bad command line, config or run directory (message on stderr, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saorl import __version__
from saorl.config import Config, ConfigError, config_to_toml, describe_config, load_config

_TRAIN_EPILOG = """\
overrides are section.field=value, applied after --config, later ones winning; a value is
parsed as TOML when it parses (1e-4, true, ["a"], "x") and is a plain string otherwise.

examples:
  saorl train                                   # built-in CPU demo
  saorl train --config examples/sao.toml learner.lr=1e-5 run.name=exp1
  saorl train algorithm.eps_low=0.8 algorithm.eps_high=3.0 --print-config
  saorl train --resume runs/exp1                # continue; reads runs/exp1/config.toml
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
        "overrides", nargs="*", metavar="section.field=value", help="config overrides"
    )
    report = commands.add_parser(
        "report",
        help="plot a run's metrics.jsonl into RUN_DIR/report.png",
        description="Plot the curves of a run (reward, held-out accuracy, losses, DIS masking, "
        "staleness, throughput) from RUN_DIR/metrics.jsonl into RUN_DIR/report.png.",
        allow_abbrev=False,
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/NAME)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `saorl` console script and of `python -m saorl`."""
    parser = build_parser()
    # parse_known_args so that overrides may follow options: `train --print-config a.b=1`.
    args, extra = parser.parse_known_args(None if argv is None else list(argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "report":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _report(args)
    flags = [a for a in extra if a.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    args.overrides = [*args.overrides, *extra]
    return _train(args)


def _train(args: argparse.Namespace) -> int:
    if args.help_config:
        print(describe_config())
        return 0
    try:
        cfg = _resolve_config(args.config, args.resume, args.overrides)
    except ConfigError as exc:
        return _config_failure(exc)
    if args.print_config:
        sys.stdout.write(config_to_toml(cfg))
        return 0

    from saorl.loop import train_from_config  # imports torch: only when a run starts

    try:
        summary = train_from_config(cfg, resume=args.resume)
    except ConfigError as exc:
        return _config_failure(exc)
    except KeyboardInterrupt:
        print("saorl train: interrupted", file=sys.stderr)
        return 130
    _print_summary(cfg, summary or {})
    return 0


def _report(args: argparse.Namespace) -> int:
    from saorl.report import report_run  # imports matplotlib only when it draws

    try:
        png = report_run(Path(args.run_dir))
    except (FileNotFoundError, ValueError) as exc:
        print(f"saorl report: error: {exc}", file=sys.stderr)
        return 2
    print(png)
    return 0


def _resolve_config(
    config_path: str | None, resume: str | None, overrides: Sequence[str]
) -> Config:
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise ConfigError(f"--resume: run directory not found: {run_dir}")
        saved = run_dir / "config.toml"
        if config_path is None and saved.is_file():
            config_path = str(saved)
    return load_config(config_path, overrides)


def _config_failure(exc: ConfigError) -> int:
    print(f"saorl train: error: {exc}", file=sys.stderr)
    return 2


def _print_summary(cfg: Config, summary: dict[str, Any]) -> None:
    run_dir = summary.get("run_dir") or str(Path(cfg.run.output_dir) / cfg.run.name)
    for key, value in sorted(summary.items()):
        if key == "run_dir" or not isinstance(value, int | float | str):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{key}: {shown}")
    print(f"run directory: {run_dir}")

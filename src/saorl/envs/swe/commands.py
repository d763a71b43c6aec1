"""`saorl swe-mine` and `saorl swe-validate`: tasks mined from a repository's history, and the
check of a SWE-bench-format task file (hooked into `saorl.cli.main` by `add_parsers` and `run`).

    saorl swe-mine CHECKOUT --out tasks.jsonl [--repo NAME] [--rev REV] [--since DATE]
                   [--max-commits N] [--jobs N] [--config FILE.toml] [env.field=value ...]
    saorl swe-validate tasks.jsonl --repos-root DIR [--jobs N] [--fresh] [--config FILE.toml]
                   [env.field=value ...]

Both read the `[env]` settings of a config (`--config`, overrides): `env.swe.cache_dir` (where
environments, snapshots and verdicts are cached), `env.swe.pip_args`, `env.swe.task_envs`,
`env.swe.test_timeout_s`, `env.swe.grade_timeout_s`. Exit codes: 0 success (swe-validate: every
task valid), 1 swe-validate found a task that is not valid, 2 bad command line, config or input
file, 130 interrupted. Nothing heavy is imported here: `saorl --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, load_config
from saorl.config.env_families import SweConfig

COMMANDS = ("swe-mine", "swe-validate")

_MINE_EPILOG = """\
examples:
  saorl swe-mine ~/src/attrs --out tasks.jsonl                 # every commit of HEAD
  saorl swe-mine ~/src/attrs --out tasks.jsonl --max-commits 200 --jobs 4
  saorl swe-mine ~/src/attrs --out tasks.jsonl --rev v22.1.0..main
  saorl swe-mine repo --out t.jsonl env.swe.pip_args="--no-index --find-links wheels"
then train on them (the checkout's parent directory holds the repositories):
  saorl train --config examples/swe_real.toml env.swe.tasks=tasks.jsonl env.swe.repos_root=~/src
"""


def add_parsers(commands: Any) -> None:
    """Add `swe-mine` and `swe-validate` to the `saorl` subcommands."""
    mine = commands.add_parser(
        "swe-mine",
        help="turn a local git repository's history into validated SWE-bench-format tasks",
        description="Find the commits of CHECKOUT that change both code and tests, compute "
        "FAIL_TO_PASS and PASS_TO_PASS by running the tests before and after the code change "
        "in the task's own environment (in the sandbox), validate each task (the gold patch "
        "resolves it, an empty patch does not) and append the valid ones to --out as "
        "SWE-bench JSON lines. Rerunning continues: rows already in --out are skipped.",
        epilog=_MINE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    mine.add_argument("checkout", metavar="CHECKOUT", help="a local git checkout")
    mine.add_argument("--out", required=True, metavar="FILE.jsonl", help="rows are appended here")
    mine.add_argument("--repo", default="", help="the rows' repo name (default: CHECKOUT's name)")
    mine.add_argument("--rev", default="HEAD", help="revision or range to walk (default HEAD)")
    mine.add_argument("--since", default="", metavar="DATE", help="only commits after DATE")
    mine.add_argument(
        "--max-commits",
        type=int,
        default=0,
        metavar="N",
        help="examine at most the N newest commits (default: all)",
    )
    mine.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="commits mined in parallel (default: min(cores, 2))",
    )
    _common(mine)
    val = commands.add_parser(
        "swe-validate",
        help="check a SWE-bench-format task file: the gold patch resolves, an empty one does not",
        description="Build each task's environment and grade its gold patch and an empty patch "
        "in the sandbox, as training does on load; print a table (task, status, reason, "
        "seconds). Exit 0 when every task is valid, 1 otherwise, 2 on bad input.",
        allow_abbrev=False,
    )
    val.add_argument("tasks", metavar="TASKS.jsonl")
    val.add_argument(
        "--repos-root",
        required=True,
        metavar="DIR",
        help="directory of the git checkouts (env.swe.repos_root)",
    )
    val.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="tasks checked in parallel (default: min(cores, 2))",
    )
    val.add_argument(
        "--fresh", action="store_true", help="check again instead of reading cached verdicts"
    )
    _common(val)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="config whose [env] applies")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="env.field=value",
        help="config overrides, e.g. env.swe.pip_args=...",
    )


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """Run `saorl swe-mine` / `saorl swe-validate` (`extra`: what argparse left over)."""
    name = args.command
    flags = [a for a in extra if a.startswith("-")]
    if flags:
        print(f"saorl {name}: error: unrecognized arguments: {' '.join(flags)}", file=sys.stderr)
        return 2
    if args.jobs < 0 or getattr(args, "max_commits", 0) < 0:
        print(f"saorl {name}: error: --jobs and --max-commits must be >= 0", file=sys.stderr)
        return 2
    try:
        swe = load_config(args.config, [*args.overrides, *extra]).env.swe
        if name == "swe-mine":
            return _mine(args, swe)
        return _validate(args, swe)
    except ConfigError as exc:
        print(f"saorl {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"saorl {name}: interrupted", file=sys.stderr)
        return 130


def _cache_dir(swe: SweConfig) -> Path:
    from saorl.envs.swe.workspace import UnsafeCacheDir, swe_cache_dir

    try:
        return swe_cache_dir(swe.cache_dir)
    except UnsafeCacheDir as e:
        raise ConfigError(f"env.swe.cache_dir: {e}") from None


def _mine(args: argparse.Namespace, swe: SweConfig) -> int:
    from saorl.envs.swe.grading import check_pytest
    from saorl.envs.swe.mine import MineOptions, default_jobs, mine

    out = Path(args.out)
    checkout = Path(args.checkout).expanduser()
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give the .jsonl file to append to")
    check_pytest()
    opts = MineOptions(
        checkout=checkout,
        out=out,
        repo=args.repo,
        rev=args.rev,
        since=args.since,
        max_commits=args.max_commits,
        jobs=args.jobs or default_jobs(),
    )
    counts = mine(opts, swe, _cache_dir(swe))
    print(
        f"swe-mine: {counts['written']} task(s) appended to {out} ({counts['examined']} "
        f"commit(s) examined: {counts['rejected']} candidate(s) left out, "
        f"{counts['not_candidates']} not changing both code and tests; "
        f"{counts['already_in_out']} already in the file)"
    )
    root = checkout.resolve().parent
    print(
        f"train: saorl train --config examples/swe_real.toml env.swe.tasks={out} "
        f"env.swe.repos_root={root}"
    )
    return 0


def _validate(args: argparse.Namespace, swe: SweConfig) -> int:
    from saorl.envs.swe.grading import check_pytest
    from saorl.envs.swe.swebench import load_swebench
    from saorl.envs.swe.validate import check_tasks, default_jobs, table

    check_pytest()
    cache = _cache_dir(swe)
    tasks = load_swebench(args.tasks, args.repos_root, cache)
    checked = check_tasks(
        tasks, swe, cache, use_cache=not args.fresh, jobs=args.jobs or default_jobs()
    )
    results = [v for _, v in checked]
    print(table(results))
    bad = [v for v in results if v.status != "valid"]
    for v in bad:
        print(f"\n{v.key} ({v.status}):\n  " + v.reason.replace("\n", "\n  "))
    print(f"\n{len(results) - len(bad)} of {len(results)} task(s) valid")
    return 1 if bad else 0

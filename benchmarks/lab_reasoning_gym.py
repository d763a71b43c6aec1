"""The stability lab's experiment (issue 32): reasoning-gym tasks, forced staleness, 3 seeds.

    .venv/bin/python benchmarks/lab_reasoning_gym.py --out runs/lab_rg

1. The built-in tiny model gets `examples/lab_reasoning_gym.toml`'s supervised warm-up once
   (`learner.sft_steps` at `run.seed`) and is saved as a Hugging Face directory (`OUT/warm`),
   built as `saorl train` builds it, so every arm and seed starts RL from the same weights and
   the comparison does not pay for 24 warm-ups.
2. `saorl compare` runs every arm at seeds 0, 1, 2 from that model (`model.name_or_path =
   OUT/warm`, `learner.sft_steps = 0`), seed-major, and writes `OUT/index.html`,
   `OUT/compare.json` and `OUT/compare.png`.

Both steps are resumable: a saved warm model is reused and finished runs are skipped. Start it
under `nice -n 10` on a shared machine. The table and the reading: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "lab_reasoning_gym.toml"
ARMS = (
    "sao",
    "grpo",
    "grpo_dis",
    # VAPO's recipe, its value pre-training cut from 50 to 10 critic-only steps (SAO's), so
    # that its policy trains for 30 of the 40 steps as SAO's does.
    "vapo:critic.warmup_steps=10",
    "grpo+tis",
    "grpo+icepop",
    "grpo+seq_mis",
    "sao+tis",
)


def export_warm_model(config: Path, out: Path) -> dict[str, float]:
    """The built-in model after the config's supervised warm-up, saved to `out`."""
    import torch

    from saorl.config import load_config
    from saorl.envs.factory import build_env
    from saorl.learner.sft import supervised_warmup
    from saorl.models.loading import load_policy, save_pretrained

    cfg = load_config(config, [])
    torch.set_num_threads(1)
    torch.manual_seed(cfg.run.seed)  # as saorl.loop seeds it just before building the policy
    policy, tokenizer = load_policy(cfg.model)
    t0 = time.perf_counter()
    supervised_warmup(policy, tokenizer, build_env(cfg.env), cfg, None)
    save_pretrained(policy, tokenizer, out)
    return {"sft_steps": cfg.learner.sft_steps, "seconds": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "lab_rg")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=3, help="runs at a time (saorl compare --jobs)")
    p.add_argument("overrides", nargs="*", help="shared section.field=value overrides")
    args = p.parse_args()

    from saorl.config.io import toml_string
    from saorl.experiments.compare import run_compare, split_arms

    args.out.mkdir(parents=True, exist_ok=True)
    warm = args.out / "warm"
    if not (warm / "config.json").exists():
        info = export_warm_model(CONFIG, warm)
        print(f"warm-up: {info['sft_steps']} steps in {info['seconds']:.0f} s", flush=True)
        (args.out / "warm.json").write_text(json.dumps(info, indent=2))
    shared = [
        f"model.name_or_path={toml_string(str(warm))}",
        "learner.sft_steps=0",
        *args.overrides,
    ]
    t0 = time.perf_counter()
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    index = run_compare(
        CONFIG, shared, split_arms(args.arms), args.out, seeds=args.seeds, jobs=args.jobs
    )
    print(f"{index} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

"""Kill a synchronous tiny `saorl train` run with SIGKILL again and again, resume it each time,
and check the invariants the reliability tests check once (tests/faults/test_kill_resume.py):

- the newest checkpoint always loads, and never goes back to an older step;
- metrics.jsonl holds every step up to the newest checkpoint exactly once;
- no checkpoint is ever quarantined as damaged, and torn temporary files are cleaned up;
- after the last resume the run's metrics equal an uninterrupted run's (synchronous mode is
  deterministic: every non-timing column, floats within 1e-6, relative or absolute).

Each kill is either an armed point of the checkpoint writer (`SAORL_FAULT`, see saorl.faults)
at a random step, or a signal after a random delay: SIGKILL, or SIGTERM, which must end the
run with exit 143 and a checkpoint of the last step it logged (`saorl.run.signals`). Some of the
SIGKILL tries first start a second writer on the live run (`--resume`), which must be refused
with exit 2 (`saorl.run.lock`). Prints a table and writes JSON:

    python scripts/fault_campaign.py --kills 40 --out benchmarks/results/fault_campaign.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from saorl.checkpoint.io import checkpoint_dir, list_checkpoints, load_latest_checkpoint
from saorl.faults import POINTS
from tests.faults._common import TINY_SYNC, assert_same_metrics, metric_rows, saorl_cmd


def _one_kill(base: list[str], run_dir: Path, fault: str | float) -> str:
    args = ["--resume", str(run_dir)] if run_dir.exists() else ["run.name=killed"]
    env = dict(os.environ)
    if isinstance(fault, str):
        env["SAORL_FAULT"] = fault
        proc = subprocess.run(
            saorl_cmd("train", *base, *args), env=env, capture_output=True, text=True, timeout=600
        )
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(f"{fault}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        return "killed" if proc.returncode else "finished before the point"
    proc = subprocess.Popen(
        saorl_cmd("train", *base, *args),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(abs(fault))
    if fault < 0:  # SIGTERM: a graceful stop, with a checkpoint of the step it reached
        proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        if code == -signal.SIGTERM:  # during start-up, before the handler is installed
            return "ended during start-up"
        if code not in (0, 143):
            raise AssertionError(f"SIGTERM: exit {code}")
        if code == 143 and metric_rows(run_dir)[-1]["step"] != _check(run_dir, -1):
            raise AssertionError("SIGTERM: the last step logged was not checkpointed")
        return "stopped, saved" if code else "finished before the signal"
    if (run_dir / "metrics.jsonl").exists() and proc.poll() is None and fault > 5:
        cmd = saorl_cmd("train", "--resume", str(run_dir))
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.poll() is None and second.returncode != 2:
            raise AssertionError(f"a second writer was not refused: {second.stderr[-2000:]}")
    proc.send_signal(signal.SIGKILL)
    return "killed" if proc.wait() == -signal.SIGKILL else "finished before the signal"


def _check(run_dir: Path, seen: int) -> int:
    if not list_checkpoints(run_dir):
        return seen
    step = load_latest_checkpoint(run_dir)[1]["step"]  # raises if none loads
    if step < seen:
        raise AssertionError(f"newest checkpoint went back from step {seen} to {step}")
    if list(checkpoint_dir(run_dir).glob("*.damaged")):
        raise AssertionError("a checkpoint was found damaged")
    steps = [r["step"] for r in metric_rows(run_dir)]
    if steps[: step + 1] != list(range(step + 1)):
        raise AssertionError(f"metrics steps {steps} do not cover 0..{step} exactly once")
    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=40, help="kills in all (a run restarts each)")
    ap.add_argument("--steps", type=int, default=12, help="learner steps of the run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/fault_campaign.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory() as tmp:
        base = [*TINY_SYNC, f"run.output_dir={tmp}", f"run.total_steps={args.steps}"]
        ref = subprocess.run(
            saorl_cmd("train", *base, "run.name=ref"), capture_output=True, text=True, timeout=600
        )
        if ref.returncode:
            raise SystemExit(ref.stderr)
        run_dir, seen, restarts = Path(tmp) / "killed", -1, 0
        for i in range(args.kills):
            if seen >= args.steps:  # the run finished: start a fresh one
                seen, restarts = -1, restarts + 1
                run_dir = Path(tmp) / f"killed-{restarts}"
            if rng.random() < 0.7:
                fault: str | float = f"{rng.choice(POINTS)}@{rng.randint(seen + 1, args.steps)}"
                kind = fault.split("@")[0]
            elif rng.random() < 0.5:
                fault, kind = rng.uniform(1.0, 10.0), "SIGKILL at a random time"
            else:
                fault, kind = -rng.uniform(1.0, 10.0), "SIGTERM at a random time"
            outcome = _one_kill(base, run_dir, fault)
            seen = _check(run_dir, seen)
            tally[kind][outcome] += 1
            print(f"[{i + 1}/{args.kills}] {kind:20s} {outcome:28s} newest checkpoint {seen}")
        final = subprocess.run(
            saorl_cmd("train", *base, "--resume", str(run_dir)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if final.returncode:
            raise SystemExit(final.stderr)
        assert_same_metrics(metric_rows(run_dir), metric_rows(Path(tmp) / "ref"))
    rows = {k: dict(v) for k, v in sorted(tally.items())}
    print("\n| kill point | tries | outcome |\n|---|---|---|")
    for kind, counts in rows.items():
        print(f"| {kind} | {sum(counts.values())} | {counts} |")
    print("all invariants held; final metrics equal the uninterrupted run's")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"kills": args.kills, "steps": args.steps, "by_point": rows, "invariants": "held"}
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

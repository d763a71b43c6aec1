"""Asynchronous SAO against synchronous training on long-tailed response lengths.

    python benchmarks/bench_async.py [--preset default|genbound] [--steps N] [--median 48]
                                     [--sigma 1.0] [--arms a,b] [--set k=v] [--out PATH]

Workload: the built-in model (2 layers, 128 wide, random init) on the built-in addition
prompts, 64 trajectories per step, every response forced to a length drawn per rollout from a
lognormal (`rollout.forced_length = "lognormal"`: EOS suppressed, exactly L tokens, L =
round(median * exp(sigma * z)) clipped to `--cap`). Forcing the lengths makes the workload
identical in every mode (the same length distribution, independent of what the policy learns)
and long-tailed the way reasoning rollouts are; the price is that rewards are 0 (the answers
are not sums), so this measures the pipeline, not learning. Every arm runs the real loop,
learner and engine (`saorl.loop.train_from_config`) one after another on the same machine,
with a packed learner (`learner.micro_batch_tokens`, no padding: the learner's cost follows the
tokens, not the longest row):

    sync        run.concurrency = "sync": generate a batch, then train (one torch thread)
    sync_2t     the same with run.torch_threads = 2: the synchronous baseline given both cores
    async       run.concurrency = "threads", algorithm sao (single rollouts, critic)
    async_single  async with algorithm running_mean (single rollouts, DIS, no critic)
    async_grpo  async with algorithm grpo_dis, groups of 8 (DIS, no critic): the same learner
                as async_single, so async_single / async_grpo step times isolate the cost of
                waiting for whole groups (`group wait` = first to last member finishing)
    async_stale4, async_push4, async_push8  async with learner.max_staleness = 4, or a weight
                push every 4 / 8 policy versions (learner.push_every), for the genbound preset
    async_ray   async with the rollout worker in a Ray actor (its own process: no GIL shared
                with the learner); in the genbound preset's arms
    async_proc  async with run.concurrency = "process": the rollout worker in a child process
                without Ray, weights through shared memory; in the genbound preset's arms

Presets (`--preset`, the defaults of the flags; `results/<preset's file>.json`):
- default (`async.json`): median 48, sigma 1, cap 384, the built-in model. Learner-bound on a
  CPU: the SAO learner needs ~5x the time the engine needs for the same tokens.
- genbound (`async_genbound.json`), a generation-bound configuration, the kind where
  asynchrony pays: a heavy tail (median 8, sigma 2.4, cap 1024: mean 60-70 tokens, the longest
  of a batch near the cap, so a synchronous batch waits ~1000 decoding steps for its last row
  while the learner trains its ~4k tokens in 0.4 s), 512-token packs (the learner's attention
  cost is quadratic in the pack), and the built-in model narrowed to 32 units (2 heads, 1
  key/value head, MLP 128): decoding is then dominated by per-step overhead (a step of 64 rows
  costs a few times one of a few rows, not 64 times; on a GPU decoding is memory-bound in the
  same way) while the learner's compute shrinks. At the built-in width the ideal computed
  below stays ~2.1 with these lengths (the learner costs too much per token); narrowed, ~3.3.
  `learner.max_staleness = 16` for every arm: a row at the cap outlives ~10 learner steps and
  would otherwise be dropped after being generated (`async_stale4` measures that).

Figures are over the steady-state steps (after `--skip` steps that fill the pipeline):
- step time = wall time per optimizer step; speedup = sync step time / arm step time;
  tokens/s = trained response tokens per second (first-finished batches favour short
  responses, so a fast arm may also train on shorter ones; compare both);
- learner idle = time the learner waited for trajectories / wall time; rollout idle = time
  the rollout worker was held by admission control (or, in sync mode, by training) / wall;
- stage times from the sync run: `t_gen_sync` (generation per batch: the learner's wait) and
  `t_train` (the rest of the step); `t_gen_full` = tokens per batch / the engine's tokens/s
  at full occupancy (a standalone engine run on the same lengths, `max_concurrent` rows kept
  full), i.e. generation per batch without the long-tail drain;
- ideal async speedup = (t_gen_sync + t_train) / max(t_train, t_gen_full): with perfect
  overlap the slower stage sets the pace, and generation runs with its batch always full;
  an arm's share of it (`of ideal`) = max(t_train, t_gen_full) / its step time, so a burst of
  load during the sync run's generation does not move it (one during its training does);
- `--pushed-capacity` (genbound): the engine alone with rows refilled as they finish (5 s after
  3 s of warm-up: the steady mix, long rows included), without and with a weight push every
  `t_train` x `push_every` seconds (the pace of a learner-bound async loop; each push drops the
  KV cache and re-prefills the running rows, grouped by length: `saorl.engines.prefill_plan`),
  and each arm's rollout tokens/s in the loop
  (generated, trained or not) as a share of the first: where the rollout side loses;
- `--contention` (genbound): the async arm's learner step timed on the same batches alone,
  beside an engine decoding in a process of its own (what the two cores share whatever the
  code does: caches, memory, the host) and beside the rollout thread in the learner's process
  with a push per step (that plus the GIL), alternated; and, next to the ideal, the ideal with
  t_train slowed by the first factor (`ideal_speedup_shared_hardware`) and each arm's share of
  it. Measured on the 2-vCPU VM (quiet): x1.01-1.08 beside the engine process, x1.35-1.57
  beside the thread; there the learner thread's CPU time per step rises 13-29% (GIL hand-offs)
  and it waits the rest for the GIL, which the engine's decoding loop holds about a third of
  its time, mostly in transformers' forward. That is why `async_ray` (rollouts in their own
  process) gets closer to the ideal than `async` on a quiet machine;
- `other load` (each arm, and the contention runs): cores used by processes outside this
  benchmark's process tree while it ran, and the VM's steal time: this machine is shared, and
  one test run elsewhere takes a core of two.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

from saorl.config import load_config
from saorl.engines.factory import build_engine
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.envs.arithmetic import ArithmeticTask
from saorl.envs.factory import build_env
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from saorl.monitoring.metrics import read_metrics
from saorl.rollout.lengths import lognormal_lengths
from saorl.rollout.pool import WorkerPool, agent_limits
from saorl.rollout.worker import PromptFeed, RolloutWorker
from saorl.topology import build_topology
from saorl.types import Batch

# Named configurations (`--preset`): the defaults of the command-line flags; `set` holds
# overrides applied to every arm.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {
        "steps": 20,
        "skip": 4,
        "median": 48,
        "sigma": 1.0,
        "cap": 384,
        "batch": 64,
        "micro_batch": 16,
        "micro_batch_tokens": 1024,
        "concurrent": 64,
        "arms": "sync,sync_2t,async,async_single,async_grpo",
        "set": [],
        "pushed_capacity": False,
        "contention": False,
        "out": Path("benchmarks/results/async.json"),
    },
    "genbound": {
        "steps": 30,
        "skip": 6,
        "median": 8,
        "sigma": 2.4,
        "cap": 1024,
        "batch": 64,
        "micro_batch": 16,
        "micro_batch_tokens": 512,
        "concurrent": 64,
        "arms": "sync,async,async_proc,async_ray,async_stale4,async_push4,async_push8",
        "pushed_capacity": True,
        "contention": True,
        "set": [
            "model.hidden_size=32",
            "model.num_heads=2",
            "model.num_kv_heads=1",
            "model.intermediate_size=128",
            "learner.max_staleness=16",
        ],
        "out": Path("benchmarks/results/async_genbound.json"),
    },
}

ARMS = {
    "sync": ["run.concurrency=sync"],
    "sync_2t": ["run.concurrency=sync", "run.torch_threads=2"],
    "async": ["run.concurrency=threads"],
    # The group barrier, isolated: the same DIS loss and critic-free learner, single rollouts
    # with a per-prompt running-mean baseline against GRPO groups of 8.
    "async_single": ["run.concurrency=threads", "algorithm.name=running_mean"],
    "async_grpo": ["run.concurrency=threads", "algorithm.name=grpo_dis", "algorithm.group_size=8"],
    # Variations of `async` for the genbound preset (which sets learner.max_staleness=16):
    # the default staleness bound, and one weight push per 4 or 8 policy versions.
    "async_stale4": ["run.concurrency=threads", "learner.max_staleness=4"],
    "async_push4": ["run.concurrency=threads", "learner.push_every=4"],
    "async_push8": ["run.concurrency=threads", "learner.push_every=8"],
    # The rollout worker in its own process (a Ray actor): no GIL shared with the learner.
    "async_ray": ["run.concurrency=threads", "ray.enabled=true"],
    # The same without Ray: a child process, weights through shared memory.
    "async_proc": ["run.concurrency=process"],
}


def base_overrides(args: argparse.Namespace, out_dir: Path) -> list[str]:
    return [
        "learner.sft_steps=0",  # random init: throughput does not depend on what it knows
        "critic.warmup_steps=0",  # every step is a full SAO step (critic + policy)
        f"learner.batch_size={args.batch}",
        f"learner.micro_batch_size={args.micro_batch}",
        f"learner.micro_batch_tokens={args.micro_batch_tokens}",
        f"rollout.max_concurrent={args.concurrent}",
        f"rollout.max_new_tokens={args.cap}",
        f"model.max_seq_len={args.cap + 16}",
        "rollout.forced_length=lognormal",
        f"rollout.forced_length_median={args.median}",
        f"rollout.forced_length_sigma={args.sigma}",
        f"run.total_steps={args.steps}",
        "run.eval_every=0",
        "run.eval_samples=1",
        "env.eval_size=8",
        "run.checkpoint_every=0",
        "run.progress=false",
        f"run.output_dir={out_dir}",
        *args.set,
    ]


def _engine_and_requests(cfg: Any, requests: int) -> tuple[Any, Any, list[GenerationRequest]]:
    """A fresh engine of the run's model and `requests` prompts with forced lengths."""
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_policy(cfg.model)
    rc = cfg.rollout
    engine = HFEngine(
        model,
        tok,
        EngineSettings(max_seq_len=cfg.model.max_seq_len, max_concurrent=rc.max_concurrent, seed=1),
    )
    task, rng = ArithmeticTask(), random.Random(0)
    draw = lognormal_lengths(rc.forced_length_median, rc.forced_length_sigma, cfg.run.seed + 99)
    lengths = [min(draw(), rc.max_new_tokens) for _ in range(requests)]
    reqs = [
        GenerationRequest(tok.encode(task.sample(rng).prompt), n, request_id=i, min_new_tokens=n)
        for i, n in enumerate(lengths)
    ]
    return engine, model, reqs


def engine_capacity(cfg: Any, requests: int) -> dict[str, float]:
    """Tokens/s of one engine kept full (`max_concurrent` rows) on the forced lengths."""
    engine, _, reqs = _engine_and_requests(cfg, requests)
    # Steady state: time from the moment the first rows retire until the queue runs dry.
    for r in reqs:
        engine.add_request(r)
    t0, tok0, t_end, tok_end = None, 0, 0.0, 0
    while engine.num_unfinished():
        done = engine.step()
        if done and t0 is None:
            t0, tok0 = time.perf_counter(), engine.tokens_generated
        if engine._queue or t0 is None:
            t_end, tok_end = time.perf_counter(), engine.tokens_generated
    tokens_per_s = (tok_end - tok0) / max(t_end - (t0 or t_end), 1e-9)
    lengths = [r.min_new_tokens for r in reqs]
    return {"tokens_per_s": tokens_per_s, "mean_length": statistics.mean(lengths)}


def engine_refilled(
    cfg: Any, push_every_s: float, warm_s: float = 3.0, measure_s: float = 5.0
) -> dict[str, float]:
    """Tokens/s of one engine whose rows are refilled as they finish, over `measure_s` after
    `warm_s` (long rows pile up until the mix settles), with a weight update (the same
    weights) every `push_every_s` seconds when > 0: as a learner pushing at that pace would
    send; each drops the KV cache and re-prefills the running rows."""
    engine, model, reqs = _engine_and_requests(cfg, 20_000)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pending = iter(reqs)
    start = last_push = time.perf_counter()
    tok0, pushes, slowest = None, 0, 0.0
    while True:
        now = time.perf_counter()
        if tok0 is None and now - start >= warm_s:
            t0, tok0 = now, engine.tokens_generated
        if tok0 is not None and now - t0 >= measure_s:
            break
        if push_every_s and now - last_push >= push_every_s:
            pushes += tok0 is not None
            engine.update_weights(state, pushes + 1)
            last_push = now
        while engine.num_unfinished() < engine.max_concurrent:
            engine.add_request(next(pending))
        t = time.perf_counter()
        engine.step()
        slowest = max(slowest, time.perf_counter() - t) if tok0 is not None else 0.0
    return {
        "tokens_per_s": (engine.tokens_generated - tok0) / (time.perf_counter() - t0),
        "push_every_s": push_every_s,
        "pushes": pushes,
        "slowest_step_s": slowest,
    }


class OtherLoad:
    """CPU used by processes outside this benchmark's process tree, in cores, sampled in the
    background (Linux `/proc`; nothing elsewhere). The machine is often shared: a load average
    taken at the start says nothing about an arm that runs minutes later, and one busy test
    run elsewhere takes a core from a two-core machine (runs of the same `async_ray` arm took
    0.48 to 0.88 s a step on the 2-vCPU VM while other tests came and went). `mark()` starts a
    window, `since(mark)` averages over it; steal is the hypervisor's share taken from this VM."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (time, other cores, steal cores)
        self._stop = threading.Event()
        if os.path.exists("/proc/stat"):
            threading.Thread(target=self._run, args=(period_s,), daemon=True).start()

    @staticmethod
    def _read() -> tuple[float, float, dict[int, float]]:
        """(machine busy CPU s, steal CPU s, CPU s of each process in this tree)."""
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        parent, cpu = {}, {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:  # it exited meanwhile
                    continue
                parent[int(name)] = int(fields[1])
                cpu[int(name)] = (int(fields[11]) + int(fields[12])) / hz
        ours, root = {}, os.getpid()
        for pid in cpu:
            p = pid
            while p > 1 and p != root:
                p = parent.get(p, 0)
            if p == root:
                ours[pid] = cpu[pid]
        return (sum(v) - v[3] - v[4]) / hz, v[7] / hz, ours  # idle and iowait are not busy

    def _run(self, period_s: float) -> None:
        busy, steal, ours = self._read()
        while not self._stop.wait(period_s):
            t = time.perf_counter()
            busy1, steal1, ours1 = self._read()
            mine = sum(c - ours[p] for p, c in ours1.items() if p in ours)
            mine += sum(c for p, c in ours1.items() if p not in ours)  # started meanwhile
            self.samples.append((t, (busy1 - busy - mine) / period_s, (steal1 - steal) / period_s))
            busy, steal, ours = busy1, steal1, ours1

    def mark(self) -> float:
        return time.perf_counter()

    def since(self, mark: float) -> dict[str, float] | None:
        window = [s for s in self.samples if s[0] > mark]
        if not window:
            return None
        return {
            "other_cores": max(0.0, statistics.mean(s[1] for s in window)),
            "other_cores_max": max(s[1] for s in window),
            "steal_cores": statistics.mean(s[2] for s in window),
        }


def _decode_forever(overrides: list[str], ready: Any, stop: Any) -> None:
    """An engine of the run's model kept full of forced-length rows until `stop` (a process of
    its own, one torch thread); `ready` once the mix of lengths has settled (3 s)."""
    cfg = load_config(None, overrides)
    engine, _, _ = _engine_and_requests(cfg, 0)
    tok, rc = engine.tokenizer, cfg.rollout
    task, rng = ArithmeticTask(), random.Random(1)
    draw = lognormal_lengths(rc.forced_length_median, rc.forced_length_sigma, cfg.run.seed + 98)
    start, i = time.perf_counter(), 0
    while not stop.is_set():
        while engine.num_unfinished() < engine.max_concurrent:
            n, i = min(draw(), rc.max_new_tokens), i + 1
            prompt = tok.encode(task.sample(rng).prompt)
            engine.add_request(GenerationRequest(prompt, n, request_id=i, min_new_tokens=n))
        engine.step()
        if not ready.is_set() and time.perf_counter() - start > 3.0:
            ready.set()


def learner_contention(base: list[str], rounds: int = 2, steps: int = 5) -> dict[str, float]:
    """The async arm's learner step, timed on the same batches alone and beside a rollout load
    (after one untimed step each time): an engine decoding in another process (what two cores
    share whatever the code: caches, memory bandwidth, the host under the VM), and the rollout
    thread in this process with a weight push after each step, as in the loop (that plus the
    interpreter: the GIL). Alternated (A B C, C B A) so that a drift in load hits all three.
    `learner_cpu_*`: the learner thread's CPU time per step (the rest of a step it waited)."""
    cfg = load_config(None, [*base, *ARMS["async"]])
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    learner, _, tok = build_topology(cfg)
    spec, n = build_env(cfg.env), cfg.learner.batch_size
    gen = WorkerPool(load_config(None, [*base, *ARMS["sync"]]), tok, learner)
    gen.start(spec, PromptFeed(spec.task, random.Random(0), n, 0), None)
    batches = [gen.collect(0, n, 0).trajectories for _ in range(steps + 1)]
    batches = [Batch.from_trajectories(b, tok.pad_token_id) for b in batches]
    gen.close()
    ctx = multiprocessing.get_context("spawn")
    wall: dict[str, list[float]] = {"alone": [], "engine_process": [], "rollout_thread": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    for r in range(rounds):
        for variant in list(wall) if r % 2 == 0 else list(wall)[::-1]:
            proc = worker = None
            if variant == "engine_process":
                ready, stop = ctx.Event(), ctx.Event()
                proc = ctx.Process(target=_decode_forever, args=(base, ready, stop), daemon=True)
                proc.start()
                if not ready.wait(timeout=120):
                    proc.kill()
                    raise RuntimeError(f"the decoding process did not start (exit {proc.exitcode})")
            elif variant == "rollout_thread":
                engine = build_engine(cfg, learner.policy, tok, seed=5, version=learner.version)
                feed = PromptFeed(spec.task, random.Random(1), n, 10**6)  # never held back
                worker = RolloutWorker(
                    engine, feed, tok, queue.Queue(), spec.make_env, agent_limits(cfg, spec)
                )
                worker.start()
                time.sleep(3.0)  # the mix of lengths settles (long rows pile up)
            for i, batch in enumerate(batches):
                t, c = time.perf_counter(), time.thread_time()
                learner.step(batch)
                if worker is not None:
                    worker.engine.update_weights(learner.policy_state(), learner.version)
                if i:
                    wall[variant].append(time.perf_counter() - t)
                    cpu[variant].append(time.thread_time() - c)
            if proc is not None:
                stop.set()
                proc.join(timeout=30)
            if worker is not None:
                worker.stop_thread()
    out = {f"learner_{k}_s": statistics.mean(v) for k, v in wall.items()}
    out.update({f"learner_cpu_{k}_s": statistics.mean(v) for k, v in cpu.items()})
    return out


def steady(rows: list[dict[str, Any]], skip: int) -> dict[str, float]:
    """Per-step figures over steps `skip`..last from cumulative metrics."""
    rows = [r for r in rows if r.get("step", 0) >= 1 and "time/wall_s" in r]
    a, b = rows[skip - 1], rows[-1]
    steps = b["step"] - a["step"]
    wall = b["time/wall_s"] - a["time/wall_s"]

    def cum(r: dict[str, Any], key: str) -> float:
        return r[key] * r["time/wall_s"]

    waited = cum(b, "perf/learner_idle_frac") - cum(a, "perf/learner_idle_frac")
    r_idle = cum(b, "perf/rollout_idle_frac") - cum(a, "perf/rollout_idle_frac")
    window = [r for r in rows if r["step"] > a["step"]]
    out = {
        "steps": steps,
        "step_s": wall / steps,
        "learner_idle_frac": waited / wall,
        "rollout_idle_frac": r_idle / wall,
        "gen_wait_s": waited / steps,
        "train_s": (wall - waited) / steps,
        "response_len_mean": statistics.mean(r["rollout/response_len_mean"] for r in window),
        "staleness_mean": statistics.mean(r["async/staleness_mean"] for r in window),
    }
    generated = cum(b, "perf/rollout_tokens_per_s") - cum(a, "perf/rollout_tokens_per_s")
    out["rollout_tokens_per_s"] = generated / wall  # generated, trained or not
    out["dropped_stale"] = b["async/dropped_stale"] - a["async/dropped_stale"]
    waits = [r["async/group_wait_s"] for r in window if "async/group_wait_s" in r]
    if waits:
        out["group_wait_s"] = statistics.mean(waits)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="default",
        help="named configuration: the defaults of the flags below",
    )
    p.add_argument("--steps", type=int, help="optimizer steps per arm")
    p.add_argument("--skip", type=int, help="steps left out as pipeline fill")
    p.add_argument("--median", type=int, help="median response length, tokens")
    p.add_argument("--sigma", type=float, help="sigma of log(response length)")
    p.add_argument("--cap", type=int, help="max response length, tokens")
    p.add_argument("--batch", type=int, help="trajectories per optimizer step")
    p.add_argument("--micro-batch", type=int, help="trajectories per fwd/bwd")
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        help="packed tokens per fwd/bwd (learner.micro_batch_tokens); 0 = padded",
    )
    p.add_argument("--concurrent", type=int, help="rollout.max_concurrent")
    p.add_argument("--arms", help="comma-separated subset of arms")
    p.add_argument("--set", action="append", default=[], help="extra override, every arm")
    p.add_argument(
        "--pushed-capacity",
        action=argparse.BooleanOptionalAction,
        help="also measure the engine kept full under weight pushes at the learner's pace",
    )
    p.add_argument(
        "--contention",
        action=argparse.BooleanOptionalAction,
        help="also time the async arm's learner step alone, beside an engine process and beside "
        "the rollout thread (the hardware's and the GIL's shares of its slowdown)",
    )
    p.add_argument("--out", type=Path, help="JSON report (default: the preset's)")
    args = p.parse_args()
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.set = [*PRESETS[args.preset]["set"], *args.set]

    load = os.getloadavg()[0]
    others = OtherLoad()
    results: dict[str, Any] = {}
    contention = None
    with tempfile.TemporaryDirectory() as tmp:
        base = base_overrides(args, Path(tmp))
        cap = engine_capacity(load_config(None, base), requests=4 * args.concurrent)
        for arm in args.arms.split(","):
            cfg = load_config(None, [*base, *ARMS[arm], f"run.name={arm}"])
            t0, mark = time.perf_counter(), others.mark()
            summary = train_from_config(cfg)
            rows = read_metrics(Path(summary["run_dir"]) / "metrics.jsonl")
            results[arm] = {**steady(rows, args.skip), "run_s": time.perf_counter() - t0}
            r = results[arm]
            r["trained_tokens_per_s"] = args.batch * r["response_len_mean"] / r["step_s"]
            r["other_load"] = others.since(mark)  # over the whole run, start-up included
            busy = (
                f", other processes {r['other_load']['other_cores']:.2f} cores"
                if (r["other_load"])
                else ""
            )
            print(f"  {arm}: {results[arm]['step_s']:.2f} s/step{busy}", flush=True)
        if args.contention:
            mark = others.mark()
            contention = learner_contention(base)
            contention["other_load"] = others.since(mark)
        sync = results.get("sync")
        if sync and args.pushed_capacity:
            # The engine kept full, without and with weights arriving at the pace of a
            # learner-bound async loop (one push per `push_every` steps of t_train).
            cfg = load_config(None, base)
            refilled = engine_refilled(cfg, 0.0)
            cap_pushed = engine_refilled(cfg, sync["train_s"] * cfg.learner.push_every)

    ideal = None
    if sync:
        t_gen_full = args.batch * sync["response_len_mean"] / cap["tokens_per_s"]
        ideal = (sync["gen_wait_s"] + sync["train_s"]) / max(sync["train_s"], t_gen_full)
        stages = {
            "t_gen_sync_s": sync["gen_wait_s"],
            "t_train_s": sync["train_s"],
            "t_gen_full_s": t_gen_full,
            "ideal_speedup": ideal,
        }
        if args.pushed_capacity:
            t_pushed = args.batch * sync["response_len_mean"] / cap_pushed["tokens_per_s"]
            stages["t_gen_full_pushed_s"] = t_pushed
            for r in results.values():  # the rollout thread in the loop vs the engine alone
                r["rollout_share_of_refilled_engine"] = (
                    r["rollout_tokens_per_s"] / refilled["tokens_per_s"]
                )
        for r in results.values():
            r["speedup_vs_sync"] = sync["step_s"] / r["step_s"]
            # = max(t_train, t_gen_full) / step time: independent of the sync run's t_gen_sync
            r["share_of_ideal"] = r["speedup_vs_sync"] / ideal
        if contention:
            # The learner as slowed by the other core's work alone (no code removes that on
            # this machine): an extra reference next to the ideal, which stays as defined.
            hw = contention["learner_engine_process_s"] / contention["learner_alone_s"]
            pace = max(sync["train_s"] * max(hw, 1.0), t_gen_full)  # below 1 is noise
            stages["learner_hardware_factor"] = hw
            stages["learner_gil_factor"] = (
                contention["learner_rollout_thread_s"] / contention["learner_engine_process_s"]
            )
            stages["ideal_speedup_shared_hardware"] = (sync["gen_wait_s"] + sync["train_s"]) / pace
            for r in results.values():
                r["share_of_ideal_shared_hardware"] = pace / r["step_s"]
    print(
        f"\nasync vs sync, long-tailed lengths: lognormal median {args.median} sigma "
        f"{args.sigma} cap {args.cap}, batch {args.batch}, {args.steps} steps "
        f"({args.skip} skipped), load average at start {load:.2f}"
    )
    print(
        f"{'arm':12} {'s/step':>7} {'speedup':>8} {'of ideal':>9} {'tokens/s':>9} "
        f"{'learner idle':>13} {'rollout idle':>13} {'staleness':>10} {'group wait s':>13} "
        f"{'other load':>11}"
    )
    for arm, r in results.items():
        gw = f"{r['group_wait_s']:.2f}" if "group_wait_s" in r else "-"
        ol = f"{r['other_load']['other_cores']:.2f}" if r["other_load"] else "-"
        print(
            f"{arm:12} {r['step_s']:7.2f} {r.get('speedup_vs_sync', float('nan')):8.2f} "
            f"{100 * r.get('share_of_ideal', float('nan')):8.0f}% "
            f"{r['trained_tokens_per_s']:9.0f} "
            f"{100 * r['learner_idle_frac']:12.1f}% {100 * r['rollout_idle_frac']:12.1f}% "
            f"{r['staleness_mean']:10.2f} {gw:>13} {ol:>11}"
        )
    print("(other load: cores used by processes outside this benchmark during the arm)")
    if sync:
        print(
            f"\nstages (sync run): t_gen_sync {stages['t_gen_sync_s']:.2f} s, t_train "
            f"{stages['t_train_s']:.2f} s, t_gen_full {stages['t_gen_full_s']:.2f} s "
            f"(engine kept full: {cap['tokens_per_s']:.0f} tokens/s)"
        )
        print(
            f"ideal async speedup = (t_gen_sync + t_train) / max(t_train, t_gen_full) = {ideal:.2f}"
        )
        print(
            f"rollout capacity / learner demand = t_train / t_gen_full = "
            f"{stages['t_train_s'] / stages['t_gen_full_s']:.2f}"
        )
        if contention:
            c = contention
            print(
                f"learner step on the same batches (async arm's config): alone "
                f"{c['learner_alone_s']:.3f} s; beside an engine decoding in another process "
                f"{c['learner_engine_process_s']:.3f} s (x{stages['learner_hardware_factor']:.2f}: "
                f"the shared hardware); beside the rollout thread in this process, a push per "
                f"step, {c['learner_rollout_thread_s']:.3f} s (x{stages['learner_gil_factor']:.2f}"
                f" more: the GIL). Learner thread CPU per step "
                f"{c['learner_cpu_alone_s']:.3f} / {c['learner_cpu_engine_process_s']:.3f} / "
                f"{c['learner_cpu_rollout_thread_s']:.3f} s"
            )
            shares = ", ".join(
                f"{arm} {100 * r['share_of_ideal_shared_hardware']:.0f}%"
                for arm, r in results.items()
                if arm.startswith("async")
            )
            print(
                f"ideal with the learner slowed by the shared hardware only (t_train x "
                f"{max(stages['learner_hardware_factor'], 1.0):.2f}) = "
                f"{stages['ideal_speedup_shared_hardware']:.2f}; reached: {shares}"
            )
        if args.pushed_capacity:
            print(
                f"engine alone, rows refilled as they finish: {refilled['tokens_per_s']:.0f} "
                f"tokens/s; with a weight push every {cap_pushed['push_every_s']:.2f} s: "
                f"{cap_pushed['tokens_per_s']:.0f} tokens/s (slowest step, a re-prefill: "
                f"{cap_pushed['slowest_step_s']:.3f} s): a batch's tokens take "
                f"{stages['t_gen_full_pushed_s']:.2f} s"
            )
            for arm, r in results.items():
                print(
                    f"{arm}: rollouts generated {r['rollout_tokens_per_s']:.0f} tokens/s in the "
                    f"loop ({100 * r['rollout_share_of_refilled_engine']:.0f}% of the engine "
                    f"alone), {r['dropped_stale']} dropped as stale"
                )
    targets = {}
    if sync and "async" in results:
        got, idle = results["async"]["speedup_vs_sync"], results["async"]["learner_idle_frac"]
        targets = {
            "speedup_at_least_2.8": [got, got >= 2.8],
            "within_15pct_of_ideal": [got / ideal, got >= 0.85 * ideal],
            "async_learner_idle_below_10pct": [idle, idle < 0.10],
        }
        if args.preset == "genbound":  # this configuration's own targets (issue 19)
            targets = {
                "ideal_at_least_2.5": [ideal, ideal >= 2.5],
                "within_15pct_of_ideal": [got / ideal, got >= 0.85 * ideal],
            }
            for arm in ("async_ray", "async_proc"):  # the rollout worker in its own process
                if arm in results:
                    share = results[arm]["share_of_ideal"]
                    targets[f"{arm}_within_15pct_of_ideal"] = [share, share >= 0.85]
        print(f"async reaches {got:.2f}x = {100 * got / ideal:.0f}% of the ideal")
        for name, (value, met) in targets.items():
            print(f"target {name}: {value:.3f} -> {'met' if met else 'MISSED'}")
    if "async_single" in results and "async_grpo" in results:
        cost = results["async_grpo"]["step_s"] / results["async_single"]["step_s"]
        print(f"group barrier: async_grpo step time / async_single step time = {cost:.2f}")
    report = {
        "benchmark": "async_vs_sync",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(load),
        "workload": {
            k: getattr(args, k)
            for k in (
                "preset",
                "set",
                "steps",
                "skip",
                "median",
                "sigma",
                "cap",
                "batch",
                "micro_batch",
                "micro_batch_tokens",
                "concurrent",
            )
        },
        "engine_full_occupancy": cap,
        "engine_refilled": refilled if sync and args.pushed_capacity else None,
        "engine_refilled_pushed": cap_pushed if sync and args.pushed_capacity else None,
        "stages": stages if sync else None,
        "learner_contention": contention,
        "targets": targets,
        "arms": results,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()

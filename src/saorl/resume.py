"""What a checkpoint keeps of the rollout side, so a resumed run loses and repeats nothing.

At a checkpoint the rollout workers are paused between two decoding steps and three things are
recorded beside the learner state (`saorl.loop._state`):
- the prompt feed: data position, sampler RNG, and a group (GRPO) still being handed out;
- finished trajectories not yet trained (in the output queue or in an incomplete group): they
  are put back in the queue on resume and trained as if nothing had happened;
- the tasks of in-flight episodes: re-issued first on resume, under their old group ids. Their
  partial generations are not kept (the engine's KV state is not checkpointable); they restart
  from the prompt under the resumed weights;
- each engine's sampling RNG, so a synchronous run (nothing in flight at a checkpoint) resumes
  bit-for-bit (tests/faults/test_exact_resume.py).
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import sys
from collections.abc import Sequence
from typing import Any

import torch

from saorl.rollout.worker import PromptFeed, RolloutWorker
from saorl.types import Trajectory


def snapshot_rollouts(
    workers: Sequence[RolloutWorker],
    feed: PromptFeed,
    out: queue.Queue[Trajectory],
    partial_groups: dict[int, list[Trajectory]],
) -> dict[str, Any]:
    """The rollout side's checkpoint entries, taken with every worker paused."""
    with contextlib.ExitStack() as stack:
        for w in workers:
            stack.enter_context(w.paused())
        finished = list(out.queue) + [t for g in partial_groups.values() for t in g]
        in_flight = [item for w in workers for item in w.in_flight()]
        pending = {"finished_untrained": finished, "in_flight": in_flight}
        try:
            pickle.dumps(pending)
        except Exception as e:  # an environment's task that does not pickle: still checkpoint
            print(
                f"saorl: checkpoint without the {len(finished)} untrained and {len(in_flight)} "
                f"in-flight rollouts (they do not pickle: {type(e).__name__}: {e}); a resume "
                "draws fresh prompts instead",
                file=sys.stderr,
            )
            pending = {}
        return {**feed.state(), **pending, "engine_rng": [_engine_rng(w.engine) for w in workers]}


def restore_rollouts(
    state: dict[str, Any],
    workers: Sequence[RolloutWorker],
    feed: PromptFeed,
    out: queue.Queue[Trajectory],
) -> int:
    """Put a checkpoint's rollout entries back (before the workers start); returns how many
    trajectories were restored or re-issued."""
    finished = state.get("finished_untrained", [])
    in_flight = state.get("in_flight", [])
    for traj in finished:
        out.put(traj)
    feed.restore(state, list(in_flight), len(finished))
    rngs = state.get("engine_rng", [])
    if len(rngs) == len(workers):  # same number of engines: continue their random streams
        for w, rng in zip(workers, rngs, strict=True):
            gen = getattr(w.engine, "generator", None)
            if rng is not None and isinstance(gen, torch.Generator):
                gen.set_state(rng)
    return len(finished) + len(in_flight)


def _engine_rng(engine: Any) -> torch.Tensor | None:
    gen = getattr(engine, "generator", None)
    return gen.get_state() if isinstance(gen, torch.Generator) else None

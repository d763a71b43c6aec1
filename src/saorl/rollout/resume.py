"""What a checkpoint keeps of the rollout side, so a resumed run loses and repeats nothing.

At a checkpoint the rollout workers are paused between two decoding steps and three things are
recorded beside the learner state (`Learner.save`):
- the prompt feed: data position, sampler RNG, and a group (GRPO) still being handed out;
- finished trajectories not yet trained (in the output queue or in an incomplete group): they
  are put back in the queue on resume and trained as if nothing had happened;
- the tasks of in-flight episodes: re-issued first on resume, under their old group ids. Their
  partial generations are not kept (the engine's KV state is not checkpointable); they restart
  from the prompt under the resumed weights;
- each engine's sampling RNG, so a synchronous run (nothing in flight at a checkpoint) resumes
  bit-for-bit (tests/faults/test_exact_resume.py).

A checkpoint is loaded without running code from it (`saorl.checkpoint.io.load_state_file`),
so these entries are written as plain data: a trajectory as a dict of its fields, and a task drawn
from a list of training problems (`task.train`: datasets, coding tasks) as its index and key in
that list. Other tasks are stored as they are and must be types the loader allows (the built-in
arithmetic problems). Rollouts that cannot be written that way are left out, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import sys
from collections.abc import Sequence
from typing import Any

from saorl.checkpoint.io import CheckpointError, unsafe_globals
from saorl.envs.base import task_key, training_list
from saorl.rollout.worker import PromptFeed, RolloutWorker
from saorl.types import Trajectory

# The marker of a task written as its place in the training list (`_TaskRefs`).
_REF = "saorl_train_task"


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
        feed_state = feed.state()
        refs = _TaskRefs(feed.task)
        left, current, group = feed_state.pop("feed_group", (0, None, -1))
        pending = {
            "finished_untrained": [dataclasses.asdict(t) for t in finished],
            "in_flight": [(refs.encode(task), g) for task, g in in_flight],
            # A group half handed out: its remaining members are still owed after a resume.
            "feed_group": (left, refs.encode(current), group),
        }
        try:
            refused = unsafe_globals(pending)
        except Exception as e:  # e.g. a task that does not pickle at all
            refused = [f"{type(e).__name__}: {e}"]
        if refused:  # all or nothing: a group restored in part would never complete
            print(
                f"saorl: checkpoint without the {len(finished)} untrained and {len(in_flight)} "
                f"in-flight rollouts (their tasks or results hold objects a checkpoint may not "
                f"keep: {', '.join(refused)[:200]}); a resume draws fresh prompts instead",
                file=sys.stderr,
            )
            pending = {}
        return {**feed_state, **pending, "engine_rng": [w.engine.rng_state() for w in workers]}


def restore_rollouts(
    state: dict[str, Any],
    workers: Sequence[RolloutWorker],
    feed: PromptFeed,
    out: queue.Queue[Trajectory],
) -> int:
    """Put a checkpoint's rollout entries back (before the workers start); returns how many
    trajectories were restored or re-issued."""
    refs = _TaskRefs(feed.task)
    try:
        finished = [Trajectory(**t) for t in state.get("finished_untrained", [])]
        in_flight = [(refs.decode(task), int(g)) for task, g in state.get("in_flight", [])]
        feed_state = dict(state)
        if "feed_group" in state:
            left, current, group = state["feed_group"]
            feed_state["feed_group"] = (int(left), refs.decode(current), int(group))
    except _StaleTaskError as e:  # the training list changed since the checkpoint
        print(
            f"saorl: resuming without the checkpoint's pending rollouts ({e}); fresh prompts "
            "are drawn instead",
            file=sys.stderr,
        )
        finished = []
        in_flight = []
        feed_state = {k: v for k, v in state.items() if k != "feed_group"}
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"the checkpoint's rollout entries are malformed ({type(e).__name__}: {e})"
        ) from e
    for traj in finished:
        out.put(traj)
    feed.restore(feed_state, in_flight, len(finished))
    rngs = state.get("engine_rng", [])
    if len(rngs) == len(workers):  # same number of engines: continue their random streams
        for w, rng in zip(workers, rngs, strict=True):
            if rng is not None:
                w.engine.set_rng_state(rng)
    return len(finished) + len(in_flight)


class _StaleTaskError(Exception):
    pass


class _TaskRefs:
    """Tasks drawn from `task.train` written as `{_REF: index, "key": key}` and read back.

    A coding task carries a callable that writes its repository, and a dataset problem its
    source row: neither is kept in the checkpoint; the resumed run finds the task in its own
    training list (built from the same config) by index, checked against the key.
    """

    def __init__(self, task_source: Any) -> None:
        self.train = training_list(task_source)
        self._index: dict[int, int] | None = None

    def encode(self, task: Any) -> Any:
        if task is None or not self.train:
            return task
        if self._index is None:  # built once per checkpoint, on the first task
            self._index = {id(t): i for i, t in enumerate(self.train)}
        i = self._index.get(id(task))
        return task if i is None else {_REF: i, "key": task_key(task)}

    def decode(self, item: Any) -> Any:
        if not (isinstance(item, dict) and _REF in item):
            return item
        i = item[_REF]
        key = item["key"]
        if not isinstance(i, int) or not 0 <= i < len(self.train):
            raise _StaleTaskError(f"training task {i} of {len(self.train)} is gone")
        task = self.train[i]
        if task_key(task) != key:
            raise _StaleTaskError(f"training task {i} was {key!r}, is now {task_key(task)!r}")
        return task

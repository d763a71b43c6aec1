"""A stop asked for by a signal: SIGTERM (a scheduler's preemption notice) or SIGINT (Ctrl-C).

While `saorl train` runs its loop, the first such signal only sets a flag (`StopSignals`): the
loop finishes the step in flight, checkpoints it (unless that step is saved already), writes
summary.json with `"stopped_by": "signal"`, and `saorl train` prints where it stopped and the
`--resume` command and exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT),
as a shell reports a process the signal ended. A second signal, or `run.stop_timeout_s` passing
before the save is done, stops at once: `SignalExit` is raised in the main thread, `finally`
blocks run, nothing more is saved (the newest checkpoint stays the one to resume from).

Under torchrun every rank installs the handler and rank 0 asks every rank once per step
(`LeaderLearner.agree_stop`): the signal any rank got is all-reduced, so all stop after the same
step. Under Ray the driver (this process) handles the signal; the actors keep running until the
checkpoint is written and the driver ends them.
"""

from __future__ import annotations

import _thread
import os
import shlex
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol, Self, runtime_checkable


@runtime_checkable
class AgreesStop(Protocol):
    """A learner over several ranks (torchrun's `LeaderLearner`): `agree_stop(signum)` combines
    the signal every rank got, so that all stop after the same step."""

    def agree_stop(self, signum: int) -> int: ...


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalExit(BaseException):
    """A second signal (or the stop timeout): stop now. A BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way swallows it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _say(text: str) -> None:
    # os.write, not print: a handler may interrupt the main thread inside a print to stderr,
    # and a buffered stream entered again raises "reentrant call".
    os.write(2, (text + "\n").encode(errors="replace"))


class StopSignals:
    """Within its `with` block (main thread only), SIGTERM and SIGINT ask for a graceful stop
    (module doc); outside it, or in another thread, nothing is installed."""

    def __init__(self, timeout_s: float = 0.0, follower: bool = False) -> None:
        self.timeout_s = timeout_s
        self.follower = follower  # a torchrun rank > 0: rank 0 decides when to stop
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._timer: threading.Timer | None = None
        self._expired = False

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            if self.follower:
                return
            _say(
                f"saorl: {self.name}: finishing the step in flight, then saving a checkpoint "
                f"(a second {self.name} stops at once, without saving)"
            )
            if self.timeout_s > 0:
                self._timer = threading.Timer(self.timeout_s, self._expire)
                self._timer.daemon = True
                self._timer.start()
            return
        if self._expired:
            why = f"no checkpoint within run.stop_timeout_s = {self.timeout_s:g} s"
        else:
            why = f"a second {signal.Signals(signum).name}"
        raise SignalExit(
            f"saorl train: stopped at once ({why}); the step in flight is not saved",
            128 + self.signum,
        )

    def _expire(self) -> None:
        self._expired = True
        _thread.interrupt_main(self.signum or signal.SIGTERM)  # runs `_handle` in the main thread

    def requested(self, learner: Any = None) -> int:
        """The signal that asks for a stop (0: none). A learner that declares `agree_stop`
        (`AgreesStop`, torchrun) combines every rank's, so that all ranks stop
        after the same step."""
        mine = self.signum or 0
        got = learner.agree_stop(mine) if isinstance(learner, AgreesStop) else mine
        if got and self.signum is None:  # another rank's signal: say so here too
            self.signum = got
        return got


def stopped_message(summary: dict[str, Any]) -> str:
    """What `saorl train` prints after a run stopped by a signal: where, and how to go on."""
    run_dir = str(summary.get("run_dir", "RUN_DIR"))
    steps = summary.get("steps")
    saved = summary.get("checkpoint")
    where = f"checkpoint {saved}" if saved else "no checkpoint"
    launcher = "torchrun --nproc_per_node N -m saorl" if "LOCAL_RANK" in os.environ else "saorl"
    return (
        f"saorl train: stopped by {summary.get('signal')} after step {steps} of "
        f"{summary.get('total_steps')}; {where} in {Path(run_dir) / 'checkpoints'}\n"
        f"resume with: {launcher} train --resume {shlex.quote(run_dir)}"
    )


def exit_code(summary: dict[str, Any]) -> int:
    """128 + the number of the signal that stopped the run (0: no signal did)."""
    name = summary.get("signal")
    return 128 + signal.Signals[name] if summary.get("stopped_by") == "signal" and name else 0

"""The math grader's worker process: math-verify, run apart from the caller.

    worker = Worker()                                  # parent side (saorl.envs.math.grader)
    worker.call(verify, "\\\\sqrt{4}", "2", 5.0, wait_s=6.0)   # True, False or None
    worker.kill()

Started as `python -m saorl.envs.math.worker READ_FD WRITE_FD`, a fresh interpreter talking to
its parent over two pipes (`multiprocessing.connection.Connection`: length-framed pickles), so
it never imports the caller's `__main__`: `grade()` works from `python -c`, `python -` (stdin),
a notebook or any script, guarded by `if __name__ == "__main__":` or not (multiprocessing's
"spawn" re-runs the main module in the child and fails for those). A request is `(fn, args)`,
`fn` a module-level function the worker imports by name (`verify` here; the tests send
`time.sleep`); the reply is `("ok", value)` or `("error", text)`.

Why a process (and not a thread): sympy can run for minutes or exhaust memory on a hostile
answer (`10^{10^{10^{10}}}`), and math-verify's own timeout uses `signal.alarm`, which only
works in a main thread while rollouts grade from worker threads. The worker's main thread runs
every request, under a `setitimer` alarm the request sets itself (`verify`'s `budget_s`).

- Start-up (interpreter + sympy, about a second) caps the worker's address space at
  `WORKER_MEMORY_BYTES` (a blow-up raises MemoryError there, graded 0, instead of eating the
  host), quiets math-verify's warning about its own disabled timeouts, imports math-verify and
  reports `("ready", None)` or `("ready", "ImportError: ...")`.
- The worker ignores SIGINT (Ctrl-C in a terminal reaches the whole process group; the parent
  decides what an interrupt means) and exits when its parent's end of the pipe closes, so a
  parent that dies leaves no worker behind.
- `saorl` is put on the worker's `PYTHONPATH` from the parent's own import location, so a
  source checkout used through `sys.path` works without installing.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

_log = logging.getLogger("saorl.envs.math.grader")

WORKER_MEMORY_BYTES = 4 * 2**30
# What math-verify's fallback can pick out of an answer it cannot parse whole: a simple
# fraction (its `latexFraction` pattern) or a number.
_CANDIDATE_RE = re.compile(
    r"\\[dtc]?frac\s*\{\s*\d+(?:\.\d+)?\s*\}\s*\{\s*\d+(?:\.\d+)?\s*\}|\d+(?:\.\d+)?"
)


class WorkerTimeout(BaseException):
    """Raised by the worker's alarm; a BaseException so math-verify's `except Exception` cannot
    swallow it and carry on."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise WorkerTimeout


# --------------------------------------------------------------------------------------------
# Worker side


def _setup() -> str | None:
    """First job of a fresh worker: cap memory, quiet math-verify, import it. Error text or None."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass  # no rlimits here (some macOS): the parent's timeout still bounds time
    # We disable math-verify's alarms on purpose; its "timeout is disabled" warning is noise.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _wrap(answer: str) -> str:
    return "\\boxed{" + answer + "}"


def parse_answer(answer: str) -> list[Any]:
    """math-verify's reading of a boxed answer as a whole.

    The answer is parsed as LaTeX, whole: math-verify's default falls back, for text its LaTeX
    parser rejects, to a number or fraction in it, which would grade `1 \\oplus 2`, `1 @ 2`,
    `x \\equiv 3 \\pmod{7}` or a two-line `aligned` list as one of its numbers. That fallback is
    kept only for an answer with a single candidate in it (`\\approx 5`, `\\Rightarrow 5`,
    `\\frac{1}{2}.`), where it cannot choose among several.
    """
    from math_verify import LatexExtractionConfig, parse

    boxed = _wrap(answer)
    pred = parse(
        boxed,
        extraction_config=[LatexExtractionConfig()],
        extraction_mode="first_match",  # no retry on a part of the answer
        parsing_timeout=None,
    )
    parsed = any(not isinstance(p, str) for p in pred)
    if parsed or len(_CANDIDATE_RE.findall(answer)) > 1:
        return pred
    return parse(boxed, parsing_timeout=None)


def verify(answer: str, reference: str, budget_s: float) -> bool | None:
    """math-verify's verdict on a boxed answer, or None when the worker's own alarm fired."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    use_alarm = (
        hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        gold = parse(_wrap(reference), parsing_timeout=None)
        pred = parse_answer(answer)
        return bool(gold) and bool(pred) and bool(mv_verify(gold, pred, timeout_seconds=None))
    except WorkerTimeout:
        return None
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _serve(requests: Connection, replies: Connection) -> None:
    replies.send(("ready", _setup()))
    while True:
        try:
            fn, args = requests.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except WorkerTimeout:  # the alarm fired just after the check, in its cleanup
            reply = ("ok", None)
        except BaseException as exc:  # reported to the parent, which grades 0
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:300]}")
        try:
            replies.send(reply)
        except (BrokenPipeError, OSError):
            return


# --------------------------------------------------------------------------------------------
# Parent side


class WorkerError(RuntimeError):
    """The worker could not be started."""


class Worker:
    """One worker process; `call` runs a function in it with a deadline. Not thread-safe: the
    grader serialises calls with its own lock."""

    def __init__(self, startup_timeout_s: float) -> None:
        """Start the worker and wait for it to report (at most `startup_timeout_s`).

        Raises WorkerError when it does not start; `self.error` is the text of a failed
        math-verify import (the worker runs, the slow path is unavailable), else None.
        """
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        from saorl.security.child_python import module_argv

        try:
            # Isolated (`python -I`) with this process's saorl and import path passed along:
            # never a ./saorl of the current folder.
            self.process = subprocess.Popen(
                module_argv("saorl.envs.math.worker", str(to_worker_r), str(from_worker_w)),
                pass_fds=(to_worker_r, from_worker_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            for fd in (to_worker_r, to_worker_w, from_worker_r, from_worker_w):
                os.close(fd)
            raise WorkerError(f"math grader worker failed to start: {exc}") from exc
        os.close(to_worker_r)  # the worker's ends: closed here, so its exit is seen as EOF
        os.close(from_worker_w)
        self._requests = Connection(to_worker_w, readable=False)
        self._replies = Connection(from_worker_r, writable=False)
        reply = self._receive(startup_timeout_s)
        if reply is None or reply[0] != "ready":
            code = self.process.poll()
            self.kill()
            why = f"exit code {code}" if code is not None else f"no reply in {startup_timeout_s} s"
            raise WorkerError(
                f"math grader worker failed to start ({why}; its stderr is above, if any)"
            )
        self.error: str | None = reply[1]

    def _receive(self, wait_s: float) -> tuple[str, Any] | None:
        try:
            if self._replies.poll(max(wait_s, 0.0)):
                return self._replies.recv()
        except (EOFError, OSError):
            pass
        return None

    def call(self, fn: Any, *args: Any, wait_s: float) -> tuple[str, Any]:
        """`fn(*args)` in the worker: `("ok", value)`, `("error", text)` for an exception,
        `("timeout", None)` past `wait_s` seconds or `("died", None)` when the worker is gone;
        after those two the worker is dead (killed) and must be replaced."""
        try:
            self._requests.send((fn, args))
        except (BrokenPipeError, OSError):
            self.kill()
            return ("died", None)
        reply = self._receive(wait_s)
        if reply is not None:
            return reply
        alive = self.process.poll() is None
        self.kill()
        return ("timeout", None) if alive else ("died", None)

    def kill(self) -> None:
        """Kill the worker now (it may be stuck in C code) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        """Close this process's ends of the pipes (a forked child's copies, or after `kill`)."""
        for conn in (self._requests, self._replies):
            conn.close()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = Connection(int(argv[0]), writable=False)
    replies = Connection(int(argv[1]), readable=False)
    _serve(requests, replies)


if __name__ == "__main__":
    # Through the imported module, not this `__main__` copy: the functions the parent sends
    # are pickled by their module's name, and their exceptions must be the classes `_serve`
    # catches.
    from saorl.envs.math import worker as math_worker

    math_worker.main(sys.argv[1:])

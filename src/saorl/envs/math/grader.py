"""Grade a math answer: the response's final boxed answer against a reference, 1.0 or 0.0.

    grade("... so the answer is $\\boxed{\\dfrac{1}{2}}$.", "0.5")   # 1.0
    grade("$x = \\boxed{-2}$ and $x = \\boxed{1}$", "1, -2")      # 1.0: every item, any order
    grade_batch(responses, references)                              # [1.0, 0.0, ...]

The aim is math-verify's verdict (published MATH-500 / AIME numbers are graded with it), reached
without sympy where a string or number comparison decides, and without rewarding hedges.
Pipeline, first decisive step wins:
1. `final_answer`: the boxes of the final answer as math-verify reads them
   (`saorl.envs.math.extract`: the last `\\boxed{...}` and the boxes joined to it, such as
   `\\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}`), joined by ", " when there are several. No
   boxed answer, an empty one, a truncated one (the last box never closes) or one longer than
   `_MAX_ANSWER_CHARS` grades 0.
2. Fast path, in this process: equal after `normalize_answer` (spaces, `$`, `\\left`/`\\right`
   and `\\big`-style sizes, spacing macros, `\\text{...}`-style wrappers, the separators of a
   well-formed number such as `1,000`, `\\dfrac`) -> 1.
3. Hedge check: an answer that offers several alternatives (`1 \\text{ or } 2`, `1, 2`,
   `\\boxed{1}, \\boxed{2}`, `1 \\lor 2`; `math_normalize` lists the separators) while the
   reference is a single item grades 0. math-verify agrees for most spellings ({1, 2} is not 1)
   and reads a few as one of their values (`2 \\lor 1` as 1): grading those 1 would reward
   hedging, so they stay 0 (docs/cli.md lists every deliberate difference).
4. Fast path, numbers: two plain numbers -> equal decimals grade 1, unequal integers grade 0 (so
   AIME/GSM8K-style answers never start a worker). Anything else goes on.
5. Slow path: `math_verify.parse` + `math_verify.verify` on `\\boxed{ANSWER}` (symbolic and
   numeric equivalence, sets in any order, intervals, units) in a worker process
   (`saorl.envs.math.worker`: sympy can run for minutes or exhaust memory on a hostile answer,
   and math-verify's own timeout uses `signal.alarm`, which only works in a main thread).
   The answer is read whole (`math_worker.parse_answer`): math-verify's fallback to a number
   picked out of an answer it cannot parse is kept only where there is one candidate.

Decisions (the brief is silent on these):
- A reference that itself contains `\\boxed{...}` (a full solution) is reduced to its answer.
- `timeout_s` bounds the whole grade: the string work of steps 1-4 is linear in the input (one
  regex scan of the response, then at most `_MAX_ANSWER_CHARS` characters, a few milliseconds),
  and what it spent is taken from the math-verify budget, so a hostile answer costs its caller
  at most `timeout_s + _GRACE_S`. Not counted: waiting for the lock (below) and worker start-up.
- One worker serialised by a lock: the slow path is rare once the fast path has run, the
  project's machines have 2 cores, and a timeout kills the worker, which must not take down
  another caller's in-flight check. Waiting for the lock is bounded by the checks queued before
  (each at most its own `timeout_s + _GRACE_S`) and never costs a correct answer its grade.
- Two timeouts: inside the worker a `setitimer` alarm raises when the budget is spent
  (math-verify's own alarms are disabled so they cannot cancel it), which keeps the worker alive
  for pure-Python slowness; the parent waits `_GRACE_S` longer for the reply, and on expiry (a
  C-level big integer computation ignores signals) kills the worker and starts a fresh one on
  next use. Worker start-up (about a second: interpreter + sympy) is waited for separately
  (at most `_STARTUP_TIMEOUT_S`).
- The worker is a fresh `python -m saorl.envs.math.worker` speaking over pipes, not a
  multiprocessing "spawn" child, which re-imports the caller's `__main__`: `grade()` works from
  `python -c`, `python -` and unguarded scripts. Its address space is capped (a blow-up raises
  MemoryError there, graded 0); it exits when this process does; a forked child of this
  process starts its own.
- Without math-verify (a base dependency; a broken install) the slow path grades 0 and warns
  once.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from saorl.envs.math.extract import extract_boxed, extract_boxes
from saorl.envs.math.normalize import count_alternatives, is_set_valued, normalize_answer
from saorl.envs.math.worker import Worker, WorkerError, verify

__all__ = ["extract_boxed", "extract_boxes", "final_answer", "grade", "grade_batch", "shutdown"]

_log = logging.getLogger(__name__)

_GRACE_S = 1.0  # outer wait beyond timeout_s: lets the worker's own alarm fire first
_STARTUP_TIMEOUT_S = 120.0  # worker start-up (imports sympy + math-verify); 2 busy cores
# A longer boxed answer grades 0 unread: no final answer is this long (a 10x10 matrix of
# fractions is about 1,500 characters), and the cap bounds the work spent on hostile input.
_MAX_ANSWER_CHARS = 10_000

# --------------------------------------------------------------------------------------------
# Extraction and fast path (pure string functions)


def final_answer(text: str) -> str | None:
    """The answer `grade` grades: the final answer's boxes (`extract_boxes`), joined by ", "
    when there are several; None without one (or over `_MAX_ANSWER_CHARS`)."""
    boxes = extract_boxes(text, max_chars=_MAX_ANSWER_CHARS)
    return None if boxes is None else ", ".join(boxes)


# Unambiguous, so a failed match backtracks in linear time (`\d+\.?\d*` is quadratic). No
# trailing point: math-verify does not read `42.` as a number.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)")


def _fast_verdict(answer: str, reference: str) -> float | None:
    """1.0 / 0.0 when decidable without sympy, else None."""
    a = normalize_answer(answer)
    r = normalize_answer(reference)
    if a == r:
        return 1.0
    unions = not is_set_valued(r)
    if count_alternatives(answer, unions) > 1 and count_alternatives(reference, unions) <= 1:
        return 0.0
    if _NUMBER_RE.fullmatch(a) and _NUMBER_RE.fullmatch(r):
        try:
            if Decimal(a) == Decimal(r):
                return 1.0
        except InvalidOperation:
            return None
        # Unequal integers are decisive; unequal decimals go to math-verify, whose rounding
        # rules (e.g. 0.3333333 ~ 1/3 but not 0.33) the fast path should not second-guess.
        if "." not in a and "." not in r:
            return 0.0
    return None


# --------------------------------------------------------------------------------------------
# The worker process (saorl.envs.math.worker): started lazily, killed and replaced on timeout

_lock = threading.Lock()
_worker: Worker | None = None
_unavailable: str | None = None  # why the slow path cannot run (warned once)
_warned = False
_atexit_registered = False


def _math_verify_installed() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _warn_unavailable(reason: str) -> None:
    global _warned, _unavailable
    _unavailable = reason
    if not _warned:
        _warned = True
        warnings.warn(
            f"{reason}: answers not decided by string/number comparison are graded 0. "
            "math-verify is a dependency of saorl: reinstall it (pip install -e .)",
            RuntimeWarning,
            stacklevel=4,
        )


def _kill_worker() -> None:
    """Kill the worker now (it may be stuck in C code) and forget it. Caller holds _lock."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None:
        worker.kill()


def _get_worker() -> Worker | None:
    """The running worker, starting it if needed; None when the slow path is unavailable."""
    global _worker, _atexit_registered
    if _worker is not None:
        return _worker
    try:
        worker = Worker(_STARTUP_TIMEOUT_S)
    except WorkerError as exc:
        raise RuntimeError(str(exc)) from exc
    if not _atexit_registered:  # a worker stuck in C code must not outlive the program
        atexit.register(shutdown)
        _atexit_registered = True
    if worker.error is not None:
        worker.kill()
        _warn_unavailable(f"math-verify cannot be imported in the grader worker ({worker.error})")
        return None
    _worker = worker
    return worker


def _forget_worker_in_child() -> None:
    """After a fork: the child starts its own worker on first use. The parent's pipes are
    closed here, so the worker still sees end-of-file when the parent exits."""
    global _worker, _lock
    _lock = threading.Lock()
    worker, _worker = _worker, None
    if worker is not None:
        worker.close_pipes()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker_in_child)


def _call_in_worker(fn: Callable[..., Any], *args: Any, wait_s: float) -> Any:
    """`fn(*args)` in the worker, or None if it is unavailable, fails or outlives `wait_s`
    seconds (then the worker is killed and replaced on next use)."""
    with _lock:
        worker = _get_worker()
        if worker is None:
            return None
        status, value = worker.call(fn, *args, wait_s=wait_s)
        if status == "ok":
            return value
        if status == "timeout":
            _log.warning("math grader worker exceeded %.1f s; killed, answer graded 0", wait_s)
            _kill_worker()
        elif status == "died":
            _log.warning("math grader worker died (out of memory?); answer graded 0")
            _kill_worker()
        else:  # a grader bug must not crash a training run: log, grade 0
            _log.warning("math-verify failed (%s); answer graded 0", value)
    return None


def _slow_grade(answer: str, reference: str, budget_s: float) -> float:
    if _unavailable is None and not _math_verify_installed():
        _warn_unavailable("math-verify is not installed")
    if _unavailable is not None:
        return 0.0
    verdict = _call_in_worker(verify, answer, reference, budget_s, wait_s=budget_s + _GRACE_S)
    if verdict is None:
        _log.info("math-verify gave no verdict within %.1f s; answer graded 0", budget_s)
    return 1.0 if verdict else 0.0


def shutdown() -> None:
    """Stop the grader's worker process (it restarts on the next slow-path grade)."""
    with _lock:
        _kill_worker()


# --------------------------------------------------------------------------------------------
# Public API


def grade(response_text: str, reference: str, timeout_s: float = 5.0) -> float:
    """1.0 if the response's final boxed answer equals `reference`, else 0.0 (module doc).

    `timeout_s` bounds the whole grade (seconds; past it the answer grades 0), to within
    `_GRACE_S` for a worker that must be killed; waiting for another thread's check and worker
    start-up are not counted (module doc). Safe to call from any thread. Raises ValueError for
    an empty reference (a data error, not a wrong answer).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    deadline = time.monotonic() + timeout_s
    boxed_reference = final_answer(reference)
    reference = (boxed_reference if boxed_reference is not None else reference).strip()
    if not reference:
        raise ValueError("reference answer is empty; check the dataset's answer field")
    answer = final_answer(response_text)
    if not answer:
        return 0.0
    verdict = _fast_verdict(answer, reference)
    if verdict is not None:
        return verdict
    budget_s = deadline - time.monotonic()
    if budget_s <= 0:
        _log.info("grading used up its %.1f s before math-verify; answer graded 0", timeout_s)
        return 0.0
    return _slow_grade(answer, reference, budget_s)


def grade_batch(
    responses: Sequence[str], references: Sequence[str], timeout_s: float = 5.0
) -> list[float]:
    """`grade` for each (response, reference) pair, in order, sharing one worker process.

    Each grade gets its own `timeout_s`; checks run one at a time, so a hung answer delays the
    rest by at most `timeout_s + _GRACE_S` and never costs them their grade.
    """
    if len(responses) != len(references):
        raise ValueError(
            f"grade_batch got {len(responses)} responses but {len(references)} references"
        )
    return [grade(r, ref, timeout_s) for r, ref in zip(responses, references, strict=True)]

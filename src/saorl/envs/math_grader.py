"""Grade a math answer: the response's last `\\boxed{...}` against a reference, 1.0 or 0.0.

    grade("... so the answer is $\\boxed{\\dfrac{1}{2}}$.", "0.5")   # 1.0
    grade_batch(responses, references)                              # [1.0, 0.0, ...]

Pipeline, first decisive step wins:
1. `extract_boxed`: the LAST `\\boxed{...}` (or `\\fbox{...}`) with balanced braces. No boxed
   answer, an empty one, or a truncated one (braces never close) grades 0.
2. Hedge check: an answer that lists several alternatives ("1 or 2", "1, 2", "1; 2",
   "1 \\lor 2", "1 and 2") while the reference is a single item grades 0. math-verify alone is
   not enough here: it reads `1 \\lor 2` as `2`, so "2 \\lor 1" would pass for reference "1".
3. Fast path, in this process: equal after `normalize_answer` (spaces, `$`, `\\left`/`\\right`,
   spacing macros, `\\text{...}` wrappers, trailing `.`, `1,000` separators, `\\dfrac`) -> 1;
   two plain numbers -> equal decimals grade 1, unequal integers grade 0 (so AIME/GSM8K-style
   answers never start a worker). Anything else goes on.
4. Slow path: `math_verify.parse` + `math_verify.verify` (symbolic and numeric equivalence,
   sets, intervals, units) in a worker PROCESS, because sympy can run for minutes or exhaust
   memory on a hostile answer (`10^{10^{10^{10}}}`), and math-verify's own timeout uses
   `signal.alarm`, which only works in a main thread (DESIGN.md section 5) while rollouts grade
   from worker threads.

Decisions (the brief is silent on these):
- Several boxed answers: only the last counts, e.g. "\\boxed{1} or \\boxed{2}" is graded as "2".
  That is not a hedging loophole: the reward equals that of boxing only the last candidate, and
  penalising earlier boxes would punish legitimately boxed intermediate results.
- A reference that itself contains `\\boxed{...}` (a full solution) is reduced to that content.
- One worker (`max_workers=1`) serialised by a lock: the slow path is rare once the fast path
  has run, the project's machines have 2 cores, and a timeout kills the whole pool, which must
  not take down another caller's in-flight check. The timeout bounds one check's compute time,
  not the time spent waiting for the lock.
- Two timeouts: inside the worker a `setitimer` alarm raises at `timeout_s` (math-verify's own
  alarms are disabled so they cannot cancel it), which keeps the worker alive for pure-Python
  slowness; the parent waits `timeout_s + _GRACE_S` on the future, and on expiry (a C-level big
  integer computation ignores signals) kills the worker and starts a fresh one on next use.
  Worker start-up (about a second: interpreter + sympy) is waited for separately and never
  counted against a check's timeout.
- The worker's address space is capped at `_WORKER_MEMORY_BYTES`, so a blow-up raises
  MemoryError there (graded 0) instead of eating the host.
- The worker is started with the "spawn" context (portable, safe with threads in the parent);
  like any spawned process it imports the parent's `__main__`, so scripts need the usual
  `if __name__ == "__main__":` guard.
- Without math-verify installed the slow path grades 0 and warns once naming `saorl[math]`.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import logging
import multiprocessing
import re
import signal
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from decimal import Decimal, InvalidOperation
from typing import Any

_log = logging.getLogger(__name__)

_GRACE_S = 1.0  # outer wait beyond timeout_s: lets the worker's own alarm fire first
_STARTUP_TIMEOUT_S = 120.0  # worker start-up (imports sympy + math-verify); 2 busy cores
_WORKER_MEMORY_BYTES = 4 * 2**30

# --------------------------------------------------------------------------------------------
# Extraction and normalisation (pure string functions)

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, stripped.

    Braces are matched by depth; escaped braces (`\\{`, `\\}`) are content, not structure. Returns
    None when there is no boxed answer or when the last one never closes (a truncated response
    has no final answer; an earlier, complete box is not used in its place).
    """
    last = None
    for last in _BOXED_RE.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    start = last.end()
    depth = 1
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![A-Za-z])")
# `\\` (a row break) is matched first so that its second backslash is never read as `\ `.
_SPACING_RE = re.compile(r"\\\\|\\[!,;:> ]|\\q?quad(?![A-Za-z])")
_FRAC_RE = re.compile(r"\\[dt]frac(?![A-Za-z])")
_TEXT_RE = re.compile(r"\\(?:text|textrm|textbf|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_ALTERNATIVE_WORD_RE = re.compile(
    r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])"  # words, also from unwrapped \text{ or }
    r"|\\(?:lor|vee)(?![A-Za-z])"
)


def _strip_markup(s: str) -> str:
    """Drop presentation-only LaTeX, keeping whitespace (word boundaries matter for hedges)."""
    s = s.replace("\\$", "").replace("$", "")
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _SPACING_RE.sub(lambda m: m[0] if m[0] == "\\\\" else " ", s)
    s = _FRAC_RE.sub(r"\\frac", s)
    previous = None
    while previous != s:  # nested wrappers unwrap from the inside out
        previous, s = s, _TEXT_RE.sub(r"\1", s)
    return s.replace("{,}", ",")


def normalize_answer(answer: str) -> str:
    """Canonical string form for the fast equality check (never used to reject an answer).

    Removes whitespace, `$` (and `\\$`), `\\left`/`\\right`, `\\!`/`\\,`/`\\;`/`\\quad`,
    `\\text{...}`-style wrappers, trailing periods and thousands separators of a plain number
    (`1,000` -> `1000`; `1,00` or `1,2` are lists and stay as they are); maps `\\dfrac` and
    `\\tfrac` to `\\frac`.
    """
    s = re.sub(r"\s+", "", _strip_markup(answer)).rstrip(".")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    return s


def _count_alternatives(answer: str) -> int:
    """Top-level items of an answer: split on `,` and `;` outside brackets, and on or/and."""
    s = _strip_markup(answer)
    if _THOUSANDS_RE.fullmatch(re.sub(r"\s+", "", s)):
        return 1
    s = _ALTERNATIVE_WORD_RE.sub(";", s)
    items, depth, current = 0, 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch in ",;" and depth == 0:
            items += bool(current.strip())
            current = ""
        else:
            current += ch
    return items + bool(current.strip())


def _fast_verdict(answer: str, reference: str) -> float | None:
    """1.0 / 0.0 when decidable without sympy, else None."""
    a, r = normalize_answer(answer), normalize_answer(reference)
    if a == r:
        return 1.0
    if _count_alternatives(answer) > 1 and _count_alternatives(reference) <= 1:
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
# Worker process side


class _WorkerTimeout(BaseException):
    """Raised by the worker's alarm; a BaseException so math-verify's `except Exception` cannot
    swallow it and carry on."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _WorkerTimeout


def _worker_setup() -> str | None:
    """First job of a fresh worker: cap memory, quiet math-verify, import it. Error text or None."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass  # no rlimits here (Windows, some macOS): the outer timeout still bounds time
    # We disable math-verify's alarms on purpose; its "timeout is disabled" warning is noise.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _wrap(answer: str) -> str:
    return "\\boxed{" + answer + "}"


def _verify_in_worker(answer: str, reference: str, budget_s: float) -> bool | None:
    """math-verify's verdict, or None when the worker's own alarm fired."""
    from math_verify import parse, verify

    use_alarm = (
        hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        gold = parse(_wrap(reference), parsing_timeout=None)
        pred = parse(_wrap(answer), parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
    except _WorkerTimeout:
        _log.info("math-verify hit its %.1f s alarm; answer graded 0", budget_s)
        return None
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------------
# Parent side: one lazily started worker, killed and replaced on timeout

_lock = threading.Lock()
_pool: cf.ProcessPoolExecutor | None = None
_unavailable: str | None = None  # why the slow path cannot run (warned once)
_warned = False


def _math_verify_installed() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _warn_unavailable(reason: str) -> None:
    global _warned, _unavailable
    _unavailable = reason
    if not _warned:
        _warned = True
        warnings.warn(
            f"{reason}: answers not decided by string/number comparison are graded 0. "
            "Install the extra: pip install 'saorl[math]'",
            RuntimeWarning,
            stacklevel=4,
        )


def _kill_pool() -> None:
    """Kill the worker now (it may be stuck in C code) and forget the pool. Caller holds _lock."""
    global _pool
    pool, _pool = _pool, None
    if pool is None:
        return
    kill_workers = getattr(pool, "kill_workers", None)  # Python >= 3.14
    # Before 3.14 the executor has no public kill; `_processes` is its pid -> Process map.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    if kill_workers is not None:
        kill_workers()
    else:
        for process in processes:
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)


def _get_pool() -> cf.ProcessPoolExecutor | None:
    """The running pool, starting it if needed; None when the slow path is unavailable."""
    global _pool
    if _pool is not None:
        return _pool
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        error = pool.submit(_worker_setup).result(timeout=_STARTUP_TIMEOUT_S)
    except (cf.TimeoutError, BrokenProcessPool) as exc:
        _pool = pool
        _kill_pool()
        raise RuntimeError(
            f"math grader worker failed to start ({exc!r}). It is a spawned process, which "
            "imports the main script: guard the script's code with `if __name__ == '__main__':`"
        ) from exc
    if error is not None:
        pool.shutdown(wait=True)
        _warn_unavailable(f"math-verify cannot be imported in the grader worker ({error})")
        return None
    _pool = pool
    return pool


def _call_in_worker(fn: Callable[..., Any], *args: Any, wait_s: float) -> Any:
    """`fn(*args)` in the worker, or None if it is unavailable, fails or outlives `wait_s`
    seconds (then the worker is killed and replaced on next use)."""
    with _lock:
        pool = _get_pool()
        if pool is None:
            return None
        future = pool.submit(fn, *args)
        try:
            return future.result(timeout=wait_s)
        except cf.TimeoutError:
            _log.warning("math grader worker exceeded %.1f s; killed, answer graded 0", wait_s)
            _kill_pool()
        except BrokenProcessPool:
            _log.warning("math grader worker died (out of memory?); answer graded 0")
            _kill_pool()
        except _WorkerTimeout:  # the alarm fired just after the check, in its cleanup
            pass
        except Exception as exc:  # a grader bug must not crash a training run: log, grade 0
            _log.warning("math-verify failed (%r); answer graded 0", exc)
    return None


def _slow_grade(answer: str, reference: str, timeout_s: float) -> float:
    if _unavailable is None and not _math_verify_installed():
        _warn_unavailable("math-verify is not installed")
    if _unavailable is not None:
        return 0.0
    verdict = _call_in_worker(
        _verify_in_worker, answer, reference, timeout_s, wait_s=timeout_s + _GRACE_S
    )
    return 1.0 if verdict else 0.0


def shutdown() -> None:
    """Stop the grader's worker process (it restarts on the next slow-path grade)."""
    with _lock:
        _kill_pool()


# --------------------------------------------------------------------------------------------
# Public API


def grade(response_text: str, reference: str, timeout_s: float = 5.0) -> float:
    """1.0 if the response's last boxed answer equals `reference`, else 0.0 (see module doc).

    `timeout_s` bounds the math-verify check (seconds); past it the answer grades 0. Safe to
    call from any thread. Raises ValueError for an empty reference (a data error, not a wrong
    answer).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    boxed_reference = extract_boxed(reference)
    reference = (boxed_reference if boxed_reference is not None else reference).strip()
    if not reference:
        raise ValueError("reference answer is empty; check the dataset's answer field")
    answer = extract_boxed(response_text)
    if not answer:
        return 0.0
    verdict = _fast_verdict(answer, reference)
    if verdict is not None:
        return verdict
    return _slow_grade(answer, reference, timeout_s)


def grade_batch(
    responses: Sequence[str], references: Sequence[str], timeout_s: float = 5.0
) -> list[float]:
    """`grade` for each (response, reference) pair, in order, sharing one worker process.

    Each slow-path check gets its own `timeout_s`; checks run one at a time, so a hung answer
    delays the rest by at most `timeout_s + 1` s and never costs them their grade.
    """
    if len(responses) != len(references):
        raise ValueError(
            f"grade_batch got {len(responses)} responses but {len(references)} references"
        )
    return [grade(r, ref, timeout_s) for r, ref in zip(responses, references, strict=True)]

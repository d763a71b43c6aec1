"""Grade a math answer: the response's last `\\boxed{...}` against a reference, 1.0 or 0.0.

    grade("... so the answer is $\\boxed{\\dfrac{1}{2}}$.", "0.5")   # 1.0
    grade_batch(responses, references)                              # [1.0, 0.0, ...]

Pipeline, first decisive step wins:
1. `extract_boxed`: the LAST `\\boxed{...}` (or `\\fbox{...}`) with balanced braces. No boxed
   answer, an empty one, a truncated one (braces never close) or one longer than
   `_MAX_ANSWER_CHARS` grades 0.
2. Fast path, in this process: equal after `normalize_answer` (spaces, `$`, `\\left`/`\\right`
   and `\\big`-style sizes, spacing macros, `\\text{...}`-style wrappers, trailing `.`, `1,000`
   separators, `\\dfrac`) -> 1.
3. Hedge check: an answer that offers several alternatives (`1 \\text{ or } 2`, `1, 2`,
   `1 \\lor 2`; `math_normalize` lists the separators) while the reference is a single item
   grades 0.
4. Fast path, numbers: two plain numbers -> equal decimals grade 1, unequal integers grade 0 (so
   AIME/GSM8K-style answers never start a worker). Anything else goes on.
5. Slow path: `math_verify.parse` + `math_verify.verify` (symbolic and numeric equivalence,
   sets, intervals, units) in a worker PROCESS, because sympy can run for minutes or exhaust
   memory on a hostile answer (`10^{10^{10^{10}}}`), and math-verify's own timeout uses
   `signal.alarm`, which only works in a main thread while rollouts grade from worker threads.
   The answer is parsed as LaTeX, whole (`_parse_answer`): math-verify's default falls back,
   for text its LaTeX parser rejects, to the last number in it, which would grade `1 \\oplus 2`,
   `1 @ 2` or a two-line `aligned` list as "2". That fallback is kept only for an answer with a
   single number in it (`\\approx 5`, `\\Rightarrow 5`), where it cannot choose among candidates.
   A trailing period and a trailing modulus (`x \\equiv 3 \\pmod{7}`) are dropped first.

Decisions (the brief is silent on these):
- Several boxed answers: only the last counts, e.g. "\\boxed{1} or \\boxed{2}" is graded as "2".
  That is not a hedging loophole: the reward equals that of boxing only the last candidate, and
  penalising earlier boxes would punish legitimately boxed intermediate results.
- A reference that itself contains `\\boxed{...}` (a full solution) is reduced to that content.
- `timeout_s` bounds the whole grade: the string work of steps 1-4 is linear in the input (one
  regex scan of the response, then at most `_MAX_ANSWER_CHARS` characters, a few milliseconds),
  and what it spent is taken from the math-verify budget, so a hostile answer costs its caller
  at most `timeout_s + _GRACE_S`. Not counted: waiting for the lock (below) and worker start-up.
- One worker (`max_workers=1`) serialised by a lock: the slow path is rare once the fast path
  has run, the project's machines have 2 cores, and a timeout kills the whole pool, which must
  not take down another caller's in-flight check. Waiting for the lock is bounded by the
  checks queued before (each at most its own `timeout_s + _GRACE_S`) and never costs a correct
  answer its grade.
- Two timeouts: inside the worker a `setitimer` alarm raises when the budget is spent
  (math-verify's own alarms are disabled so they cannot cancel it), which keeps the worker alive
  for pure-Python slowness; the parent waits `_GRACE_S` longer on the future, and on expiry (a
  C-level big integer computation ignores signals) kills the worker and starts a fresh one on
  next use. Worker start-up (about a second: interpreter + sympy) is waited for separately
  (at most `_STARTUP_TIMEOUT_S`).
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
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from decimal import Decimal, InvalidOperation
from typing import Any

from saorl.envs.math_normalize import count_alternatives, is_set_valued, normalize_answer

_log = logging.getLogger(__name__)

_GRACE_S = 1.0  # outer wait beyond timeout_s: lets the worker's own alarm fire first
_STARTUP_TIMEOUT_S = 120.0  # worker start-up (imports sympy + math-verify); 2 busy cores
_WORKER_MEMORY_BYTES = 4 * 2**30
# A longer boxed answer grades 0 unread: no final answer is this long (a 10x10 matrix of
# fractions is about 1,500 characters), and the cap bounds the work spent on hostile input.
_MAX_ANSWER_CHARS = 10_000

# --------------------------------------------------------------------------------------------
# Extraction and fast path (pure string functions)

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character is content


def extract_boxed(text: str, max_chars: int | None = None) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, stripped.

    Braces are matched by depth; escaped braces (`\\{`, `\\}`) are content, not structure. Returns
    None when there is no boxed answer, when the last one never closes (a truncated response
    has no final answer; an earlier, complete box is not used in its place) or when its content
    is longer than `max_chars` (the scan stops there).
    """
    last = None
    for last in _BOXED_RE.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    start = last.end()
    end = len(text) if max_chars is None else min(len(text), start + max_chars + 1)
    depth = 1
    for brace in _BRACE_RE.finditer(text, start, end):
        if brace[0] == "{":
            depth += 1
        elif brace[0] == "}":
            depth -= 1
            if depth == 0:
                return text[start : brace.start()].strip()
    return None


# Unambiguous, so a failed match backtracks in linear time (`\d+\.?\d*` is quadratic).
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def _fast_verdict(answer: str, reference: str) -> float | None:
    """1.0 / 0.0 when decidable without sympy, else None."""
    a, r = normalize_answer(answer), normalize_answer(reference)
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


_NUMBER_LITERAL_RE = re.compile(r"\d+(?:\.\d+)?")
# A trailing modulus, as in `x \equiv 3 \pmod{7}`: context, not part of the value. Possessive
# quantifiers: no backtracking over long runs of spaces.
_MODULUS_RE = re.compile(r"\\[pb]?mod(?![A-Za-z])\s*+(?:\{\s*+\d++\s*+\}|\d++)\s*+\)?$")


def _parse_answer(answer: str) -> list[Any]:
    """math-verify's reading of the answer as a whole (module doc, step 5).

    Dropped first: a trailing period (`\\frac{1}{2}.` does not parse) and a trailing modulus
    (`\\pmod{7}`, `(\\bmod 7)`), whose number would otherwise count as a second candidate.
    """
    from math_verify import LatexExtractionConfig, parse

    answer = answer.rstrip().rstrip(".")
    modulus = _MODULUS_RE.search(answer)
    if modulus is not None:
        answer = answer[: modulus.start()].rstrip().removesuffix("(").rstrip()
    boxed = _wrap(answer)
    pred = parse(
        boxed,
        extraction_config=[LatexExtractionConfig()],
        extraction_mode="first_match",  # no retry on a part of the answer
        parsing_timeout=None,
    )
    parsed = any(not isinstance(p, str) for p in pred)
    if parsed or len(_NUMBER_LITERAL_RE.findall(answer)) > 1:
        return pred
    return parse(boxed, parsing_timeout=None)


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
        pred = _parse_answer(answer)
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


def _slow_grade(answer: str, reference: str, budget_s: float) -> float:
    if _unavailable is None and not _math_verify_installed():
        _warn_unavailable("math-verify is not installed")
    if _unavailable is not None:
        return 0.0
    verdict = _call_in_worker(
        _verify_in_worker, answer, reference, budget_s, wait_s=budget_s + _GRACE_S
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

    `timeout_s` bounds the whole grade (seconds; past it the answer grades 0), to within
    `_GRACE_S` for a worker that must be killed; waiting for another thread's check and worker
    start-up are not counted (module doc). Safe to call from any thread. Raises ValueError for
    an empty reference (a data error, not a wrong answer).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    deadline = time.monotonic() + timeout_s
    boxed_reference = extract_boxed(reference)
    reference = (boxed_reference if boxed_reference is not None else reference).strip()
    if not reference:
        raise ValueError("reference answer is empty; check the dataset's answer field")
    answer = extract_boxed(response_text, max_chars=_MAX_ANSWER_CHARS)
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

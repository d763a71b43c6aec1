"""The math grader: boxed extraction, fast paths, math-verify in a worker process, timeouts.

One worker process serves the whole file (started by the first slow-path case, about a second);
the module fixture stops it at the end.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
import warnings
from collections.abc import Iterator

import pytest

from saorl.envs import math_grader
from saorl.envs.math_grader import extract_boxed, grade, grade_batch, normalize_answer

needs_math_verify = pytest.mark.skipif(
    not math_grader._math_verify_installed(),
    reason="math-verify not installed: pip install 'saorl[math]'",
)


@pytest.fixture(scope="module", autouse=True)
def _stop_worker_at_end() -> Iterator[None]:
    yield
    math_grader.shutdown()


# ---------------------------------------------------------------------------------------------
# Extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is $\\boxed{42}$.", "42"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("\\boxed{ {a}^{ {b} } }", "{a}^{ {b} }"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # last wins
        ("\\boxed{1} and \\fbox{3}", "3"),
        ("\\boxed {7}", "7"),  # TeX allows a space before the argument
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are content
        ("\\boxed{a \\\\}", "a \\\\"),  # a row break `\\` then the closing brace
        ("no box here: 42", None),
        ("\\boxed{5} then a truncated \\boxed{12", None),  # last box never closes
        ("mention \\boxed without braces", None),
        ("\\boxed{}", ""),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_normalize_answer() -> None:
    assert normalize_answer("$\\left( 3, \\dfrac{\\pi}{2} \\right)$.") == "(3,\\frac{\\pi}{2})"
    assert normalize_answer("1,000,000") == "1000000"
    assert normalize_answer("1{,}000") == normalize_answer("1\\,000") == "1000"
    assert normalize_answer("1,00") == "1,00"  # not a thousands pattern: a list
    assert normalize_answer("\\text{\\textbf{Evelyn}}\\!") == "Evelyn"
    assert normalize_answer("\\$18.") == "18"
    assert normalize_answer("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}") == (
        "\\begin{pmatrix}1\\\\2\\end{pmatrix}"
    )


# ---------------------------------------------------------------------------------------------
# The grading table. Cases decided by the fast path need no worker; the rest use math-verify.

EQUIVALENT = [
    # integers, signs, thousands separators, currency
    ("\\boxed{42}", "42"),
    ("The answer is $\\boxed{ 42 }$.", "42"),
    ("\\boxed{-7}", "-7"),
    ("\\boxed{042}", "42"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{1000}", "1,000"),
    ("\\boxed{1{,}234{,}567}", "1234567"),
    ("\\boxed{\\$18}", "18"),
    # decimals
    ("\\boxed{18.00}", "18"),
    ("\\boxed{0.50}", ".5"),
    ("\\boxed{3.50.}", "3.5"),
    # fractions
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{\\frac12}", "1/2"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{-\\frac{1}{2}}", "-0.5"),
    ("\\boxed{1.5}", "3/2"),
    # radicals, pi, expressions
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{\\frac{\\sqrt{3}}{\\sqrt{4}}}", "\\frac{\\sqrt{3}}{2}"),  # nested braces
    ("\\boxed{2\\pi}", "\\pi \\cdot 2"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{x = 5}", "5"),
    # tuples, sets, intervals, matrices
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})"),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{2, 1}", "1, 2"),
    ("\\boxed{\\{1, 2\\}}", "1, 2"),
    ("\\boxed{x = 1 \\text{ or } x = 2}", "1, 2"),  # the reference lists two answers too
    ("\\boxed{(1,2]}", "(1, 2]"),
    ("\\boxed{(2, \\infty) \\cup (-\\infty, 1)}", "(-\\infty,1)\\cup(2,\\infty)"),
    ("\\boxed{x \\in [1, 2]}", "[1,2]"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    # text and units
    ("\\boxed{5\\text{ cm}}", "5"),
    ("\\boxed{10 \\text{ dollars}}", "10"),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"),
    ("\\boxed{90^\\circ}", "90"),
    # several boxes: only the last counts (documented in the module: no hedging loophole)
    ("first \\boxed{3}, so finally \\boxed{5}", "5"),
    ("\\boxed{2} or \\boxed{1}", "1"),
    ("\\fbox{7}", "7"),
    # a reference given as a whole solution is reduced to its boxed answer
    ("\\boxed{4}", "so the total is $\\boxed{4}$."),
]

NOT_EQUIVALENT = [
    ("\\boxed{41}", "42"),
    ("\\boxed{1,000}", "1"),
    ("\\boxed{2.5}", "2.4"),
    ("\\boxed{0.33}", "\\frac{1}{3}"),
    ("\\boxed{\\frac{1}{3}}", "0.5"),
    ("\\boxed{\\pi}", "3.14"),
    ("\\boxed{\\sqrt{2}}", "2"),
    ("\\boxed{x+1}", "x+2"),
    ("\\boxed{[1,2)}", "(1,2)"),
    ("\\boxed{1, 3}", "1, 2"),
    ("\\boxed{1, 2, 3}", "1, 2"),
    ("\\boxed{5\\text{ cm}}", "6"),
    ("\\boxed{\\text{Devon}}", "\\text{Evelyn}"),
    # no (usable) boxed answer
    ("42", "42"),
    ("The answer is 42.", "42"),
    ("\\boxed{}", "42"),
    ("\\boxed{42", "42"),
    # hedges: several alternatives for a single-answer reference
    ("\\boxed{1 or 2}", "1"),
    ("\\boxed{1, 2}", "1"),
    ("\\boxed{1 \\text{ or } 2}", "1"),
    ("\\boxed{2 \\lor 1}", "1"),  # math-verify alone reads `2 \lor 1` as 1
    ("\\boxed{1; 2}", "1"),
    ("\\boxed{1 \\text{ and } 2}", "1"),
    ("\\boxed{\\{1, 2\\}}", "1"),
    ("\\boxed{1} or \\boxed{2}", "1"),  # last box wins
]


@needs_math_verify
@pytest.mark.parametrize(("response", "reference"), EQUIVALENT)
def test_equivalent(response: str, reference: str) -> None:
    assert grade(response, reference) == 1.0


@needs_math_verify
@pytest.mark.parametrize(("response", "reference"), NOT_EQUIVALENT)
def test_not_equivalent(response: str, reference: str) -> None:
    assert grade(response, reference) == 0.0


def test_fast_path_needs_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*args: object) -> float:
        raise AssertionError("the slow path was used")

    monkeypatch.setattr(math_grader, "_slow_grade", no_worker)
    cases = [
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("\\boxed{18.0}", "18", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1 or 2}", "1", 0.0),
        ("no box", "1", 0.0),
    ]
    assert [grade(r, ref) for r, ref, _ in cases] == [g for *_, g in cases]


# ---------------------------------------------------------------------------------------------
# The worker process: threads, batches, timeouts, missing math-verify


@needs_math_verify
def test_grade_batch_and_threads() -> None:
    responses = ["\\boxed{\\frac{1}{2}}", "\\boxed{3}", "none", "\\boxed{\\sqrt{8}}"]
    references = ["0.5", "4", "1", "2\\sqrt{2}"]
    assert grade_batch(responses, references) == [1.0, 0.0, 0.0, 1.0]
    # math-verify's own timeout needs the main thread; ours runs it in the worker's main thread.
    with cf.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(grade, responses, references)) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        grade_batch(["a", "b"], ["a"])


@needs_math_verify
def test_pathological_input_is_graded_zero_within_the_timeout() -> None:
    grade("\\boxed{\\frac{1}{2}}", "0.5")  # worker started outside the timed part
    timeout_s = 2.0
    start = time.monotonic()
    assert grade("\\boxed{10^{10^{10^{10}}}}", "1", timeout_s=timeout_s) == 0.0
    assert time.monotonic() - start < timeout_s + 3
    start = time.monotonic()
    assert grade("\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "1", timeout_s=timeout_s) == 0.0
    assert time.monotonic() - start < timeout_s + 3
    assert grade("\\boxed{\\sqrt{4}}", "2.0") == 1.0  # the grader still works afterwards


@needs_math_verify
def test_stuck_worker_is_killed_and_replaced() -> None:
    # A job that ignores the worker's alarm, like a C-level big-integer computation.
    grade("\\boxed{\\frac{1}{2}}", "0.5")
    start = time.monotonic()
    assert math_grader._call_in_worker(time.sleep, 60, wait_s=0.5) is None
    assert time.monotonic() - start < 3.5
    assert math_grader._pool is None  # killed; the next slow grade starts a fresh worker
    assert grade("\\boxed{\\frac{3}{4}}", "0.75") == 1.0


def test_missing_math_verify_grades_zero_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_grader, "_math_verify_installed", lambda: False)
    monkeypatch.setattr(math_grader, "_unavailable", None)
    monkeypatch.setattr(math_grader, "_warned", False)
    with pytest.warns(RuntimeWarning, match=r"math-verify is not installed.*saorl\[math\]"):
        assert grade("\\boxed{\\frac{1}{2}}", "0.5") == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert grade("\\boxed{\\frac{1}{4}}", "0.25") == 0.0
        assert grade("\\boxed{7}", "7") == 1.0  # the fast path still works


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="reference answer is empty"):
        grade("\\boxed{1}", "  ")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        grade("\\boxed{1}", "1", timeout_s=0)

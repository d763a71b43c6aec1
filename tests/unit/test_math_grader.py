"""The math grader: boxed extraction, fast paths, math-verify in a worker process, timeouts.

One worker process serves the whole file (started by the first slow-path case, about a second);
the module fixture stops it at the end.
"""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from saorl.envs.math import grader as math_grader
from saorl.envs.math.extract import extract_boxes
from saorl.envs.math.grader import extract_boxed, grade, grade_batch
from saorl.envs.math.normalize import count_alternatives, normalize_answer

needs_math_verify = pytest.mark.skipif(
    not math_grader._math_verify_installed(),
    reason="math-verify not installed (a base dependency: pip install -e .)",
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


def test_extract_boxed_stops_at_max_chars() -> None:
    assert extract_boxed("\\boxed{ 12345 }", max_chars=7) == "12345"
    assert extract_boxed("\\boxed{ 12345 }", max_chars=6) is None
    assert extract_boxed("\\boxed{" + "{" * 10**6, max_chars=10) is None


def test_normalize_answer() -> None:
    assert normalize_answer("$\\left( 3, \\dfrac{\\pi}{2} \\right)$") == "(3,\\frac{\\pi}{2})"
    assert normalize_answer("1,000,000") == "1000000"
    assert normalize_answer("1{,}000") == normalize_answer("\\$1,\\!000") == "1000"
    assert normalize_answer("11,\\! 111,\\! 100") == "11111100"  # `\\!` then a TeX space
    # A separator counts only in a well-formed number: groups of three, no space around it.
    assert normalize_answer("1,00") == "1,00"  # a list
    assert normalize_answer("32, 349") == "32,349"  # a list, never 32349
    assert normalize_answer("32 349") == normalize_answer("32\\,349") == "32 349"  # two numbers
    assert normalize_answer("x + 2 = 3") == "x+2=3"
    assert normalize_answer("\\text{\\textbf{Evelyn}}\\!") == "Evelyn"
    assert normalize_answer("\\$18.") == "18."  # math-verify does not read `18.` as 18
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
    ("\\boxed{1,500 \\text{ dollars}}", "1500"),  # a thousands separator is not a list
    ("\\boxed{32,349}", "32349"),
    ("\\boxed{\\$32,\\!348}", "32348"),
    ("\\boxed{32348}", "\\$32,\\!348"),
    ("\\boxed{11,\\! 111,\\! 111,\\! 100}", "11111111100"),
    ("\\boxed{\\$18}", "18"),
    # decimals
    ("\\boxed{18.00}", "18"),
    ("\\boxed{0.50}", ".5"),
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
    # separators that are structure, not alternatives: a union answering a set-valued
    # reference, `&` and `\\` inside a matrix, absolute-value bars
    ("\\boxed{[1,2) \\cup [2,3]}", "[1,3]"),
    ("\\boxed{\\{1\\} \\cup \\{2\\}}", "\\{1, 2\\}"),
    (
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
    ),
    ("\\boxed{|1-x|}", "|x-1|"),
    ("\\boxed{\\left| -3 \\right|}", "3"),
    ("\\boxed{\\lvert -3 \\rvert}", "3"),
    # one number (or simple fraction) in an answer math-verify parses only in part
    ("\\boxed{\\approx 5}", "5"),
    ("\\boxed{\\Rightarrow 5}", "5"),
    ("\\boxed{\\frac{1}{2}.}", "0.5"),
    ("\\boxed{x = \\frac{1}{2}.}", "0.5"),
    # text and units
    ("\\boxed{5\\text{ cm}}", "5"),
    ("\\boxed{10 \\text{ dollars}}", "10"),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"),
    ("\\boxed{90^\\circ}", "90"),
    # an earlier box far from the last one is an intermediate result
    ("first \\boxed{3}. " + "Checking it once more by substitution, " * 3 + "\\boxed{5}", "5"),
    ("\\boxed{5} \\boxed{5}", "5"),  # a repeated box counts once
    ("\\fbox{7}", "7"),
    # a reference given as a whole solution is reduced to its boxed answer
    ("\\boxed{4}", "so the total is $\\boxed{4}$."),
]

NOT_EQUIVALENT = [
    ("\\boxed{41}", "42"),
    ("\\boxed{1,000}", "1"),
    # a separator only counts in a well-formed number: these are lists or products
    ("\\boxed{32, 349}", "32349"),
    ("\\boxed{32 349}", "32349"),
    ("\\boxed{32\\,349}", "32349"),
    ("\\boxed{3,2349}", "32349"),
    # a trailing point inside the box: math-verify reads neither as a number
    ("\\boxed{42.}", "42"),
    ("\\boxed{3.50.}", "3.5"),
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
    ("\\boxed{1} or \\boxed{2}", "1"),  # boxes of one answer: two values
    ("\\boxed{2} or \\boxed{1}", "1"),
    ("$\\boxed{1}$ or $\\boxed{2}$", "1"),
    ("first \\boxed{3}, so finally \\boxed{5}", "5"),
    ("\\boxed{1 \\pm 2}", "3"),  # math-verify reads the set {-1, 3}
    # other spellings of a disjunction (math-verify reads each of these as the last number)
    ("\\boxed{{1 \\lor 2}}", "2"),
    ("\\boxed{1 \u2228 2}", "2"),
    ("\\boxed{1 \\operatorname{or} 2}", "2"),
    ("\\boxed{1 \\textsf{or} 2}", "2"),
    ("\\boxed{1 \\cup 2}", "2"),
    ("\\boxed{1 \\mid 2}", "2"),
    ("\\boxed{1 \\\\ 2}", "2"),
    ("\\boxed{1 | 2}", "2"),
    ("\\boxed{1 \\| 2}", "2"),
    ("\\boxed{1 \\land 2}", "2"),
    ("\\boxed{2^{1 \\lor 2}}", "2"),
    # an answer math-verify cannot parse is not graded by a number picked out of it
    ("\\boxed{1 \\oplus 2}", "2"),
    ("\\boxed{1 \\to 2}", "2"),
    ("\\boxed{1 \\sim 2}", "2"),
    ("\\boxed{1 \\cap 2}", "2"),
    ("\\boxed{1 \\setminus 2}", "2"),
    ("\\boxed{1 @ 2}", "2"),
    ("\\boxed{x^2 \\foo 7}", "7"),
    ("\\boxed{x \\equiv 3 \\pmod{7}}", "3"),  # math-verify takes the 3, by its position
    ("\\boxed{3 \\pmod 7}", "3"),
    ("\\boxed{\\begin{aligned} x &= 1 \\\\ x &= 2 \\end{aligned}}", "2"),
    ("\\boxed{\\begin{cases} 1 \\\\ 2 \\end{cases}}", "2"),
]


@needs_math_verify
@pytest.mark.parametrize(("response", "reference"), EQUIVALENT)
def test_equivalent(response: str, reference: str) -> None:
    assert grade(response, reference) == 1.0


@needs_math_verify
@pytest.mark.parametrize(("response", "reference"), NOT_EQUIVALENT)
def test_not_equivalent(response: str, reference: str) -> None:
    assert grade(response, reference) == 0.0


# Several items in the reference: each boxed on its own, or together in another order, as
# math-verify grades them. Boxes of one answer are read as math-verify reads them (module doc of
# saorl.envs.math.extract).
MULTI_PART = [
    ("\\boxed{(1, 2)}, \\boxed{(2, 1)}", "(2,1),(1,2)", 1.0),
    ("\\boxed{(1, 2), (2, 1)}", "(2,1),(1,2)", 1.0),
    ("so $\\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}$.", "1,-2", 1.0),
    ("\\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}", "1,-2", 1.0),
    ("The roots are $x = \\boxed{-2}$ and $x = \\boxed{1}$.", "-2, 1", 1.0),
    ("\\[\\boxed{3}, \\boxed{5}, \\boxed{7}\\]", "3, 5, 7", 1.0),
    ("\\boxed{7, 3, 5}", "3, 5, 7", 1.0),
    ("\\boxed{\\{7, 3, 5\\}}", "3, 5, 7", 1.0),
    ("\\boxed{1 + \\sqrt{19}} \\text{ and } \\boxed{1 - \\sqrt{19}}", "1 \\pm \\sqrt{19}", 1.0),
    ("\\boxed{x = 1}, \\boxed{y = 2}", "x = 1, y = 2", 1.0),
    # a missing or a wrong item
    ("\\boxed{(1, 2)}", "(2,1),(1,2)", 0.0),
    ("\\boxed{-2} \\quad\\text{and}\\quad \\boxed{2}", "1,-2", 0.0),
    ("\\boxed{3}, \\boxed{5}", "3, 5, 7", 0.0),
    # environments joined by `\\text{ and }` are not one answer for math-verify: the last counts
    ("$\\boxed{-2}$ \\text{ and } $\\boxed{1}$", "1,-2", 0.0),
    # the hedge rule: several different boxed values for a single-item reference
    ("\\boxed{1}, \\boxed{2}", "1", 0.0),
    ("\\boxed{2} \\quad\\text{or}\\quad \\boxed{1}", "1", 0.0),
]


@needs_math_verify
@pytest.mark.parametrize(("response", "reference", "expected"), MULTI_PART)
def test_multi_part_answers(response: str, reference: str, expected: float) -> None:
    assert grade(response, reference) == expected


@pytest.mark.parametrize(
    ("text", "boxes"),
    [
        ("\\boxed{1}, \\boxed{2}", ["1", "2"]),
        ("\\boxed{1}\\boxed{1}", ["1"]),  # a repeat counts once
        ("\\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}", ["-2", "1"]),
        ("$x = \\boxed{-2}$ and $x = \\boxed{1}$.", ["-2", "1"]),
        ("$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$.", ["1", "2", "3"]),
        ("\\[\\boxed{1} \\text{ and, after a long detour, } \\boxed{2}\\]", ["1", "2"]),
        ("$\\boxed{1}$ \\text{ and } $\\boxed{2}$", ["2"]),  # not math-verify's join
        ("$\\boxed{1}$ is one; also $\\boxed{2}$", ["2"]),
        ("\\boxed{1} then " + "x" * 80 + " \\boxed{2}", ["2"]),  # far apart: intermediate
        ("\\boxed{1} " + "x" * 20 + " \\boxed{2}", ["2"]),  # no separator in between
        ("\\boxed{1} and so on " + "x" * 20 + " \\boxed{2}", ["1", "2"]),
        ("\\boxed{1} and so on " + "x" * 20 + " \\boxed{1}", ["1"]),
        ("\\boxed{1}, \\boxed{2", None),  # the last box never closes
        ("no box", None),
    ],
)
def test_extract_boxes(text: str, boxes: list[str] | None) -> None:
    assert extract_boxes(text) == boxes


def test_extract_boxes_caps_the_answer() -> None:
    many = ", ".join(f"\\boxed{{{i}}}" for i in range(3000))
    assert len(extract_boxes(many)) == 3000
    assert extract_boxes(many, max_chars=1000) is None
    assert extract_boxes("\\boxed{1}" * 50_000, max_chars=10) == ["1"]


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


# Every way of writing "a or b" (and the list separators) that the hedge check must see, in any
# amount of redundant braces. Each one is decided by the fast path, without math-verify.
HEDGE_SEPARATORS = [
    # disjunctions: a hedge wherever they stand, even inside an argument
    "or",
    "\\lor",
    "\\vee",
    "\u2228",  # ∨
    "\\text{or}",
    "\\text{ or }",
    "\\textbf{or}",
    "\\textsf{or}",
    "\\mathrm{or}",
    "\\operatorname{or}",
    "\\hbox{ or }",
    "\\;\\text{or}\\;",
    "\\quad\\text{or}\\quad",
    "\\text{ and/or }",
    # list separators: alternatives at the top level only
    ",",
    ";",
    "and",
    "\\text{ and }",
    "\\land",
    "\\wedge",
    "\u2227",  # ∧
    "\\&",
    "&",
    "\\cup",
    "\u222a",  # ∪
    "\\mid",
    "\\\\",
    "\\newline",
    "\\cr",
    "|",
    "\\vert",
    "\\|",
    "\\parallel",
]


@settings(max_examples=400, deadline=None)
@given(
    separator=st.sampled_from(HEDGE_SEPARATORS),
    first=st.integers(0, 99),
    second=st.integers(0, 99),
    braces=st.integers(0, 3),
    space=st.sampled_from(["", " "]),
)
def test_hedges_grade_zero_in_every_spelling(
    separator: str, first: int, second: int, braces: int, space: str
) -> None:
    assume(first != second)
    hedge = f"{first}{space}{separator}{space}{second}"
    answer = "{" * braces + hedge + "}" * braces
    for reference in (str(first), str(second)):
        assert math_grader._fast_verdict(answer, reference) == 0.0
    assert math_grader._fast_verdict(f"either {first} or {second}", str(second)) == 0.0


def _single_answers() -> st.SearchStrategy[str]:
    """LaTeX for one value, set or interval: fractions, roots, powers, absolute values, norms,
    tuples, set-builder sets, matrices, redundant braces, wrappers and sizes."""
    leaf = st.one_of(
        st.integers(-999, 999).map(str),
        st.sampled_from(["x", "\\pi", "\\infty", "0.5", "1,000", "\\text{cm}", "e"]),
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        pair = st.tuples(inner, inner)
        return st.one_of(
            pair.map(lambda p: f"\\frac{{{p[0]}}}{{{p[1]}}}"),
            pair.map(lambda p: f"{p[0]}^{{{p[1]}}}"),
            pair.map(lambda p: f"{p[0]} + {p[1]}"),
            pair.map(lambda p: f"{p[0]} \\cdot {p[1]}"),
            pair.map(lambda p: f"({p[0]}, {p[1]}]"),
            pair.map(lambda p: f"\\{{x \\mid {p[0]} < x \\text{{ and }} x < {p[1]}\\}}"),
            pair.map(lambda p: f"\\begin{{pmatrix}} {p[0]} & {p[1]} \\\\ {p[1]} \\end{{pmatrix}}"),
            pair.map(lambda p: f"|{p[0]}| - \\|{p[1]}\\|"),
            pair.map(lambda p: f"\\sqrt[{p[0]}]{{{p[1]}}}"),
            inner.map(lambda e: f"\\left| {e} \\right|"),
            inner.map(lambda e: f"\\bigl( {e} \\bigr)"),
            inner.map(lambda e: f"{{{e}}}"),
            inner.map(lambda e: f"\\mathbf{{{e}}}"),
            inner.map(lambda e: f"-{e}"),
        )

    return st.recursive(leaf, extend, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(answer=_single_answers())
@example(answer="\\left| 1,000 - x \\right| + 2,000")
@example(answer="\\{x \\mid 0 < x \\text{ and } x < 1\\}")
def test_single_answers_are_one_item(answer: str) -> None:
    assert count_alternatives(answer) == 1
    assert math_grader._fast_verdict(answer, "y") is None  # not rejected: math-verify decides


@pytest.mark.parametrize(
    ("answer", "items"),
    [
        # structure, not alternatives: one item each
        ("\\{x \\mid x > 1 \\text{ and } x < 3\\}", 1),  # set-builder
        ("P(A \\mid B)", 1),
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", 1),
        ("\\begin{cases} 1 & x < 0 \\\\ 2 & x \\ge 0 \\end{cases}", 1),
        ("|x - 1| + |x|", 1),
        ("\\left| x \\right|", 1),
        ("\\|v\\|", 1),
        ("\\frac{1}{2}", 1),
        ("\\sqrt[3]{2}", 1),
        ("a_{1,2}", 1),
        ("\\binom{5}{2}", 1),
        ("1,000", 1),
        ("1,000 + 2,000", 1),
        ("\\text{color}", 1),
        ("(1, 2]", 1),
        ("1/2", 1),  # a fraction: math-verify grades it by its value
        # alternatives
        ("{1 \\lor 2}", 2),
        ("{{1, 2}}", 2),
        ("\\sqrt{1 \\lor 16}", 2),
        ("\\text{1 or more}", 2),
        ("1 \\\\ 2 \\\\ 3", 3),
        ("1 | 2", 2),
        ("OR", 1),  # capitals are point names (a segment OR), not the word
    ],
)
def test_count_alternatives(answer: str, items: int) -> None:
    assert count_alternatives(answer) == items


def test_union_is_an_alternative_only_when_the_reference_is_not_a_set() -> None:
    hedge = "(-\\infty, 1) \\cup (2, \\infty)"
    assert math_grader._fast_verdict(hedge, "2") == 0.0
    assert math_grader._fast_verdict(hedge, "(-\\infty, 1)\\cup(2,\\infty)") == 1.0
    assert math_grader._fast_verdict(hedge, "(-\\infty, 1]") is None  # math-verify decides
    assert math_grader._fast_verdict("\\{1\\} \\cup \\{2\\}", "\\{1, 2\\}") is None
    assert math_grader._fast_verdict("x \\in [1,2) \\cup [2,3]", "x \\in [1, 3]") is None


# Inputs on which a quadratic string scan takes minutes. Each is far over the length of a real
# answer; the bound is generous, it only tells linear from quadratic.
PATHOLOGICAL = {
    "nested \\text": "\\text{" * 14_000 + "x" + "}" * 14_000,
    "open braces": "{" * 100_000,
    "balanced braces": "{" * 50_000 + "}" * 50_000,
    "nested \\frac": "\\frac{" * 20_000 + "1" + "}{2}" * 20_000,
    "unclosed \\text": "\\text{a" * 20_000,
    "digits then a letter": "1" * 100_000 + "x",
    "thousands then a letter": "1" + ",000" * 30_000 + "x",
    "separators": "1 \\lor " * 20_000,
}


@pytest.mark.parametrize("text", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_string_functions_are_linear(text: str) -> None:
    start = time.monotonic()
    normalize_answer(text)
    count_alternatives(text)
    math_grader._fast_verdict(text, "1")
    extract_boxed("\\boxed{" + text + "}")
    assert time.monotonic() - start < 5.0


# Responses with very many boxes, environments and dollar signs for the final-answer reading.
MANY_BOXES = {
    "joined environments": "$\\boxed{1}$ and " * 20_000 + "$\\boxed{2}$",
    "one environment": "\\[" + "\\boxed{1} " * 50_000 + "\\]",
    "near boxes": "\\boxed{1}, \\boxed{2}" * 25_000,
    "dollar signs": "\\$ " * 50_000 + "$\\boxed{1}$ " + "\\$" * 50_000,
    "unclosed boxes": "\\boxed{" * 50_000 + "\\boxed{1}",
    "boxes in boxes": "\\boxed{" * 20_000 + "1" + "}" * 20_000,
}


@pytest.mark.parametrize("text", MANY_BOXES.values(), ids=MANY_BOXES.keys())
def test_final_answer_reading_is_linear(text: str) -> None:
    start = time.monotonic()
    extract_boxes(text)
    math_grader.final_answer(text)
    assert time.monotonic() - start < 5.0


def test_timeout_bounds_the_whole_grade(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever the fast path spent is taken from math-verify's budget, not added to it.
    fast_verdict = math_grader._fast_verdict
    budgets: list[float] = []

    def slow_fast_path(answer: str, reference: str) -> float | None:
        time.sleep(0.5)
        return fast_verdict(answer, reference)

    def record_budget(fn: object, *args: object, wait_s: float) -> None:
        budgets.append(wait_s)

    monkeypatch.setattr(math_grader, "_fast_verdict", slow_fast_path)
    monkeypatch.setattr(math_grader, "_call_in_worker", record_budget)
    monkeypatch.setattr(math_grader, "_math_verify_installed", lambda: True)
    monkeypatch.setattr(math_grader, "_unavailable", None)
    assert grade("\\boxed{\\sqrt{4}}", "2", timeout_s=2.0) == 0.0  # the recorder says None
    assert len(budgets) == 1 and budgets[0] <= 2.0 - 0.5 + math_grader._GRACE_S
    start = time.monotonic()
    assert grade("\\boxed{\\sqrt{4}}", "2", timeout_s=0.3) == 0.0  # nothing left for the check
    assert time.monotonic() - start < 0.3 + 0.5
    assert len(budgets) == 1


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


HOSTILE_RESPONSES = {
    **{name: "\\boxed{" + text + "}" for name, text in PATHOLOGICAL.items()},
    # under the answer-length limit, so math-verify gets them
    "nested \\text, short": "\\boxed{" + "\\text{" * 1_500 + "x" + "}" * 1_500 + "}",
    "nested \\frac, short": "\\boxed{" + "\\frac{" * 900 + "1" + "}{2}" * 900 + "}",
    "nested \\sqrt": "\\boxed{" + "\\sqrt{" * 1_500 + "2" + "}" * 1_500 + "}",
    "nested parentheses": "\\boxed{" + "(" * 4_000 + "1" + ")" * 4_000 + "}",
    "power tower": "\\boxed{" + "x^{" * 2_000 + "x" + "}" * 2_000 + "}",
    "balanced braces, short": "\\boxed{" + "{" * 4_000 + "2" + "}" * 4_000 + "}",
    "10^{10^{10}}": "\\boxed{10^{10^{10}}}",
    "9^{9^{9}}": "\\boxed{9^{9^{9}}}",
    "9**9**9": "\\boxed{9**9**9}",
    "9**9**9**9": "\\boxed{9**9**9**9}",
    "(9!)!!": "\\boxed{(9!)!!}",
    "long decimal": "\\boxed{" + "9" * 4_000 + "." + "9" * 4_000 + "}",
    "many boxes": "\\boxed{1}" * 50_000,
}


@needs_math_verify
@pytest.mark.parametrize("response", HOSTILE_RESPONSES.values(), ids=HOSTILE_RESPONSES.keys())
def test_hostile_answers_grade_zero_within_the_timeout(response: str) -> None:
    grade("\\boxed{\\frac{1}{2}}", "0.5")  # a worker killed by the previous case restarts here
    timeout_s = 1.0
    start = time.monotonic()
    assert grade(response, "1.5", timeout_s=timeout_s) == 0.0
    assert time.monotonic() - start < timeout_s + 5


@needs_math_verify
def test_stuck_worker_is_killed_and_replaced() -> None:
    # A job that ignores the worker's alarm, like a C-level big-integer computation.
    grade("\\boxed{\\frac{1}{2}}", "0.5")
    start = time.monotonic()
    assert math_grader._call_in_worker(time.sleep, 60, wait_s=0.5) is None
    assert time.monotonic() - start < 3.5
    assert math_grader._worker is None  # killed; the next slow grade starts a fresh worker
    assert grade("\\boxed{\\frac{3}{4}}", "0.75") == 1.0


# Both reach math-verify (no string or number comparison decides them).
_SCRIPT = (
    "from saorl.envs.math.grader import grade\n"
    "print(grade('\\\\boxed{\\\\sqrt{8}}', '2\\\\sqrt{2}'), grade('\\\\boxed{\\\\sqrt{8}}', '3'))\n"
)


@needs_math_verify
@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_grade_works_from_python_c_and_stdin(how: str, tmp_path: Path) -> None:
    # The worker is `python -m saorl.envs.math.worker`: it never imports the caller's
    # `__main__`, which for `python -c` and `python -` has no file to import.
    args = [sys.executable, "-c", _SCRIPT] if how == "-c" else [sys.executable, "-"]
    proc = subprocess.run(
        args,
        input=None if how == "-c" else _SCRIPT,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1.0", "0.0"]


@needs_math_verify
def test_worker_exits_with_its_parent(tmp_path: Path) -> None:
    script = (
        "from saorl.envs.math import grader as math_grader\n"
        "math_grader.grade('\\\\boxed{\\\\sqrt{4}}', '2')\n"
        "print(math_grader._worker.process.pid, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        worker_pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker_pid)  # it read end-of-file on its request pipe and left


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_missing_math_verify_grades_zero_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_grader, "_math_verify_installed", lambda: False)
    monkeypatch.setattr(math_grader, "_unavailable", None)
    monkeypatch.setattr(math_grader, "_warned", False)
    with pytest.warns(RuntimeWarning, match=r"math-verify is not installed.*a dependency of saorl"):
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


def test_math_verify_is_a_base_dependency() -> None:
    """The math env grades with math-verify: a plain `pip install saorl` must bring it."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("math-verify") for d in project["dependencies"])

"""Bug injection by AST mutation: one AST change, written back as a minimal text edit."""

from __future__ import annotations

import difflib
from collections import Counter

import pytest

from saorl.envs.swe.gen.generator import _edit, candidate
from saorl.envs.swe.gen.mutate import mutate, mutation_sites
from saorl.envs.swe.gen.templates import all_templates

SOURCE = '''"""doc"""

LIMIT = 10  # module level: never mutated


def f(xs, n):
    """Docstring: never removed."""
    total = 0
    for x in xs:
        if x < n and x != 3:  # a comment that must survive
            total += x * 2
    return total
'''


def test_every_kind_is_found_and_module_level_code_is_not_touched():
    sites = mutation_sites(SOURCE)
    kinds = Counter(s.kind for s in sites)
    assert set(kinds) == {
        "operator",
        "comparison",
        "boolean",
        "off_by_one",
        "wrong_branch",
        "removed_line",
    }
    for site in sites:
        bug = mutate(SOURCE, site)
        if bug is None:
            continue
        assert bug.function == "f"
        assert "LIMIT = 10  # module level: never mutated" in bug.source
        assert '"""Docstring: never removed."""' in bug.source
        assert bug.source != SOURCE


@pytest.mark.parametrize(
    ("kind", "after"),
    [
        ("comparison", "        if x <= n and x != 3:  # a comment that must survive"),
        ("comparison", "        if x < n and x == 3:  # a comment that must survive"),
        ("boolean", "        if x < n or x != 3:  # a comment that must survive"),
        ("operator", "            total -= x * 2"),
        ("operator", "            total += x + 2"),
        ("off_by_one", "            total += x * 3"),
        ("wrong_branch", "        if not (x < n and x != 3):  # a comment that must survive"),
    ],
)
def test_single_point_edits_change_one_line_only(kind, after):
    for site in mutation_sites(SOURCE):
        bug = mutate(SOURCE, site)
        if bug is None or site.kind != kind or after not in bug.source.splitlines():
            continue
        changed = [
            ln
            for ln in difflib.ndiff(SOURCE.splitlines(), bug.source.splitlines())
            if ln.startswith(("+ ", "- "))
        ]
        assert changed == [f"- {bug_line}" for bug_line in _orig(after)] + [f"+ {after}"]
        return
    pytest.fail(f"no {kind} mutation produced {after!r}")


def _orig(mutated_line: str) -> list[str]:
    """The line of SOURCE at the same place as `mutated_line`."""
    indent = len(mutated_line) - len(mutated_line.lstrip())
    head = mutated_line.strip().split()[0]
    same_place = [ln for ln in SOURCE.splitlines() if len(ln) - len(ln.lstrip()) == indent]
    return [ln for ln in same_place if ln.strip().startswith(head)][:1]


def test_removed_line_deletes_whole_line_or_leaves_pass():
    src = "def g(a):\n    if a:\n        return 1\n    b = a + 1\n    return b\n"
    removed = [mutate(src, s) for s in mutation_sites(src) if s.kind == "removed_line"]
    sources = {m.source for m in removed if m is not None}
    assert "def g(a):\n    if a:\n        pass\n    b = a + 1\n    return b\n" in sources
    assert "def g(a):\n    if a:\n        return 1\n    return b\n" in sources


def test_every_template_mutation_is_a_local_edit():
    ok = 0
    for template in all_templates():
        for site in mutation_sites(template.source):
            bug = mutate(template.source, site)
            if bug is None:
                continue
            ok += 1
            diff = [
                ln
                for ln in difflib.ndiff(template.source.splitlines(), bug.source.splitlines())
                if ln.startswith(("+ ", "- "))
            ]
            removed = [ln for ln in diff if ln.startswith("- ")]
            added = [ln for ln in diff if ln.startswith("+ ")]
            if site.kind == "removed_line":  # the statement's lines go (or become `pass`)
                assert removed and added in ([], [f"+ {bug.after.rstrip()}"]), site
            else:  # one line (the statement holding the node) is rewritten
                assert len(removed) == len(added) == 1, (template.name, site, diff)
    assert ok > 300  # the ten templates offer hundreds of bugs


def test_edit_that_does_not_parse_back_is_refused():
    # 0 - 1 unparses as "-1", which parses as a negation, not the constant -1: refused.
    src = "def h():\n    return 0\n"
    by_change = {s.change: mutate(src, s) for s in mutation_sites(src) if s.kind == "off_by_one"}
    assert by_change["-1"] is None
    assert by_change["+1"] is not None and by_change["+1"].source == "def h():\n    return 1\n"


def test_gold_edit_is_a_unique_str_replace():
    for index in range(6):
        cand, sites = candidate(3, index)
        src = cand.modules[0].source
        bug = next(m for s in sites if (m := mutate(src, s)) is not None)
        _, old, new = _edit("m.py", bug.source, src)
        assert bug.source.count(old) == 1
        assert bug.source.replace(old, new) == src


def test_candidates_are_deterministic_by_seed():
    assert candidate(5, 3) == candidate(5, 3)
    assert [candidate(5, i)[0].modules for i in range(8)] != [
        candidate(6, i)[0].modules for i in range(8)
    ]

"""README.md is a front page: short, with a reading map that points at real code and the one
architecture tree of the project, kept in step with src/saorl."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SRC = ROOT / "src" / "saorl"


def _tree() -> list[str]:
    block = README.split("<!-- ARCHITECTURE -->", 1)[1].split("<!-- /ARCHITECTURE -->", 1)[0]
    return block.strip().strip("`").strip().splitlines()


def _names(text: str) -> set[str]:
    """Module (`x.py`) and folder (`x/`) names in a line of the tree."""
    return set(re.findall(r"(?<![\w./-])(\w+\.py|\w+/)(?![\w/])", text))


def test_readme_is_read_in_five_minutes():
    # 1,200: the real model's section (its command and figures) is what a new user looks for.
    assert len(README.split()) <= 1200


def test_the_architecture_tree_lists_every_top_level_module_and_folder():
    lines = _tree()
    assert lines[0] == "src/saorl/"
    listed, inside = set(), True
    for line in lines[1:]:
        if not line.startswith(" "):
            inside = False  # examples/, tests/, ...: the repository's root
            name = line.split()[0]
            assert (ROOT / name).exists(), f"README tree: {name} does not exist"
        elif inside:
            # The names a line starts with (before its description) are entries of src/saorl;
            # names in a description (envs' swe/) are anywhere below it.
            entry = not line.startswith("   ")  # else a description's continuation line
            head, _, desc = line.strip().partition("  ") if entry else ("", "", line)
            listed |= _names(head)
            for name in _names(desc):
                assert any(SRC.rglob(name.rstrip("/"))), f"README tree: no {name} in src/saorl"
    top = {p.name + ("/" if p.is_dir() else "") for p in SRC.iterdir()}
    top = {n for n in top if n.endswith((".py", "/")) and n != "__pycache__/"}
    assert not listed - top, f"listed in the README tree but not in src/saorl: {listed - top}"
    assert not top - listed, f"in src/saorl but not in the README tree: {top - listed}"


def test_the_reading_map_points_at_real_definitions():
    table = README.split("## Where to read", 1)[1].split("\n## ", 1)[0]
    refs = re.findall(r"`([\w/]+\.py):([\w.]+)`", table)
    assert len(refs) >= 4
    for path, dotted in refs:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        scope: list[ast.stmt] = tree.body
        for part in dotted.split("."):
            found = [
                node
                for node in scope
                if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == part
            ]
            assert found, f"README reading map: no {dotted} in {path}"
            scope = found[0].body


def test_the_extras_line_names_every_feature_extra_and_only_real_ones():
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    line = README.split("Extras, per feature", 1)[1].split("\n\n", 1)[0]
    named, _, not_extras = line.partition("Not extras:")
    # The extras, each followed by what it is for in parentheses.
    named_extras = set(re.findall(r"`([\w-]+)`", re.sub(r"\([^)]*\)", "", named)))
    assert named_extras <= extras, f"README names extras pyproject lacks: {named_extras - extras}"
    # Every feature extra (not the developer ones, nor `math`, kept only for old commands).
    assert extras - {"dev", "bench", "math"} <= named_extras
    assert "pip install pyarrow" in not_extras and "pip install datasets" in not_extras

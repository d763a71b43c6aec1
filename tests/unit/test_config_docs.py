"""docs/config.md is generated from the config models and must match them.

The reference is written by scripts/gen_config_docs.py; a change to a config field (a new field,
a default, a description) without rerunning the script fails here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_docs.py"
DOC = ROOT / "docs" / "config.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_up_to_date() -> None:
    expected = _generator().render()
    actual = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""
    if actual != expected:
        old, new = actual.splitlines(), expected.splitlines()
        first = next(
            (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
            min(len(old), len(new)),
        )
        got = old[first] if first < len(old) else "<end of file>"
        want = new[first] if first < len(new) else "<end of file>"
        pytest.fail(
            "docs/config.md is out of date with src/saorl/config/: run "
            f"`python scripts/gen_config_docs.py`.\nFirst difference, line {first + 1}:\n"
            f"  file:      {got}\n  generated: {want}",
            pytrace=False,
        )


def test_example_config_is_generated() -> None:
    # examples/sao.toml lists every field with its description: written by the same script.
    gen = _generator()
    assert gen.EXAMPLE.read_text(encoding="utf-8") == gen.example_config(), (
        "examples/sao.toml is out of date: run `python scripts/gen_config_docs.py`"
    )


def test_every_config_field_has_a_description() -> None:
    missing = _generator().missing_descriptions()
    assert not missing, (
        "config fields without Field(description=...) (the reference would show an empty "
        f"cell): {', '.join(missing)}"
    )


def test_every_field_appears_in_the_reference() -> None:
    from saorl.config import Config
    from saorl.config.base import leaf_fields

    text = _generator().render()
    for section, info in Config.model_fields.items():
        assert f"\n## {section}\n" in text
        for name in leaf_fields(info.annotation):  # type: ignore[arg-type]
            assert f"| `{section}.{name}` |" in text  # env.swe.tasks too


def test_the_generator_imports_no_torch() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('g', {str(SCRIPT)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.render()\n"
        "assert 'torch' not in sys.modules, 'the config reference generator imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)

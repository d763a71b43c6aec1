"""Correct little Python modules with their pytest tests: the raw material of generated tasks.

Each template is a directory of package data, laid out as in a task's repository:

    template_files/<name>/PKG/<name>.py           the module (copied as is)
    template_files/<name>/tests/test_<name>.py    its tests (`PKG` replaced by the package name)

The tests cover every function, so most single-point mutations of a function body make a test
fail. Mutations only touch function bodies; module-level tables stay intact. The generator
validates every task, so an equivalent mutant (no test fails) is simply skipped. The files are
data, not project code: ruff and pytest leave them alone (see pyproject.toml).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

# Task generation draws from this order: changing it (or adding a name) changes every seed's tasks.
NAMES = (
    "stats",
    "text",
    "intervals",
    "primes",
    "roman",
    "inventory",
    "dates",
    "search",
    "account",
    "matrix",
)
PACKAGES = ("toolbox", "mathkit", "corelib", "utilpack", "datalib", "helpers")
PLACEHOLDER = "PKG"  # the package name in the tests' imports, replaced per task


@dataclass(frozen=True)
class Template:
    name: str  # module name: PKG/<name>.py, tests/test_<name>.py
    source: str
    tests: str


def _read(name: str, *parts: str) -> str:
    data = resources.files(__package__).joinpath("template_files", name, *parts).read_bytes()
    return data.decode("utf-8")  # bytes as stored: no newline translation


@functools.cache
def all_templates() -> tuple[Template, ...]:
    """Every template, in a fixed order (task generation depends on it); read once, so the
    same objects come back every time (the generator compares them by identity)."""
    return tuple(
        Template(
            name, _read(name, PLACEHOLDER, f"{name}.py"), _read(name, "tests", f"test_{name}.py")
        )
        for name in NAMES
    )

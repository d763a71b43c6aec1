"""Child Python interpreters saorl starts on the host run isolated from the current directory.

`python -c CODE` and `python -m MODULE` put the current directory first on `sys.path`, and
read PYTHONPATH, PYTHONSTARTUP and the user site: a `./saorl/` package in the folder where the
user runs saorl would be imported by the child instead of saorl. So every such child (the
process-pool worker, the math grader worker, `saorl compare`'s runs) runs `python -I` (no
current directory, no user site, no PYTHON* variables) with a bootstrap that sets `sys.path`
to this process's import path before anything is imported: saorl's own folder first (which is
also what makes a checkout run with `PYTHONPATH=src` start its own saorl, not an installed
one), then this process's own entries (site-packages, the user's PYTHONPATH folders): a child
never adds the current directory on its own.
The verifiers runner, which may be another venv's Python (`env.verifiers.python`), keeps that
interpreter's own path with saorl's folder first (it then adds the taskset's folder itself).
The in-sandbox runners are started isolated already (`saorl.sandbox`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The folder holding the `saorl` package this process imported.
SAORL_ROOT = str(Path(__file__).resolve().parents[2])


def import_path() -> list[str]:
    """saorl's folder, then this process's `sys.path` made absolute. A '' there (a REPL, a
    notebook, `python -c`: this process imports from its current directory) stays the current
    directory, after saorl's folder: the child trusts what this process trusts, nothing more."""
    rest = [os.path.abspath(p) for p in sys.path]
    return [SAORL_ROOT, *dict.fromkeys(p for p in rest if p != SAORL_ROOT)]


def python_argv(code: str, *args: str, python: str | None = None) -> list[str]:
    """argv running `code` in an isolated `sys.executable` (`sys.argv[1:]` = `args`) with this
    process's import path; another `python` (a venv of its own) keeps its own path, saorl's
    folder put first."""
    if python in (None, sys.executable):
        python = sys.executable
        boot = f"import sys; sys.path[:] = {import_path()!r}"
    else:
        boot = f"import sys; sys.path.insert(0, {SAORL_ROOT!r})"
    return [python, "-I", "-c", f"{boot}\n{code}", *args]


def module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """`python -m module args` as an isolated child (`python_argv`), its `__name__` being
    `__main__` as with `-m`."""
    code = f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return python_argv(code, *args, python=python)

"""Package boundaries: the rooms of src/saorl and which may import which, what importing one part
of saorl drags in with it, and import cycles.

`python tests/unit/test_layout.py` prints every import cycle among saorl's modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# The top of src/saorl: the front doors, the loop and the interfaces it is written against, the
# types, the pure math, the tool-call formats, and the fault-injection hooks.
TOP_LEVEL = {
    *("__init__", "__main__", "api"),  # front doors (the CLI is its own room)
    *("loop", "interfaces", "topology", "types"),
    *("losses", "advantages", "corrections"),  # pure functions with the paper's equations
    "toolcalls",  # the one module both rollout/ and envs/ use for how a model calls a tool
    "faults",
}
# The rooms (folders), each a part a newcomer can name; `data` holds package data, no code.
ROOMS = {
    *("learner", "rollout", "engines", "envs", "models", "checkpoint", "evaluation"),
    *("experiments", "monitoring", "config", "sandbox", "distributed", "data"),
    *("cli", "run", "security"),
}
# The house from the ground up: a room or top-level module imports only from floors below its
# own (in function bodies and type-only imports too), so nothing runs back up.
FLOORS = (
    ("config", "types", "toolcalls", "losses", "advantages", "sandbox", "faults"),
    ("corrections", "security"),
    ("monitoring", "models", "run"),
    ("engines", "envs"),
    ("checkpoint",),
    ("rollout",),
    ("evaluation",),
    ("learner",),
    ("distributed", "interfaces"),
    ("topology",),
    ("loop",),
    ("experiments", "api"),
    ("cli",),
    ("__main__",),
)
# room (or top-level module) -> the rooms and top-level modules it may import, in function bodies
# and type-only imports too. Top-level modules not named here (the loop, the CLI) may import any.
MAY_IMPORT: dict[str, set[str]] = {
    "config": set(),
    "sandbox": set(),
    "losses": set(),
    "advantages": set(),
    "corrections": {"losses"},
    "toolcalls": set(),
    "security": {"config"},
    "run": {"config", "security"},
    "monitoring": {"config", "types", "security"},
    "models": {"config", "types", "security"},
    "engines": {"config", "models", "types"},
    # envs: the built-in arithmetic task, the one object a checkpoint may hold
    "checkpoint": {"config", "faults", "envs", "security"},
    "envs": {"config", "sandbox", "toolcalls", "security"},
    "rollout": {"config", "envs", "engines", "models", "checkpoint", "toolcalls", "types"},
    "evaluation": {
        *("config", "envs", "engines", "models", "monitoring", "rollout", "checkpoint", "types"),
        *("security", "toolcalls"),
    },
    "learner": {
        *("config", "envs", "models", "monitoring", "rollout", "checkpoint", "evaluation"),
        *("advantages", "corrections", "losses", "types", "security"),
    },
    "experiments": {"config", "monitoring", "loop", "security"},
    "distributed": {
        *("config", "envs", "engines", "models", "rollout", "checkpoint", "evaluation"),
        *("learner", "run", "types", "security"),
    },
}
# Where rollout/ meets envs/, besides the formats in saorl.toolcalls: the environment protocol
# (with the exception an agent program's failed episode raises). envs/ imports nothing of rollout/.
BETWEEN = {
    ("rollout", "envs"): {"saorl.envs.base"},
}
# module -> modules (and their submodules) that importing it must not load
BOUNDARIES = {
    # Tool-running processes import only the sandbox: no torch, no environments.
    "saorl.sandbox": ("torch", "saorl.envs"),
    # The loop and the learner are single-process code; adapters live in saorl.distributed.
    # Tracker packages load only when run.trackers names them.
    "saorl.loop": ("ray", "saorl.distributed", "wandb", "mlflow", "tensorboardX"),
    "saorl.learner.learner": ("ray", "saorl.distributed"),
    # Engines are token in, token out: no environments, no rollout workers.
    "saorl.engines.hf": ("saorl.envs", "saorl.rollout"),
    # Configs stay instant to load and print.
    "saorl.config": ("torch",),
    # The tool-call formats are plain text rules, shared by both sides.
    "saorl.toolcalls": ("torch", "saorl.rollout", "saorl.envs"),
}
# Modules (and their submodules) that must not name the distributed adapters anywhere, not even
# in a function body.
SINGLE_PROCESS = ("saorl.loop", "saorl.learner")
MAX_LINES = 500  # per file in src/ (docs/design.md section 4, rule 5)


@pytest.mark.parametrize("module", sorted(BOUNDARIES))
def test_import_stays_inside_its_boundary(module: str) -> None:
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    loaded = set(out.split())
    for banned in BOUNDARIES[module]:
        leaked = sorted(m for m in loaded if m == banned or m.startswith(banned + "."))
        assert not leaked, f"importing {module} loaded {leaked}"


@pytest.mark.parametrize("lazy", [False, True], ids=["import-time", "with-lazy"])
def test_no_import_cycles(lazy: bool) -> None:
    cycles = import_cycles(lazy)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def room(module: str) -> str:
    """`saorl.learner.sharding` -> `learner`, `saorl.loop` -> `loop`, `saorl` -> `saorl`."""
    return module.split(".")[1] if "." in module else module


def test_the_top_level_is_a_dozen_modules_and_the_rooms() -> None:
    top = {p.stem for p in (SRC / "saorl").glob("*.py")}
    folders = {p.name for p in (SRC / "saorl").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert top == TOP_LEVEL, f"new: {top - TOP_LEVEL}, gone: {TOP_LEVEL - top}"
    assert folders == ROOMS, f"new: {folders - ROOMS}, gone: {ROOMS - folders}"


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_a_room_imports_only_the_rooms_it_may(name: str) -> None:
    wrong = []
    for module, targets in import_graph(lazy=True).items():
        if room(module) != name:
            continue
        for target in sorted(targets):
            other = room(target)
            if other in (name, "saorl"):  # `saorl`: the package's version
                continue
            if other not in MAY_IMPORT[name] or target not in BETWEEN.get((name, other), {target}):
                wrong.append(f"{module} -> {target}")
    assert not wrong, f"{name} may import only {sorted(MAY_IMPORT[name])}: {wrong}"


def test_no_import_runs_back_up() -> None:
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    assert set(floor) == ROOMS - {"data"} | TOP_LEVEL - {"__init__"}, "every room has a floor"
    up = []
    for module, targets in import_graph(lazy=True).items():
        here = room(module)
        for target in targets:
            there = room(target)
            if there not in (here, "saorl") and floor[there] >= floor[here]:
                up.append(f"{module} -> {target}")
    assert not up, f"imports running back up (or across a floor): {sorted(up)}"


@pytest.mark.parametrize("package", SINGLE_PROCESS)
def test_single_process_code_names_no_adapter(package: str) -> None:
    modules = [p for m, p in module_names().items() if m == package or m.startswith(package + ".")]
    assert modules
    for path in modules:
        for node in _import_nodes(ast.parse(path.read_bytes()).body, lazy=True):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(("ray", "saorl.distributed")), f"{path} imports {name}"


# Rooms whose functions take the config section (or the values) they use, never the root
# `Config`: they cannot reach another room's settings (issue 44).
SECTIONS_ONLY = ("saorl.models", "saorl.envs")


@pytest.mark.parametrize("package", SECTIONS_ONLY)
def test_a_room_of_sections_never_sees_the_root_config(package: str) -> None:
    modules = [p for m, p in module_names().items() if m == package or m.startswith(package + ".")]
    assert modules
    wrong = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_bytes())):  # type-only imports too
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("saorl.config"):
                if any(alias.name == "Config" for alias in node.names):
                    wrong.append(f"{path.relative_to(SRC)}:{node.lineno}")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{path.relative_to(SRC)}:{node.lineno}"
                    for a in node.names
                    if a.name == "saorl.config.root"
                ]
    assert not wrong, f"{package} takes config sections, not the root Config: {wrong}"


def test_no_source_file_is_too_long() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in module_names().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines: {long}"


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted((SRC / "saorl").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if all(p.isidentifier() for p in parts):  # data directories (templates) are not code
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt], lazy: bool) -> list[ast.stmt]:
    """Statements run at import (module level, inside `if`/`try`/`with`/`class`) and, if `lazy`,
    those in function bodies and `if TYPE_CHECKING:` blocks too (a type-only cycle is still a
    definition at the wrong level)."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            if lazy or not _is_type_checking(node.test):
                out += _import_nodes(node.body, lazy)
            out += _import_nodes(node.orelse, lazy)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out += _import_nodes(block, lazy)
        elif isinstance(node, (ast.With, ast.ClassDef)) or (
            lazy and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ):
            out += _import_nodes(node.body, lazy)
    return out


def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """module -> saorl modules it imports when it is imported (and, if `lazy`, in functions)."""
    names = module_names()
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_bytes()).body, lazy):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import sub` imports the submodule; `from pkg import name`, pkg
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names
                ]
            graph[name] |= {t for t in targets if t in names and t != name}
    return graph


def import_cycles(lazy: bool = False) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph = import_graph(lazy)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


if __name__ == "__main__":
    print(f"{len(module_names())} modules")
    for lazy in (False, True):
        found = import_cycles(lazy)
        kind = "counting imports inside functions" if lazy else "import-time imports"
        print(f"{kind}: {len(found)} cycle(s)")
        for comp in found:
            print("  cycle:", " <-> ".join(comp))

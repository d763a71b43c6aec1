"""Every third-party import of saorl's modules is declared: by the base dependencies, or by the
extra that enables the module (pyproject.toml). A user who installs `saorl[agents]` gets what
the agent code imports, whatever `.[dev]` happens to bring along in CI.

Each import (top-level and in function bodies) is mapped to the distribution that provides it
(`importlib.metadata.packages_distributions()`); those not installed in this venv (their extras
run in venvs of their own) are named in `NOT_INSTALLED`, never skipped.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# module (or module-name prefix) -> the extra whose installation enables it
EXTRA_OF: dict[str, str] = {
    "saorl.envs.agent": "agents",  # the openai client of function agents
    "saorl.rollout.agents.server": "agents",  # the in-process client's HTTP library (httpx2)
    "saorl.envs.openenv": "openenv",  # and openenv_tools
    "saorl.envs.reasoning_gym": "reasoning-gym",
    "saorl.envs.swe.": "swe",  # runs the task repositories' tests with pytest
    "saorl.envs.verifiers_": "verifiers",
    "saorl.models.lora": "lora",
    "saorl.models.fetch": "real-model",  # gguf, for transformers' GGUF loader
    "saorl.monitoring.tracking": "tracking",  # W&B, MLflow (TensorBoard files are base)
    "saorl.distributed.ray_": "ray",
    "saorl.distributed.weight_sync": "ray",
    "saorl.engines.vllm": "vllm",  # and its lora, moe and outputs helpers
}
# Distributions of the extras that run in venvs of their own (not installed here), or that
# `dev` has only through other packages: import name -> distribution.
NOT_INSTALLED: dict[str, str] = {
    "vllm": "vllm",
    "verifiers": "verifiers",
    "websockets": "websockets",  # openenv's; here through openai-agents
}
# (module, import) -> why it need not be declared: optional imports behind
# `try: ... except ImportError:` with a message of their own, and scripts for other interpreters.
UNDECLARED: dict[tuple[str, str], str] = {
    ("saorl.envs.data.files", "pyarrow"): "optional: Parquet files, else pandas",
    ("saorl.envs.data.files", "pandas"): "optional: Parquet files, says what to install",
    ("saorl.envs.data.files", "datasets"): "optional: save_to_disk folders, says what to install",
    ("saorl.envs.swe.mine", "tqdm"): "optional: a progress bar",
    ("saorl.rollout.agents.server", "httpx"): "the fallback for openai < 3 (the verifiers venv)",
    ("saorl.envs.swe.venv_probe", "packaging"): "runs in a task's venv (or pip's copy)",
    ("saorl.envs.swe.venv_probe", "pip"): "runs in a task's venv",
    ("saorl.envs.swe.miniswe_runner", "minisweagent"): "runs in .venv-miniswe",
    ("saorl.envs.swe.miniswe_runner", "litellm"): "runs in .venv-miniswe",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str], extras: dict[str, list[str]]) -> set[str]:
    """Distribution names of requirements, `saorl[x]` expanded to extra x's."""
    names: set[str] = set()
    for req in requirements:
        name = _norm(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0])
        if name == "saorl":
            for extra in re.findall(r"\[(.*?)\]", req)[0].split(","):
                names |= _names(extras[extra.strip()], extras)
        else:
            names.add(name)
    return names


def _module(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def third_party_imports() -> dict[tuple[str, str], int]:
    """`(module, top-level import name) -> line` of every absolute import outside the standard
    library and saorl, anywhere in the module (function bodies, `TYPE_CHECKING` blocks)."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted((SRC / "saorl").rglob("*.py")):
        if "template_files" in path.parts:  # data copied into task repositories, not saorl's
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("saorl", "__future__"):
                    found.setdefault((_module(path), top), node.lineno)
    return found


def _extra_of(module: str) -> str | None:
    return next((e for prefix, e in EXTRA_OF.items() if module.startswith(prefix)), None)


def test_every_import_is_declared_by_base_or_its_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    base = _names(project["dependencies"], extras)
    installed = importlib.metadata.packages_distributions()
    missing = []
    for (module, top), line in third_party_imports().items():
        if (module, top) in UNDECLARED:
            continue
        dists = installed.get(top) or [NOT_INSTALLED.get(top, "")]
        if not dists[0]:
            missing.append(
                f"{module}:{line} imports {top}: not installed here, not in NOT_INSTALLED"
            )
            continue
        extra = _extra_of(module)
        allowed = base | (_names(extras[extra], extras) if extra else set())
        if not {_norm(d) for d in dists} & allowed:
            where = f"the [{extra}] extra" if extra else "the base dependencies (or EXTRA_OF)"
            missing.append(f"{module}:{line} imports {top} ({', '.join(dists)}): not in {where}")
    assert not missing, "undeclared imports (pyproject.toml):\n" + "\n".join(missing)


def test_the_tables_name_what_exists():
    """No stale entries: each names an extra of pyproject.toml and a module or import of saorl."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    imports = third_party_imports()
    modules = {m for m, _ in imports} | {_module(p) for p in (SRC / "saorl").rglob("*.py")}
    for prefix, extra in EXTRA_OF.items():
        assert extra in extras, extra
        assert any(m.startswith(prefix) for m in modules), prefix
    for key in UNDECLARED:
        assert key in imports, key
    tops = {top for _, top in imports}
    for top, dist in NOT_INSTALLED.items():
        in_extras = set().union(*(_names(reqs, extras) for reqs in extras.values()))
        assert _norm(dist) in in_extras, dist
        assert top in tops, top


def test_the_agents_extra_brings_the_endpoints_http_library():
    """The issue behind this file: openai 3 depends on httpx2, not httpx, and the endpoint builds
    in-process agents' client from the SDK's own library."""
    import openai

    from saorl.rollout.agents.server import _httpx

    assert isinstance(openai.DefaultAsyncHttpxClient(), _httpx().AsyncClient)

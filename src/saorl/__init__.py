"""saorl: asynchronous, agentic RL post-training of language models with SAO.

SAO is Single-rollout Asynchronous Optimization (arXiv 2607.07508). Importing the package does
no work and imports no torch; the names below load their modules on first use:

    import saorl
    summary = saorl.train("examples/sao.toml", env="examples/custom_env.py:guessing")
    summary = saorl.evaluate("runs/default", env="examples/custom_env.py:guessing")

`EnvSpec`, `StepResult` and `TaskList` are what your own environment is written with
(docs/agentic.md).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# name -> the module defining it, imported when the name is first used
_LAZY = {
    "train": "saorl.api",
    "evaluate": "saorl.api",
    "EnvSpec": "saorl.envs.base",
    "StepResult": "saorl.envs.base",
    "TaskList": "saorl.envs.base",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'saorl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

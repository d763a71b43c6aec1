"""Old module names that still import after the modules moved into role folders (issue 28).

`import saorl.compare`, `from saorl.envs.datasets import load_problems`: `install()` (run by
`saorl/__init__.py`) puts one finder on `sys.meta_path` that answers each name of `MOVED` with the
new module itself, so both names are one module object (patching one patches the other), and
warns with a DeprecationWarning. Nothing is imported until an old name is.

Three old modules became packages of the same name (`saorl.learner`, `saorl.checkpoint`,
`saorl.evaluation`; the module is now `saorl.X.X`). Those packages answer the old module's names
through `forward`, so `from saorl.learner import Learner` keeps working; a submodule of the
package (`saorl.checkpoint.digest`) is imported without the forwarded module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

# old module -> new module
MOVED = {
    "saorl.policy_step": "saorl.learner.policy_step",
    "saorl.critic_updater": "saorl.learner.critic_updater",
    "saorl.sharding": "saorl.learner.sharding",
    "saorl.sft": "saorl.learner.sft",
    "saorl.value_pretrain": "saorl.learner.value_pretrain",
    "saorl.collector": "saorl.rollout.collector",
    "saorl.resume": "saorl.rollout.resume",
    "saorl.checkpoint_shards": "saorl.checkpoint.shards",
    "saorl.checkpoint_digest": "saorl.checkpoint.digest",
    "saorl.distributed.dcp": "saorl.checkpoint.dcp",
    "saorl.eval_prompts": "saorl.evaluation.prompts",
    "saorl.compare": "saorl.experiments.compare",
    "saorl.compare_arms": "saorl.experiments.arms",
    "saorl.compare_report": "saorl.experiments.compare_report",
    "saorl.report": "saorl.experiments.report",
    "saorl.metrics": "saorl.monitoring.metrics",
    "saorl.tracking": "saorl.monitoring.tracking",
    "saorl.samples": "saorl.monitoring.samples",
    "saorl.collapse": "saorl.monitoring.collapse",
    "saorl.terminal": "saorl.monitoring.terminal",
    "saorl.envs.math_extract": "saorl.envs.math.extract",
    "saorl.envs.math_grader": "saorl.envs.math.grader",
    "saorl.envs.math_normalize": "saorl.envs.math.normalize",
    "saorl.envs.math_tool": "saorl.envs.math.tool",
    "saorl.envs.math_worker": "saorl.envs.math.worker",
    "saorl.envs.datasets": "saorl.envs.data.datasets",
    "saorl.envs.dataset_files": "saorl.envs.data.files",
    "saorl.envs.tools": "saorl.envs.function_tools",
    "saorl.rollout.tools": "saorl.toolcalls",
    # the config split by section: the package exports what components.py held; root.py
    # defines Config and imports the run, collapse and ray sections runtime.py held
    "saorl.config.components": "saorl.config",
    "saorl.config.runtime": "saorl.config.root",
}
# old module that is now a package of the same name -> the module inside it
FORWARDED = {
    "saorl.learner": "saorl.learner.learner",
    "saorl.checkpoint": "saorl.checkpoint.checkpoint",
    "saorl.evaluation": "saorl.evaluation.evaluation",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module: the same object, its own spec left in place."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old name will go",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias's spec on the module: give it back its own
        module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def forward(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` (a key of FORWARDED): its submodules are its
    own, any other name is the forwarded module's."""
    module = FORWARDED[package]

    def submodules() -> set[str]:
        return {m.name for m in pkgutil.iter_modules(sys.modules[package].__path__)}

    def __getattr__(name: str) -> Any:
        if name.startswith("__") or name in submodules():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *dir(importlib.import_module(module))})

    return __getattr__, __dir__

"""Your own environments and reward functions, named by a string or passed as an object.

    env.name = "my_pkg.envs:make_env"     # an import path: the module, then the attribute
    env.name = "envs/guess.py:guessing"   # a file, made absolute when the config is read

The attribute is either

- a factory: called with `env.args` as keyword arguments, it returns an `EnvSpec` (the task
  source, a fresh environment per episode, the budgets, stop strings, demonstrations); or
- an Env class (async `reset(task)` and `step(action_text)`) with a `tasks(**args)` classmethod
  returning `(train, held_out)`, two lists of tasks (or any object with `.sample(rng)` and
  `.held_out`). Each episode gets `cls()`; `env.max_turns` and `env.max_tool_calls` are its
  budgets, an optional class attribute `stop` (strings that end a model turn) and static method
  `demo(task, rng)` (warm-up demonstrations) complete the spec; or
- an `EnvSpec` itself.

Every process that needs the environment (the training loop, Ray rollout actors, `saorl eval`,
`saorl value-pretrain`, a resumed run) resolves the same string through
`saorl.envs.factory.build_env`. A file is loaded once per process as a module with a name
derived from its absolute path, so objects defined there pickle between Ray processes.
`saorl.train(env=<object>)` stores an object without an import path under a
`python-object:` name that only the process holding it can resolve.

Problems are reported as `ConfigError` (exit code 2 on the command line) naming the string.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Mapping
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.config.env import OBJECT_PREFIX, reference_kind
from saorl.envs.base import EnvSpec, HasDemo, HasStop, TaskList, is_task_source

_FILE_MODULES: dict[str, str] = {}  # absolute file path -> its module's name in sys.modules
_OBJECTS: dict[str, Any] = {}  # `python-object:` names -> the objects `register_object` named


def load_reference(ref: str, field: str = "env.name") -> Any:
    """The object `ref` (`module:attr`, `file.py:attr` or a registered object) names."""
    kind = reference_kind(ref)
    if kind == "object":
        if ref not in _OBJECTS:
            raise ConfigError(
                f"{field} {ref!r}: an object passed to saorl.train/evaluate in another process "
                "cannot be rebuilt here; pass it again, or name it by a string "
                "('package.module:attr' or 'path/to/file.py:attr')"
            )
        return _OBJECTS[ref]
    if kind is None:
        raise ConfigError(f"{field} {ref!r}: not 'package.module:attr' or 'path/to/file.py:attr'")
    target, _, attr = ref.rpartition(":")
    module = (
        _import_file(target, ref, field) if kind == "file" else _import_module(target, ref, field)
    )
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = target if i == 0 else ".".join(attr.split(".")[:i])
            defined = _public_names(obj)
            hint = f"; it defines: {', '.join(defined)}" if defined else ""
            raise ConfigError(f"{field} {ref!r}: {where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _public_names(obj: Any) -> list[str]:
    """Classes and functions defined in module `obj` itself (or attributes of a class)."""
    own = getattr(obj, "__name__", None)
    names = [
        name
        for name, value in vars(obj).items()
        if not name.startswith("_")
        and callable(value)
        and (not isinstance(obj, type(sys)) or getattr(value, "__module__", None) == own)
    ]
    return sorted(names)[:20]


def _describe(exc: BaseException) -> str:
    """`Type: message (at file:line)`, the line being the innermost frame of the failure."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" (at {user[-1].filename}:{user[-1].lineno})" if user else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _import_module(name: str, ref: str, field: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(
                f"{field} {ref!r}: no module named {e.name!r}; install it or put its directory "
                "on PYTHONPATH, or name a file instead: 'path/to/file.py:attr'"
            ) from None
        raise ConfigError(f"{field} {ref!r}: importing {name} failed: {_describe(e)}") from e
    except Exception as e:  # the user's module failed while being imported
        raise ConfigError(f"{field} {ref!r}: importing {name} failed: {_describe(e)}") from e


def _import_file(path: str, ref: str, field: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{field} {ref!r}: file not found: {file}")
    key = str(file.resolve())
    loaded = _FILE_MODULES.get(key)
    if loaded in sys.modules:
        return sys.modules[loaded]
    # The same name in every process (driver, Ray actors): objects of this module pickle by
    # reference between them.
    stem = re.sub(r"\W", "_", file.stem)
    name = f"saorl_user_{stem}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{field} {ref!r}: {file} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file failed while running
        del sys.modules[name]
        raise ConfigError(f"{field} {ref!r}: loading {file} failed: {_describe(e)}") from e
    _FILE_MODULES[key] = name
    return module


def register_object(obj: Any) -> str:
    """A string `build_env` resolves to `obj`: its import path or file reference when other
    processes can import it the same way, else a `python-object:` name for this process."""
    ref = _reference_of(obj)
    if ref is not None:
        return ref
    for name, known in _OBJECTS.items():
        if known is obj:
            return name
    label = getattr(obj, "__qualname__", type(obj).__name__)
    name = f"{OBJECT_PREFIX}{label}#{len(_OBJECTS) + 1}"
    _OBJECTS[name] = obj
    return name


def _reference_of(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None  # an instance, a lambda or a function defined inside another
    mod = sys.modules.get(module)
    if module == "__main__" or mod is None or getattr(mod, "__spec__", None) is None:
        return None
    found: Any = mod
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        return None
    for path, name in _FILE_MODULES.items():
        if name == module:
            return f"{path}:{qualname}"
    # Importable by other processes (Ray actors, a resumed run): found on sys.path, not only
    # present in this process's sys.modules.
    top = module.partition(".")[0]
    return f"{module}:{qualname}" if PathFinder.find_spec(top) is not None else None


def build_custom_env(cfg: EnvConfig, held_out_only: bool = False) -> EnvSpec:
    """The `EnvSpec` of `cfg.name`, a reference to user code (see the module docstring)."""
    ref = cfg.name
    obj = load_reference(ref)
    if isinstance(obj, EnvSpec):
        if cfg.args:
            raise ConfigError(f"env.args: env.name {ref!r} is an EnvSpec, which takes no args")
        spec = dataclasses.replace(obj)  # build_env sets fields on it: leave the user's alone
    elif isinstance(obj, type):
        spec = _spec_from_class(obj, cfg)
    elif callable(obj):
        spec = _call(obj, cfg.args, f"env.name {ref!r}: the factory")
        if not isinstance(spec, EnvSpec):
            raise ConfigError(
                f"env.name {ref!r}: the factory returned a {type(spec).__name__}, not an "
                "EnvSpec (from saorl import EnvSpec)"
            )
    else:
        raise ConfigError(
            f"env.name {ref!r}: names an object of type {type(obj).__name__}; expected a "
            "factory returning an "
            "EnvSpec, an Env class with a tasks() classmethod, or an EnvSpec"
        )
    task = spec.task
    if not is_task_source(task):
        raise ConfigError(
            f"env.name {ref!r}: EnvSpec.task is a {type(task).__name__} without .sample(rng) "
            "and .held_out; use TaskList(train, held_out)"
        )
    if not held_out_only and isinstance(task, TaskList) and not task.train:
        raise ConfigError(f"env.name {ref!r}: no training tasks (the train list is empty)")
    return spec


def _spec_from_class(cls: type, cfg: EnvConfig) -> EnvSpec:
    ref = cfg.name
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(
            f"env.name {ref!r}: class {cls.__name__} has no {' or '.join(missing)}: not an Env "
            "(async reset(task) -> messages, async step(action_text) -> StepResult)"
        )
    if not callable(getattr(cls, "tasks", None)):
        raise ConfigError(
            f"env.name {ref!r}: class {cls.__name__} needs a classmethod tasks(**args) returning "
            "(train, held_out) lists of tasks; or name a factory returning an EnvSpec"
        )
    got = _call(cls.tasks, cfg.args, f"env.name {ref!r}: {cls.__name__}.tasks()")  # type: ignore[attr-defined]
    if isinstance(got, tuple) and len(got) == 2:
        task: Any = TaskList(*got)
    elif is_task_source(got):
        task = got
    else:
        raise ConfigError(
            f"env.name {ref!r}: {cls.__name__}.tasks() returned a {type(got).__name__}; "
            "expected (train, held_out), two lists of tasks"
        )
    return EnvSpec(
        task,
        cls,
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
        stop=tuple(cls.stop) if isinstance(cls, HasStop) else (),
        demo=cls.demo if isinstance(cls, HasDemo) else None,
    )


def _call(fn: Any, args: Mapping[str, Any], what: str) -> Any:
    try:
        return fn(**args)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from e
    except Exception as e:  # the user's code failed: a bad input, not a saorl crash
        passed = f" (env.args: {dict(args)})" if isinstance(e, TypeError) else ""
        raise ConfigError(f"{what} raised {_describe(e)}{passed}") from e

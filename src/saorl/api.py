"""The Python API (`saorl.train`, `saorl.evaluate`) for notebooks and scripts.

    import saorl
    summary = saorl.train({"run.total_steps": 60}, env="examples/custom_env.py:guessing")
    summary = saorl.train("my.toml", env=MyEnv, overrides=["learner.lr=1e-5"])

`config` is what `saorl train` reads, in any of these forms: None (the defaults), a `Config`,
the path of a TOML file, or a dict, either nested (`{"run": {"total_steps": 60}}`) or with
dotted keys (`{"run.total_steps": 60}`). `overrides` go on top: a dict of the same shape or
`section.field=value` strings as on the command line. `env` sets `env.name`: a string as in
a config file, or the object itself: a factory returning an `EnvSpec`, an Env class with a
`tasks()` classmethod, or an `EnvSpec`.

An object other processes can import (a module on sys.path, a file loaded through a
`file.py:attr` string) is stored as its import path, so the run's config.toml, a resume and
Ray actors find it. Any other object (defined in a notebook or a `__main__` script, an
`EnvSpec` instance) lives only in this process: training with it works in one process, and
`ray.enabled` refuses it with a `ConfigError` that says to name it by a string instead.
Ray pickling of such objects is not attempted: closures over notebook state rarely survive it.

`trust_remote_code`: as `--trust-remote-code`: run a model directory's own code, and the code
a run folder's saved config names (without it, `resume=` or `evaluate(RUN)` whose config.toml
names code you did not pass raises `ConfigError`; `saorl.security.trust`).

Errors are raised, not turned into exit codes: `ConfigError` for a bad input.
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from saorl.config import (
    Config,
    ConfigError,
    config_from_dict,
    config_to_toml,
    load_config,
    parse_override,
)
from saorl.config.base import leaf_fields, set_dotted
from saorl.config.env import reference_kind

TRUST_ARG = "trust_remote_code=True"  # how the Python API names the flag in its errors
ConfigLike = Config | str | os.PathLike[str] | Mapping[str, Any] | None
Overrides = Mapping[str, Any] | Sequence[str] | None


def make_config(config: ConfigLike = None, overrides: Overrides = None, env: Any = None) -> Config:
    """A validated `Config` from any of the forms `train` accepts."""
    if isinstance(config, Config) and overrides is None and env is None:
        return config  # validated when it was made
    as_cli = isinstance(config, str | os.PathLike | None) and env is None
    if as_cli and not isinstance(overrides, Mapping):
        # The command line's own reading: errors name the file or override they came from.
        items = [overrides] if isinstance(overrides, str) else list(overrides or ())
        return load_config(None if config is None else Path(config), items)
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, Config):
        data = tomllib.loads(config_to_toml(config))
    elif isinstance(config, str | os.PathLike):
        data = tomllib.loads(config_to_toml(load_config(Path(config))))
    elif isinstance(config, Mapping):
        data = _merge({}, config)
    else:
        raise ConfigError(f"config: a Config, a TOML path or a dict, not a {type(config).__name__}")
    if isinstance(overrides, Mapping):
        data = _merge(data, overrides)
    elif overrides is not None:
        if isinstance(overrides, str):
            overrides = [overrides]
        for item in overrides:
            section, name, value = parse_override(item)
            set_dotted(data, f"{section}.{name}", value)
    if env is not None:
        data = _merge(data, {"env.name": env if isinstance(env, str) else _env_name(env)})
    return config_from_dict(data)


def _trusted(
    cfg: Config, saved: Any, overrides: Overrides, env: Any, trust: bool, flag: str
) -> Config:
    """`cfg`, checked by `saorl.security.trust.check_saved_code` when it came from a run's `saved`
    config.toml, with `model.trust_remote_code` set when `trust`."""
    from saorl.security.trust import check_saved_code, override_keys

    if trust:
        return cfg.model_copy(
            update={"model": cfg.model.model_copy(update={"trust_remote_code": True})}
        )
    if saved is not None:
        if isinstance(overrides, Mapping):
            given = set(_dotted_items(overrides))
        else:
            given = override_keys([overrides] if isinstance(overrides, str) else overrides or [])
        check_saved_code(
            cfg,
            saved,
            given | ({"env.name"} if env is not None else set()),
            trust=False,
            flag=flag,
        )
    return cfg


def _env_name(obj: Any) -> str:
    from saorl.envs.custom import register_object

    return register_object(obj)


def _merge(data: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """`updates` (nested sections or dotted `section.field` keys) applied to a copy of `data`."""
    out = copy.deepcopy(dict(data))
    for key, value in _dotted_items(updates).items():
        if "." not in key:
            raise ConfigError(
                f"config key {key!r}: use 'section.field' (e.g. 'run.total_steps') or a "
                "nested {section: {field: value}} dict"
            )
        set_dotted(out, key, value)
    return out


def _dotted_items(updates: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"env": {"swe": {"tasks": x}}}` and `{"env.swe": {"tasks": x}}` as
    `{"env.swe.tasks": x}`; a table that is a value (`env.args`) is kept whole."""
    out: dict[str, Any] = {}
    for key, value in updates.items():
        dotted = f"{prefix}{key}"
        path = tuple(dotted.split("."))
        if isinstance(value, Mapping) and (not prefix or _is_table_path(path)):
            out.update(_dotted_items(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def _is_table_path(path: tuple[str, ...]) -> bool:
    """Whether `path` names a section or a nested table of `Config` (not a field)."""
    fields = leaf_fields(Config)
    dotted = ".".join(path)
    return dotted not in fields and any(f.startswith(f"{dotted}.") for f in fields)


def train_config(
    config: ConfigLike = None,
    overrides: Overrides = None,
    env: Any = None,
    resume: str | os.PathLike[str] | None = None,
    flag: str = "resume",
    trust_remote_code: bool = False,
    trust_flag: str = TRUST_ARG,
) -> Config:
    """The config `train` runs: with `resume`, that run directory must exist and its
    config.toml is the base config when `config` is None (`saorl train --resume` too; `flag`
    names the argument in errors). Code that saved config names is refused unless the caller
    passed it or `trust_remote_code` (`saorl.security.trust`; `trust_flag` names the flag in
    errors)."""
    saved = None
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise ConfigError(f"{flag}: run directory not found: {run_dir}")
        from saorl.security.safe_io import check_dir

        check_dir(run_dir)  # a link, or another user's folder, is never written
        if config is None and (run_dir / "config.toml").is_file():
            config = saved = run_dir / "config.toml"
    cfg = make_config(config, overrides, env)
    return _trusted(cfg, saved, overrides, env, trust_remote_code, trust_flag)


def eval_config(
    model: str | os.PathLike[str],
    config: ConfigLike = None,
    overrides: Overrides = None,
    env: Any = None,
    trust_remote_code: bool = False,
    trust_flag: str = TRUST_ARG,
) -> Config:
    """The config `evaluate` runs: `config`, else the config.toml of the run `model` belongs
    to (`saorl.security.trust.run_config`; its code checked as in `train_config`), else the
    defaults; then `overrides` (`saorl eval` too)."""
    from saorl.security.trust import run_config

    saved = None
    if config is None:
        config = saved = run_config(Path(model))
    cfg = make_config(config, overrides, env)
    return _trusted(cfg, saved, overrides, env, trust_remote_code, trust_flag)


def train(
    config: ConfigLike = None,
    *,
    env: Any = None,
    overrides: Overrides = None,
    resume: str | os.PathLike[str] | None = None,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Train as `saorl train` does; returns the run's summary (also in RUN_DIR/summary.json).

    `resume`: continue that run directory; its config.toml is the base config when `config`
    is None (pass `env=` again if the run was started with an object). A run that reached its
    `run.total_steps` is left as it is and its summary returned (raise `run.total_steps` in
    `overrides` to train it further).
    """
    cfg = train_config(config, overrides, env, resume, trust_remote_code=trust_remote_code)
    if cfg.ray.enabled and reference_kind(cfg.env.name) == "object":
        raise ConfigError(
            f"env: {cfg.env.name!r} is an object of this process, which Ray actors cannot "
            "rebuild; with ray.enabled name it by a string: 'package.module:attr' or "
            "'path/to/file.py:attr'"
        )
    from saorl.loop import train_from_config  # imports torch: only when a run starts

    return train_from_config(cfg, resume=None if resume is None else str(resume))


def evaluate(
    model: str | os.PathLike[str],
    config: ConfigLike = None,
    *,
    env: Any = None,
    overrides: Overrides = None,
    k: int = 1,
    limit: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool = False,
    prompt_template: str = "saorl",
    trust_remote_code: bool = False,
    greedy: bool = False,
) -> dict[str, Any]:
    """Evaluate as `saorl eval MODEL` does; returns its summary (avg@k, pass@k, maj@k, ...).

    `model`: a run directory, one of its checkpoints, a Hugging Face directory, `builtin:tiny`,
    or with `base_url` a served model's name. `config` defaults to the run's config.toml when
    `model` belongs to a run, else the defaults. `out`: also write the per-problem JSONL and
    the summary there, and print the table, as the command does. `prompt_template`: as
    `--prompt-template` (`saorl`, `boxed`, `qwen_math` or a text with `{problem}`). `greedy`:
    as `--greedy`, argmax decoding (temperature 0 over `base_url`).
    """
    for name, value in (("k", k), ("limit", limit)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    cfg = eval_config(model, config, overrides, env, trust_remote_code=trust_remote_code)
    summary, _ = run_evaluation(
        model,
        cfg,
        k=k,
        limit=limit,
        base_url=base_url,
        api_key=api_key,
        out=out,
        write=out is not None,
        progress=progress,
        prompt_template=prompt_template,
        greedy=greedy,
    )
    return summary


def run_evaluation(
    model: str | os.PathLike[str],
    cfg: Config,
    *,
    k: int = 1,
    limit: int | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    out: str | os.PathLike[str] | None = None,
    write: bool = True,
    progress: bool = False,
    prompt_template: str = "saorl",
    greedy: bool = False,
) -> tuple[dict[str, Any], Path | None]:
    """Evaluate `model` under an already-resolved `cfg` (from `eval_config`): check the paths,
    run, and with `write` save the per-problem JSONL and summary (`out`, else RUN/evals/WHICH/
    NAME.jsonl for a run's model, evals/MODEL/NAME.jsonl for another) and print the table.
    Returns the summary and the JSONL path. `saorl eval` and `evaluate` both end here."""
    from saorl.evaluation.held_out import check_paths, run_eval, write_results  # torch

    out_str = None if out is None else str(out)
    check_paths(str(model), out_str, served=base_url is not None)
    summary, rows = run_eval(
        str(model),
        cfg,
        k=k,
        limit=limit,
        base_url=base_url,
        api_key=api_key,
        progress=progress,
        greedy=greedy,
        prompt_template=prompt_template,
    )
    path = None
    if write:  # without --out, a run's model has its results in the run folder
        from saorl.security.trust import run_config

        saved = None if base_url is not None else run_config(Path(model))
        run_dir = None if saved is None else Path(saved).parent
        path = write_results(str(model), cfg.env, summary, rows, out_str, run_dir)
    return summary, path

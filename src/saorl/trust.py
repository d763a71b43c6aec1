"""A run folder is data: code its saved config names runs only when this command trusts it.

`saorl eval RUN`, `saorl eval RUN/checkpoints/...` and `saorl train --resume RUN` (and
`saorl.evaluate`, `saorl.train(resume=)`) start from the run's `config.toml`. A config can name
Python code: your own environment (`env.name = "file.py:attr"`), reward functions
(`env.reward_fns`), tool functions (`env.tools`), packages pip builds for coding tasks
(`env.swe_pip_args`: a local path or another index) and a model directory's own code
(`model.trust_remote_code = true`). A run folder made by someone else would then run their code
although its checkpoint pickle is refused, so, as transformers does for `auto_map`, such a
field read from the saved file is refused (a `ConfigError`, exit 2, naming the key, the code
and the flag) unless the command line passes `--trust-remote-code` (`trust_remote_code=True`
in the Python API) or sets that key itself. A config file given with `--config`, overrides and
the API's own arguments are the user's and are never refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from saorl.config import Config, ConfigError, load_config, parse_override
from saorl.config.env import reference_kind

FLAG = "--trust-remote-code"
# What `--trust-remote-code` adds to the command line's overrides: a model directory's code too.
TRUST_OVERRIDE = "model.trust_remote_code=true"


def code_references(cfg: Config) -> list[tuple[str, str]]:
    """`(key, what)` for every field of `cfg` that makes saorl import or run code."""
    refs = []
    if reference_kind(cfg.env.name) in ("module", "file"):
        refs.append(("env.name", cfg.env.name))
    refs += [("env.reward_fns", ref) for ref in cfg.env.reward_fns]
    refs += [("env.tools", ref) for ref in cfg.env.tools]
    if cfg.env.swe_pip_args:  # pip builds and installs what they name (a path, another index)
        refs.append(("env.swe_pip_args", cfg.env.swe_pip_args))
    if cfg.model.trust_remote_code:
        refs.append(("model.trust_remote_code", f"the Python code of {cfg.model.name_or_path}"))
    return refs


def check_saved_code(
    cfg: Config, saved: str | Path, given: Iterable[str], trust: bool, flag: str = FLAG
) -> None:
    """Raise `ConfigError` for code `cfg` names that came from the saved config `saved` and not
    from this command (`given`: the `section.field` keys it set); nothing when `trust`."""
    if trust:
        return
    given = set(given)
    for key, what in code_references(cfg):
        if key not in given:
            raise ConfigError(
                f"{key} = {what!r} comes from {saved}, a run folder's saved config, and names "
                f"Python code this command did not pass; saorl imports a run folder's code only "
                f"with {flag} (pass it if you trust the folder), or set {key} yourself"
            )


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The `section.field` keys of command-line overrides."""
    return {".".join(parse_override(item)[:2]) for item in overrides}


def run_config(model: Path) -> str | None:
    """The config.toml of the run MODEL belongs to: RUN, RUN/final, RUN/checkpoints/X.pt or
    RUN/checkpoints/X.hf."""
    run = model
    if (model.suffix == ".pt" and model.is_file()) or (model.suffix == ".hf" and model.is_dir()):
        run = model.parent.parent
    elif model.name == "final" and not (model / "config.toml").is_file():
        run = model.parent
    saved = run / "config.toml"
    return str(saved) if saved.is_file() else None


def load_trusted(
    config_path: str | None, saved: str | None, overrides: Sequence[str], trust: bool
) -> Config:
    """The config of a command: `config_path` (the user's) if given, else the run's `saved`
    config.toml (checked by `check_saved_code`) or the defaults; `overrides` on top, and
    with `trust` `model.trust_remote_code=true`."""
    overrides = [*overrides, *([TRUST_OVERRIDE] if trust else [])]
    cfg = load_config(config_path or saved, overrides)
    if config_path is None and saved is not None:
        check_saved_code(cfg, saved, override_keys(overrides), trust)
    return cfg

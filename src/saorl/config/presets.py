"""`algorithm.name` presets: each algorithm's published recipe, across config sections.

An algorithm is more than its advantage estimator and policy loss: VAPO also fixes the GAE
lambdas, an extra LM loss, group sampling, several mini-batch updates per batch, and how its
critic trains (lr, freezing, updates per step, value pre-training). So a preset is a list of
settings, each a `section.field` with a value and the source it comes from, and the root
`Config` applies it before validation (`apply_presets`, hooked in `saorl.config.root`):

- a setting fills its field only where the input leaves that field out: anything set
  explicitly (in the TOML file or an override) always wins;
- fields no preset names keep their defaults, which are SAO's recipe;
- a value may be `Times(key, factor)`: that factor times another field's resolved value
  (VAPO's critic lr is 2x the policy lr, whatever the policy lr is).

`implied_settings(cfg)` is what the preset of `cfg` gives; `config_to_toml` writes those fields
only where they differ, so a saved config combined with another `algorithm.name` means what it
says. `describe_presets()` is the listing of `saorl train --help-config`.

This module holds data and dict manipulation only; it imports no other config module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Times:
    """A value that is `factor` times the resolved value of `key` (`section.field`)."""

    key: str
    factor: float


@dataclass(frozen=True)
class Setting:
    """One component of a recipe: `key` (`section.field`) takes `value`, per `source`."""

    key: str
    value: Any
    source: str


@dataclass(frozen=True)
class Preset:
    summary: str
    settings: tuple[Setting, ...]


_SAO = "SAO (arXiv 2607.07508)"
_VAPO = "VAPO (arXiv 2504.05118)"
# The mini-batch count of the papers (DAPO arXiv 2503.14476 and VAPO: 512 prompts x 16 samples
# = 8192 responses per rollout batch, mini-batches of 512 = 16 policy updates per batch) scaled
# to the CPU batch of 64: 4 updates of 16 rows. What matters is > 1: with one mini-batch the
# old policy is the current one, every ratio is 1 and the clip never acts.
_MINIBATCHES = (
    "DAPO/VAPO: 16 updates per rollout batch (8192 responses, mini-batches of 512); scaled "
    "to the CPU batch of 64: 4 mini-batches of 16 rows. > 1 so that the PPO ratio moves and "
    "clip-higher acts"
)
_SAO_CRITIC = (
    Setting(
        "critic.lr",
        5e-4,
        f"{_SAO}: critic lr 5x the policy lr (5e-6 vs 1e-6); here 5x "
        "learner.lr's default 1e-4 (set both at other scales)",
    ),
    Setting("critic.updates_per_step", 2, f"{_SAO}: K = 2 critic updates per policy step"),
    Setting("critic.warmup_steps", 10, f"{_SAO}: 10 critic-only steps at the start"),
    Setting("critic.freeze", "attention", f"{_SAO}: critic attention frozen during RL"),
    Setting("algorithm.lambda_mode", "adaptive", f"{_SAO}: length-adaptive lambda_policy"),
    Setting("algorithm.lambda_alpha", 1.5, f"{_SAO}: alpha = 1.5"),
    Setting("algorithm.lambda_critic", 1.0, f"{_SAO}: value targets with lambda = 1"),
)
_SINGLE = (
    Setting("algorithm.minibatches", 1, f"{_SAO}: one optimizer step per batch of 128"),
    Setting("algorithm.group_sampling", False, f"{_SAO}: a single rollout per prompt"),
    Setting("algorithm.lm_loss_coef", 0.0, f"{_SAO}: no LM loss"),
)
_GROUPS = Setting("algorithm.group_size", 8, f"{_SAO} section 2: GRPO with 16 prompts x 8")

PRESETS: dict[str, Preset] = {
    "sao": Preset(
        "SAO: single rollout per prompt, critic with skip-observation GAE, DIS (the paper)",
        (
            Setting("algorithm.advantage", "gae", f"{_SAO} section 3: critic + GAE"),
            Setting("algorithm.policy_loss", "dis", f"{_SAO} Eqs. 1-3: DIS"),
            *_SAO_CRITIC,
            *_SINGLE,
        ),
    ),
    "grpo": Preset(
        "vanilla GRPO: groups, group-normalised advantage, PPO clip-higher",
        (
            Setting("algorithm.advantage", "group", f"{_SAO} section 2 (GRPO): group baseline"),
            Setting("algorithm.policy_loss", "ppo_clip", f"{_SAO} section 2: PPO clip-higher"),
            _GROUPS,
            Setting("algorithm.clip_eps_low", 0.2, "DAPO clip-higher: eps_low 0.2"),
            Setting("algorithm.clip_eps_high", 0.28, "DAPO clip-higher: eps_high 0.28"),
            Setting("algorithm.minibatches", 4, _MINIBATCHES),
            Setting("algorithm.lm_loss_coef", 0.0, "GRPO: no LM loss"),
        ),
    ),
    "grpo_dis": Preset(
        "GRPO's groups and advantage with SAO's DIS loss",
        (
            Setting("algorithm.advantage", "group", f"{_SAO} section 2: group baseline"),
            Setting("algorithm.policy_loss", "dis", f"{_SAO} Eqs. 1-3: DIS"),
            _GROUPS,
            Setting("algorithm.minibatches", 1, "DIS compares with the sampler: no mini-batches"),
            Setting("algorithm.lm_loss_coef", 0.0, "no LM loss"),
        ),
    ),
    "running_mean": Preset(
        "single rollout, per-prompt running-mean baseline, DIS",
        (
            Setting("algorithm.advantage", "running_mean", f"{_SAO} section 2 baseline"),
            Setting("algorithm.policy_loss", "dis", f"{_SAO} Eqs. 1-3: DIS"),
            Setting("algorithm.baseline_window", 8, f"{_SAO} section 2: last 8 rewards"),
            *_SINGLE,
        ),
    ),
    "vapo": Preset(
        "VAPO as published: value model + length-adaptive GAE, PPO clip-higher over several "
        "mini-batches, positive-example LM loss, group sampling, value pre-training",
        (
            Setting("algorithm.advantage", "gae", f"{_VAPO}: value model + GAE"),
            Setting("algorithm.policy_loss", "ppo_clip", f"{_VAPO}: PPO with Clip-Higher"),
            Setting("algorithm.clip_eps_low", 0.2, f"{_VAPO}: eps_low 0.2"),
            Setting("algorithm.clip_eps_high", 0.28, f"{_VAPO}: eps_high 0.28"),
            Setting("algorithm.minibatches", 4, _MINIBATCHES),
            Setting("algorithm.lambda_mode", "adaptive", f"{_VAPO}: length-adaptive GAE"),
            Setting("algorithm.lambda_alpha", 0.05, f"{_VAPO}: alpha = 0.05"),
            Setting("algorithm.lambda_critic", 1.0, f"{_VAPO}: decoupled GAE, critic lambda 1"),
            Setting("algorithm.lm_loss_coef", 0.1, f"{_VAPO}: positive-example LM loss, 0.1"),
            Setting("algorithm.group_sampling", True, f"{_VAPO}: group sampling"),
            Setting("algorithm.group_size", 16, f"{_VAPO}: 512 prompts x 16 samples"),
            Setting(
                "critic.lr",
                Times("learner.lr", 2.0),
                f"{_VAPO}: critic lr 2e-6 vs policy 1e-6 (2x, not SAO's 5x)",
            ),
            Setting(
                "critic.updates_per_step",
                1,
                f"{_VAPO}: one value update per policy update (no faster critic)",
            ),
            Setting("critic.freeze", "none", f"{_VAPO}: the whole value model trains"),
            Setting(
                "critic.warmup_steps",
                50,
                f"{_VAPO}: value pre-training on the fixed "
                "initial policy's rollouts with Monte-Carlo returns (lambda_critic = 1); "
                "50 steps, as implementations of the paper use",
            ),
        ),
    ),
    "sao_ppo_clip": Preset(
        "SAO's critic recipe with PPO clip-higher instead of DIS (the SAO paper's reading of "
        "vanilla VAPO without DIS); one mini-batch, so the clip does not act",
        (
            Setting("algorithm.advantage", "gae", f"{_SAO} section 3: critic + GAE"),
            Setting("algorithm.policy_loss", "ppo_clip", f"{_SAO} section 2: PPO clip-higher"),
            *_SAO_CRITIC,
            *_SINGLE,
        ),
    ),
}


def _split(key: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    return section, name


def _as_dict(section: Any) -> Any:
    # A section given as a model instance: its explicitly set fields, as a dict, so that the
    # preset fills the rest the same way as for dict input.
    fields_set = getattr(section, "model_fields_set", None)
    if fields_set is None:
        return section
    return {name: getattr(section, name) for name in fields_set}


def apply_presets(data: Any, default: Callable[[str, str], Any]) -> Any:
    """Fill in what `algorithm.name`'s preset sets and `data` leaves out.

    `data` is the root config input (`{section: {field: value}}`); `default(section, field)`
    is a field's default, used where a `Times` refers to a field `data` leaves out. An unknown
    name, or a section that is not a table, is left as it is for validation to report.
    """
    if not isinstance(data, dict):
        return data
    algorithm = data.get("algorithm", {})
    name = algorithm.get("name", "sao") if isinstance(algorithm, dict) else None
    name = getattr(algorithm, "name", name)  # a section given as a model instance
    if not isinstance(name, str) or name not in PRESETS:
        return data
    data = dict(data)
    for setting in PRESETS[name].settings:
        section, field = _split(setting.key)
        table = data[section] = _as_dict(data.get(section, {}))
        if not isinstance(table, dict) or field in table:
            continue
        value = _resolve(setting.value, data, default)
        if value is not None:
            data[section] = {**table, field: value}
    return data


def _resolve(value: Any, data: Mapping[str, Any], default: Callable[[str, str], Any]) -> Any:
    if not isinstance(value, Times):
        return value
    section, field = _split(value.key)
    table = data.get(section, {})
    base = table.get(field, default(section, field)) if isinstance(table, dict) else None
    if isinstance(base, bool) or not isinstance(base, int | float):
        return None  # an invalid base value: its own field reports it
    return value.factor * base


def algorithm_settings(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (an `[algorithm]` table) with the preset's algorithm fields filled in.

    For an `AlgorithmConfig` built on its own; under a root `Config`, `apply_presets` has
    already filled them.
    """
    name = data.get("name", "sao")
    if not isinstance(name, str) or name not in PRESETS:
        return data
    filled = dict(data)
    for setting in PRESETS[name].settings:
        section, field = _split(setting.key)
        if section == "algorithm" and field not in filled:
            filled[field] = setting.value
    return filled


def implied_settings(cfg: Any) -> dict[str, dict[str, Any]]:
    """`{section: {field: value}}` that `cfg.algorithm.name`'s preset gives, resolved on `cfg`."""
    out: dict[str, dict[str, Any]] = {}
    for setting in PRESETS[cfg.algorithm.name].settings:
        section, field = _split(setting.key)
        value = setting.value
        if isinstance(value, Times):
            base_section, base_field = _split(value.key)
            value = value.factor * getattr(getattr(cfg, base_section), base_field)
        out.setdefault(section, {})[field] = value
    return out


def _shown(value: Any) -> str:
    if isinstance(value, Times):
        return f"{value.factor:g} x {value.key}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_presets() -> str:
    """Every preset's components and where each comes from (`--help-config`)."""
    lines = [
        "algorithm.name presets: each fills the fields below unless they are set explicitly "
        "(fields a preset does not name keep their defaults, SAO's recipe)",
    ]
    for name, preset in PRESETS.items():
        lines.append(f"  {name}: {preset.summary}")
        for s in preset.settings:
            lines.append(f"      {s.key} = {_shown(s.value)}  ({s.source})")
    return "\n".join(lines) + "\n"


def preset_rows() -> list[tuple[str, str, str, str]]:
    """`(name, key, value, source)` for every setting of every preset (the docs table)."""
    return [
        (name, s.key, _shown(s.value), s.source)
        for name, preset in PRESETS.items()
        for s in preset.settings
    ]

"""The arms of `saorl compare`: built-in arms, the arm syntax, and what each arm is.

Arm syntax: a built-in name (`ARMS`), a built-in name with a mismatch correction
(`BUILTIN+CORRECTION`, e.g. `grpo+tis`, `sao+icepop`: the arm family of `algorithm.correction`,
saorl/corrections.py), or `NAME:section.field=value,section.field=value` for a custom arm (a
built-in NAME, with or without its correction, contributes its overrides first). NAME is
letters, digits, `_`, `-` and `+`.

`arm_components(cfg)` says what an arm is from its resolved config (advantage, loss, critic
recipe, mini-batches, groups), so the README table and the report's table come from the
settings actually run, not from a description that could drift from them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

from saorl.config import Config, ConfigError, load_config, parse_override
from saorl.config.algorithm import AlgorithmConfig

# From the config's field, not saorl.corrections: this module must load without torch.
CORRECTIONS: tuple[str, ...] = get_args(AlgorithmConfig.model_fields["correction"].annotation)

ARMS: dict[str, tuple[str, ...]] = {
    "sao": ("algorithm.name=sao",),
    "grpo": ("algorithm.name=grpo",),
    "grpo_dis": ("algorithm.name=grpo_dis",),
    "running_mean": ("algorithm.name=running_mean",),
    "vapo": ("algorithm.name=vapo",),
    # The SAO paper's "vanilla VAPO without DIS" reading: SAO's critic, PPO clip instead of DIS.
    "sao_ppo_clip": ("algorithm.name=sao_ppo_clip",),
    # SAO ablations: each removes one ingredient of the critic recipe (docs/design.md section 1.3).
    "sao_no_freeze": ("algorithm.name=sao", "critic.freeze=none"),
    "sao_k1": ("algorithm.name=sao", "critic.updates_per_step=1"),
    "sao_fixed_lambda": ("algorithm.name=sao", "algorithm.lambda_mode=fixed"),
    "sao_no_warmup": ("algorithm.name=sao", "critic.warmup_steps=0"),
    # Choices the paper leaves open (docs/algorithms.md): Reef's per-sample loss aggregation,
    # and GRPO without the std division (Dr. GRPO's advantage).
    "sao_seq_mean": ("algorithm.name=sao", "algorithm.loss_agg=seq_mean_token_mean"),
    "grpo_no_std": ("algorithm.name=grpo", "algorithm.group_std_norm=false"),
}
DEFAULT_ARMS = ("sao", "grpo", "grpo_dis", "running_mean", "vapo")
ABLATIONS = ("sao_no_freeze", "sao_k1", "sao_fixed_lambda", "sao_no_warmup")

_ARM_NAME = re.compile(r"^[A-Za-z0-9_+-]+$")
_ARM_START = re.compile(r"^\s*[A-Za-z0-9_+-]+\s*(:|$)")  # "sao" or "name:..." starts an arm
_OVERRIDE_START = re.compile(r"^\s*[A-Za-z_]\w*\.[A-Za-z_]\w*\s*=")


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison: its directory name and the overrides that define it."""

    name: str
    overrides: tuple[str, ...]


def _join_pieces(pieces: Sequence[str], starts: re.Pattern[str]) -> list[str]:
    """Re-join comma-split pieces: a piece that does not match `starts` continues the last one.

    This is what lets a list value keep its commas: `rollout.stop=["a","b"]`.
    """
    out: list[str] = []
    for piece in pieces:
        if out and not starts.match(piece):
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def split_arms(text: str) -> list[str]:
    """Split `--arms sao,grpo,mine:critic.lr=1e-3,learner.lr=1e-5` into arm specs."""
    return [s.strip() for s in _join_pieces(text.split(","), _ARM_START) if s.strip()]


def parse_arm(spec: str) -> Arm:
    """`NAME` (built-in) or `NAME:key=value,key=value`; raises ConfigError naming the problem.

    Override keys are checked here, so a typo fails before the first arm trains for an hour;
    values are checked when the arm's config is built.
    """
    name, sep, rest = (part.strip() for part in spec.partition(":"))
    if not _ARM_NAME.match(name):
        raise ConfigError(
            f"arm {spec!r}: the name must be letters, digits, '_', '-' or '+' (it names a "
            "directory)"
        )
    base = _builtin_overrides(name)
    if not sep and base is None:
        raise ConfigError(
            f"unknown arm {name!r}: built-in arms are {', '.join(ARMS)}; "
            "a built-in with a correction is BUILTIN+CORRECTION (corrections: "
            f"{', '.join(c for c in CORRECTIONS if c != 'none')}); "
            "a custom arm is NAME:section.field=value,section.field=value"
        )
    own = [s.strip() for s in _join_pieces(rest.split(","), _OVERRIDE_START) if s.strip()]
    for item in own:
        parse_override(item)
    if sep and not own:
        raise ConfigError(f"arm {spec!r}: no overrides after ':'")
    return Arm(name, (*(base or ()), *own))


def _builtin_overrides(name: str) -> tuple[str, ...] | None:
    """A built-in arm's overrides, `BUILTIN+CORRECTION`'s with the correction added; None for a
    name that is neither."""
    if name in ARMS:
        return ARMS[name]
    builtin, plus, correction = name.partition("+")
    if plus and builtin in ARMS and correction in CORRECTIONS and correction != "none":
        return (*ARMS[builtin], f"algorithm.correction={correction}")
    return None


def parse_arms(specs: Sequence[str]) -> list[Arm]:
    """Parse every spec; names must be unique because each names a run directory."""
    arms = [parse_arm(s) for s in specs]
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"arm names must be unique, repeated: {', '.join(dupes)}")
    if not arms:
        raise ConfigError("no arms to compare")
    return arms


COMPONENTS = ("advantage", "loss", "critic", "minibatches", "groups")


def arm_components(cfg: Config) -> dict[str, str]:
    """What an arm is, from its resolved config: one short text per column of `COMPONENTS`."""
    a = cfg.algorithm
    c = cfg.critic
    if a.advantage == "gae":
        lam = (
            f"adaptive lambda, alpha {a.lambda_alpha:g}"
            if a.lambda_mode == "adaptive"
            else f"fixed lambda {a.lambda_policy:g}"
        )
        advantage = f"gae ({lam}; critic lambda {a.lambda_critic:g})"
        frozen = "attention frozen" if c.freeze == "attention" else "all trains"
        critic = (
            f"lr {c.lr / cfg.learner.lr:g}x policy, K={c.updates_per_step}, {frozen}, "
            f"{c.warmup_steps} warm-up steps"
        )
    else:
        advantage = "group ((R - mean) / std within the group)"
        if not a.group_std_norm:
            advantage = "group (R - mean within the group, no std)"
        if a.advantage == "running_mean":
            advantage = f"running_mean (R - mean of the prompt's last {a.baseline_window})"
        critic = "none"
    if a.policy_loss == "dis":
        loss = f"dis (band {a.eps_low:g}/{a.eps_high:g})"
    else:
        loss = f"ppo_clip ({a.clip_eps_low:g}/{a.clip_eps_high:g})"
    if a.correction != "none":
        loss += f" + {a.correction} correction"
    if a.lm_loss_coef:
        loss += f" + LM loss {a.lm_loss_coef:g} on correct samples"
    if a.loss_agg != "token_mean":
        loss += f", {a.loss_agg}"
    n = a.samples_per_prompt
    groups = "1 (single rollout)" if n == 1 else f"{n} per prompt"
    if n > 1 and a.advantage != "group":
        groups += " (group sampling)"
    return {
        "advantage": advantage,
        "loss": loss,
        "critic": critic,
        "minibatches": str(a.minibatches),
        "groups": groups,
    }


def components_table(arms: Sequence[str], overrides: Sequence[str] = ()) -> str:
    """A markdown table `arm | advantage | loss | critic | mini-batches | groups` of built-in
    arms on the defaults (plus `overrides`), as the README and docs/algorithms.md show it."""
    lines = [
        "| arm | advantage | loss | critic | mini-batches | rollouts per prompt |",
        "|---|---|---|---|---|---|",
    ]
    for name in arms:
        parts = arm_components(load_config(None, [*overrides, *ARMS[name]]))
        lines.append(f"| `{name}` | " + " | ".join(parts[k] for k in COMPONENTS) + " |")
    return "\n".join(lines)

"""What a run's step budget buys: critic-only steps first, then policy updates; and what the
built-in model can learn at all.

`critic.warmup_steps` count within `run.total_steps` (docs/design.md section 1.3), so a short
run may update the critic only: its `final/` is then the initial policy. `saorl train` warns at
start when a run makes no or few policy updates, and `summary.json` reports `policy_updates`
and `critic_only_steps`; reports shade the critic-only phase.
"""

from __future__ import annotations

import sys

from saorl.config import Config


def critic_only_steps(cfg: Config, steps: int | None = None) -> int:
    """Steps (of the first `steps`, default the run's) that update only the critic."""
    steps = cfg.run.total_steps if steps is None else steps
    warm = cfg.critic.warmup_steps if cfg.algorithm.advantage == "gae" else 0
    return min(warm, steps)


def policy_updates(cfg: Config, steps: int | None = None) -> int:
    """Steps (of the first `steps`, default the run's) that update the policy."""
    steps = cfg.run.total_steps if steps is None else steps
    return steps - critic_only_steps(cfg, steps)


def warn_short_run(cfg: Config) -> str | None:
    """The warning (printed to stderr) for a run whose budget is mostly critic-only, else None."""
    total = cfg.run.total_steps
    warm = critic_only_steps(cfg)
    updates = total - warm
    if warm == 0 or updates * 2 > total:
        return None
    fix = "raise run.total_steps or lower critic.warmup_steps"
    if updates == 0:
        text = (
            f"run.total_steps={total} is within critic.warmup_steps={cfg.critic.warmup_steps}"
            f": this run never updates the policy (final/ is the initial policy); {fix}"
        )
    else:
        text = (
            f"only {updates} of run.total_steps={total} steps update the policy (the first "
            f"{warm} are critic.warmup_steps, critic only); {fix}"
        )
    print(f"saorl: warning: {text}", file=sys.stderr, flush=True)
    return text


# Tasks the built-in tiny model is made for: its supervised warm-up and its char tokenizer.
TINY_TASKS = ("arithmetic", "tool_arithmetic")


def warn_tiny_model(cfg: Config) -> str | None:
    """The warning for the built-in 0.5M-parameter model on a task it was not made for (a
    dataset, an agent program, an environment server): it knows only what its warm-up taught
    it, so its reward there is usually 0 from the first step to the last."""
    # An agent program's tasks are those of env.agent.tasks (the built-in ones included).
    task = cfg.env.agent.tasks if cfg.env.name == "agent" else cfg.env.name
    if cfg.model.name_or_path != "builtin:tiny" or task in TINY_TASKS:
        return None
    text = (
        f"model.name_or_path = 'builtin:tiny' is a 0.5M-parameter random-init model with a "
        f"character tokenizer: it knows only what its supervised warm-up teaches it (on the "
        f"default task, 2-digit sums); on env.name = {cfg.env.name!r} without such a warm-up "
        "expect a reward near 0. A real pretrained chat model "
        "learns on 2 CPU cores: model.name_or_path=smollm2-135m (saorl train --config "
        "examples/real_model.toml; docs/real-model.md)"
    )
    print(f"saorl: warning: {text}", file=sys.stderr, flush=True)
    return text

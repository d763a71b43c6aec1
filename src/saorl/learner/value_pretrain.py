"""`saorl value-pretrain`: fit the critic on rollouts of the initial policy before RL.

The paper initialises the critic from the policy and pre-trains it on a value corpus: rollouts
of the initial policy with their outcomes. Here: build the policy exactly as `saorl train` would
(same seed, same supervised warm-up), roll it out on training prompts, hold a fraction of the
rollouts out, fit the critic on the rest with the training run's own value loss (frozen
attention honoured, K updates per batch), report explained variance on the held-out rollouts
before and after, and save the critic. `saorl train critic.init_from=PATH` starts from it.

The in-run form of the same idea is `critic.warmup_steps`: critic-only steps on rollouts of the
still-fixed initial policy (the `vapo` preset uses 50, VAPO's value pre-training).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from saorl.config import Config, ConfigError, config_to_toml
from saorl.envs.factory import build_env
from saorl.evaluation.held_out import run_episodes
from saorl.learner.learner import Learner
from saorl.learner.sharding import StepMetrics
from saorl.losses import value_loss
from saorl.models.loading import load_policy, resolve_device
from saorl.monitoring.metrics import TrainProgress
from saorl.rollout.episode import UNTRAINABLE
from saorl.security.safe_io import atomic_write
from saorl.types import Batch


def _explained_variance(learner: Learner, batches: list[Batch]) -> float:
    """Explained variance of the critic's values against the value targets the training step
    uses (`saorl.learner.critic_updater.gae_targets`), over the action tokens of all `batches`."""
    values = []
    returns = []
    masks = []
    for b in batches:
        v, ret = learner.critic_updater.evaluate(b)
        values.append(v)
        returns.append(ret)
        masks.append(b.action_mask.to(v.device))
    flat = [torch.cat([x.flatten() for x in xs]) for xs in (values, returns, masks)]
    return value_loss(flat[0][None], flat[1][None], flat[2][None])[1]["value/explained_variance"]


def fit_critic(learner: Learner, batch: Batch) -> dict[str, float]:
    """Steps 1-3 of `Learner.step` alone: values before the update, value targets with
    `lambda_critic`, K critic updates; the policy and the learner's counters stay."""
    critic = learner.critic_updater
    critic.prepare(batch)
    critic.start_update()
    m = StepMetrics()
    m.add("loss/value", critic.finish().loss)
    return learner.sharding.floats(m)


def _check_arguments(out: Path, rollouts: int, epochs: int) -> None:
    if rollouts < 2:
        raise ConfigError(f"--rollouts must be >= 2 (one held out, one to fit), got {rollouts}")
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file, e.g. {out / 'critic.pt'}")
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {out}: cannot write there ({existing} is not a writable folder)")


def value_pretrain(
    cfg: Config, out: Path, rollouts: int = 1024, epochs: int = 3, heldout_frac: float = 0.2
) -> dict[str, Any]:
    _check_arguments(out, rollouts, epochs)  # before minutes of rollouts, not after
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    policy, tokenizer = load_policy(cfg.model)
    spec = build_env(cfg.env)
    learner = Learner(cfg, policy, resolve_device(cfg.model.device))
    with TrainProgress(1, enabled=cfg.run.progress) as progress:
        if cfg.learner.sft_steps:  # the warm-up `saorl train` runs, same seed
            learner.warm_up(spec, tokenizer, progress)
    rng = random.Random(cfg.run.seed + 7)
    problems = [spec.task.sample(rng) for _ in range(rollouts)]
    trajs = run_episodes(learner.policy, tokenizer, spec, problems, cfg, seed=cfg.run.seed + 7)
    trajs = [t for t in trajs if t.stop_reason not in UNTRAINABLE]  # as the collector drops
    if len(trajs) < 2:
        raise ConfigError(
            f"value-pretrain: {len(trajs)} of {rollouts} rollouts ended without an environment "
            "error; nothing to fit (check the env settings)"
        )
    n_held = max(1, int(len(trajs) * heldout_frac))
    held = trajs[:n_held]
    train = trajs[n_held:]
    bs = cfg.learner.batch_size
    pad = tokenizer.pad_token_id
    held_batches = [Batch.from_trajectories(held[i : i + bs], pad) for i in range(0, n_held, bs)]
    ev_before = _explained_variance(learner, held_batches)
    train_rng = random.Random(cfg.run.seed + 8)
    losses = []
    for _ in range(epochs):
        train_rng.shuffle(train)
        for i in range(0, len(train), bs):
            m = fit_critic(learner, Batch.from_trajectories(train[i : i + bs], pad))
            losses.append(m["loss/value"])
    ev_after = _explained_variance(learner, held_batches)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all: a kill mid-write must not leave a torn critic file behind.
    with atomic_write(out) as f:
        torch.save({"critic": learner.critic.state_dict(), "config": config_to_toml(cfg)}, f)
    return {
        "rollouts": len(trajs),
        "heldout": n_held,
        "reward_mean": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "explained_variance_before": ev_before,
        "explained_variance_after": ev_after,
        "value_loss_first": losses[0] if losses else None,
        "value_loss_last": losses[-1] if losses else None,
        "critic_path": str(out),
    }

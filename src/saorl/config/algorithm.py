"""The `[algorithm]` section: advantages, the policy loss, KL, entropy, mismatch corrections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from saorl.config.base import _Section
from saorl.config.presets import algorithm_settings


class AlgorithmConfig(_Section):
    """The RL objective: DIS band, GAE and optional regularisers (paper Eqs. 1-3)."""

    name: Literal["sao", "grpo", "grpo_dis", "running_mean", "vapo", "sao_ppo_clip"] = Field(
        "sao",
        description="preset of the algorithm's recipe (docs/algorithms.md; each component "
        "with its source: saorl train --help-config): 'sao' = gae + dis, single rollouts "
        "(paper); baselines: 'grpo' = group + ppo_clip over 4 mini-batches, 'grpo_dis' = group "
        "+ dis, 'running_mean' = running_mean + dis, 'vapo' = VAPO as published (gae with alpha "
        "0.05 + ppo_clip over 4 mini-batches + LM loss on correct samples + groups of 16 + its "
        "critic recipe), 'sao_ppo_clip' = SAO's critic recipe with ppo_clip instead of dis; "
        "fields set explicitly win over the preset",
    )
    advantage: Literal["gae", "group", "running_mean"] = Field(
        "gae",
        description="advantage estimator, default from name: 'gae' = critic values + "
        "skip-observation GAE (paper section 3); 'group' = (R - group mean) / (group std + "
        "1e-6) over group_size rollouts per prompt (GRPO); 'running_mean' = R - mean of the "
        "prompt's last baseline_window rewards",
    )
    policy_loss: Literal["dis", "ppo_clip"] = Field(
        "dis",
        description="policy loss, default from name: 'dis' = DIS on the ratio to the engine's "
        "recorded log-probs, band eps_low/eps_high (paper Eqs. 1-3); 'ppo_clip' = PPO "
        "clip-higher on the ratio to the old policy (recomputed by the learner), "
        "clip_eps_low/clip_eps_high",
    )
    group_size: int = Field(
        8,
        ge=2,
        description="rollouts per prompt for advantage 'group' and for group_sampling; paper: "
        "GRPO 16 prompts x 8; VAPO 512 prompts x 16",
    )
    group_std_norm: bool = Field(
        True,
        description="advantage 'group': divide by the group's std (GRPO, the paper); false = "
        "R - group mean only (Dr. GRPO, Liu et al. 2025)",
    )
    group_sampling: bool = Field(
        False,
        description="sample group_size rollouts per prompt also for a per-sample advantage "
        "(gae, running_mean): VAPO's group sampling; advantage 'group' always samples groups",
    )
    clip_eps_low: float = Field(
        0.2, gt=0, description="PPO clip-higher lower half-width (ppo_clip); paper: 0.2"
    )
    clip_eps_high: float = Field(
        0.28, gt=0, description="PPO clip-higher upper half-width (ppo_clip); paper: 0.28"
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="policy optimizer steps per batch, one per mini-batch; with ppo_clip the "
        "old policy is the weights at the start of the batch, so the clip acts only when > 1; "
        "presets grpo/vapo: 4 (DAPO/VAPO: 16 of 512 per 8192-response batch)",
    )
    lm_loss_coef: float = Field(
        0.0,
        ge=0,
        description="weight of the positive-example LM loss added to the policy loss: NLL of "
        "the action tokens of rows whose outcome reward >= lm_loss_min_reward; VAPO: 0.1; "
        "SAO paper: none",
    )
    lm_loss_min_reward: float = Field(
        1.0,
        description="outcome reward from which a row counts as correct for the LM loss; 1.0 = "
        "a right answer on the built-in tasks and the math env",
    )
    baseline_window: int = Field(
        8, ge=1, description="rewards per prompt in the running-mean baseline; paper: 8"
    )
    baseline_scope: Literal["prompt", "prompt_then_global", "global"] = Field(
        "prompt",
        description="running-mean baseline over: 'prompt' = that prompt's last baseline_window "
        "rewards, a first visit gets advantage 0 (paper); 'global' = the last "
        "baseline_global_window rewards of all prompts (paper's global variant, section 2); "
        "'prompt_then_global' = the prompt's window, the global one on a first visit",
    )
    baseline_global_window: int = Field(
        128,
        ge=1,
        description="rewards of all prompts in the global running-mean window; paper: 128",
    )
    eps_low: float = Field(
        0.3,
        gt=0,
        description="DIS band: ratio <= 1-eps_low gets zero gradient; paper: math 0.3, code 0.8",
    )
    eps_high: float = Field(
        5.0,
        gt=0,
        description="DIS band: ratio >= 1+eps_high gets zero gradient; paper: math 5.0, code 3.0",
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = Field(
        "token_mean",
        description="token_mean = sum over the batch's action tokens / their count; "
        "seq_mean_token_mean = mean of per-trajectory means; project choice",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount per action token; paper: 1.0")
    lambda_mode: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive = 1 - 1/(lambda_alpha * action tokens) (paper, VAPO); fixed uses "
        "lambda_policy",
    )
    lambda_policy: float = Field(
        0.95, ge=0, le=1, description="GAE lambda of policy advantages when lambda_mode='fixed'"
    )
    lambda_alpha: float = Field(
        1.5, gt=0, description="alpha of the length-adaptive lambda; SAO paper: 1.5; VAPO: 0.05"
    )
    lambda_critic: float = Field(
        1.0, ge=0, le=1, description="GAE lambda of the critic's value targets; paper: 1.0"
    )
    skip_observations: bool = Field(
        True,
        description="GAE runs over action tokens only, skipping observation tokens (paper); "
        "false = over every completion token, and the critic is trained on all of them",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="per-token k3 KL penalty coefficient (TRL's beta), against kl_reference; "
        "paper: 0 (none)",
    )
    kl_reference: Literal["sampler", "initial"] = Field(
        "sampler",
        description="what kl_coef penalises the policy's distance to: 'sampler' = the policy "
        "that sampled each token (KL(sampler || current) from the engine's recorded log-probs, "
        "no extra work); 'initial' = a frozen copy of the policy as RL starts (KL(current || "
        "initial): TRL's ref_model, verl's use_kl_loss; one more forward pass a micro-batch, "
        "one more copy of the weights, kept in checkpoints; not with learner.fsdp)",
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="per-token entropy bonus coefficient; paper: 0 (none)"
    )
    correction: Literal["none", "tis", "token_mis", "seq_mis", "icepop", "geo_rs"] = Field(
        "none",
        description="rollout-trainer mismatch correction weighting each token's policy loss by "
        "rho = trainer / engine probability (saorl/corrections.py, docs/algorithms.md): tis, "
        "token_mis, seq_mis, icepop, geo_rs; SAO paper: none (DIS is its correction)",
    )
    correction_low: float | None = Field(
        None, ge=0, description="lower edge of the correction's kept band; unset = its preset"
    )
    correction_high: float | None = Field(
        None, gt=0, description="upper edge of the band (tis: the cap); unset = its preset"
    )
    routing_replay: bool = Field(
        False,
        description="MoE policies: the engine records the experts it routed each token to and "
        "the learner's forward uses them (R3; docs/scale-out.md); with rollout.engine 'vllm' "
        "the engine runs eager and computes every prompt (no prefix-cache reads)",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        # The preset's fields of this section, for an AlgorithmConfig built on its own (under a
        # root Config they are already filled); an unknown name is left for the field's error.
        return algorithm_settings(data) if isinstance(data, dict) else data

    @property
    def samples_per_prompt(self) -> int:
        """Rollouts drawn per prompt: group_size for groups or group sampling, else 1."""
        grouped = self.advantage == "group" or self.group_sampling
        return self.group_size if grouped else 1

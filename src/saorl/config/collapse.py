"""The `[collapse]` section: thresholds of live collapse detection."""

from __future__ import annotations

from pydantic import Field, field_validator

from saorl.config.base import _Section


class CollapseConfig(_Section):
    """Live collapse detection (`saorl.monitoring.collapse`): thresholds of the collapse/* signals.

    Each signal must hold on `patience` consecutive steps to fire; nothing fires before a
    metric has `window` values. Spike factors of 0 switch that signal off.
    """

    window: int = Field(
        20,
        ge=1,
        description="steps in the moving averages (reward, entropy, length); the first window "
        "values of a metric set its initial level, and none of its signals fires before",
    )
    patience: int = Field(
        3, ge=1, description="consecutive steps (evaluations: 2) a signal must hold to fire"
    )
    baseline_window: int = Field(
        50,
        ge=2,
        description="steps in the trailing median a spike is measured against (or the whole "
        "run's median, when higher)",
    )
    reward_drop: float = Field(
        0.5,
        ge=0,
        description="reward crash: the moving average falls below its best by more than this x "
        "(best - initial level) and by more than reward_noise per-step noise sds",
    )
    reward_noise: float = Field(
        2.5,
        ge=0,
        description="reward crash: the smallest drop, in standard deviations of one step's "
        "reward (from the run's step-to-step differences); makes the rule scale-free",
    )
    eval_drop: float = Field(
        0.5,
        ge=0,
        le=1,
        description="eval drop: eval/accuracy below this x its best at two evaluations in a "
        "row (the last evaluation alone at the end of a run)",
    )
    eval_min_best: float = Field(
        0.05, ge=0, description="eval drop only judged once the best eval/accuracy is this high"
    )
    entropy_low: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="entropy collapse: moving average of policy/entropy below this x its "
        "initial level (healthy sharpening measured down to 0.14)",
    )
    entropy_high: float = Field(
        3.0,
        ge=0,
        description="entropy explosion: policy/entropy above this x its median; 0 = off",
    )
    length_low: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="length collapse: moving average of rollout/response_len_mean below this x "
        "its initial level",
    )
    length_high: float = Field(
        4.0,
        ge=0,
        description="length explosion: rollout/response_len_mean above this x its trailing "
        "median (a jump; slow growth does not fire); 0 = off",
    )
    grad_norm_spike: float = Field(
        10.0,
        ge=0,
        description="policy/grad_norm (before clipping) above this x its median; 0 = off",
    )
    kl_spike: float = Field(
        10.0,
        ge=0,
        description="dis/kl_k3 or ppo/kl_k3 (policy vs sampler) and mismatch/k3 (learner vs "
        "engine) above this x their level (the larger of their median and the upper decile of "
        "their last baseline_window values) + kl_floor; 0 = off",
    )
    kl_floor: float = Field(
        0.05,
        ge=0,
        description="nats added to the KL spike threshold (a healthy SAO run on the tool task "
        "at staleness 8 had dis/kl_k3 of 0.01-0.04 for several steps in a row)",
    )
    mismatch_floor: float = Field(
        1e-3,
        ge=0,
        description="nats added to the mismatch spike threshold (learner vs engine on the same "
        "weights: about 1e-13 in float32 on CPU)",
    )
    spike_instant: float = Field(
        10.0,
        ge=0,
        description="a spike whose value exceeds this x its threshold fires at once, without "
        "patience (one step of 7 nats KL with a 100x gradient norm is an event, not noise); "
        "0 = off",
    )
    masked_frac_spike: float = Field(
        3.0,
        ge=0,
        description="dis/masked_frac (or ppo/clip_frac) above this x its median + "
        "masked_frac_floor; 0 = off",
    )
    masked_frac_floor: float = Field(
        0.1,
        ge=0,
        le=1,
        description="fraction of tokens added to the masked-fraction threshold (the default "
        "SAO run's dis/masked_frac swings between 0.01 and 0.12 from step to step)",
    )
    ess_low: float = Field(
        0.0,
        ge=0,
        le=1,
        description="ESS collapse: corr/ess_raw (normalised effective sample size of the "
        "importance ratios, 1 = on-policy) below this; 0 = off, the default: the healthy "
        "default run (staleness 4) dips to 0.59 for 4 steps, as low as a collapsing run of the "
        "stability lab (examples/lab_reasoning_gym.toml sets 0.85)",
    )
    critic_clip_x: float = Field(
        0.0,
        ge=0,
        description="critic clipped: critic/grad_norm_over_clip (the critic's gradient norm "
        "before clipping, in units of critic.grad_clip) above this for patience steps; 0 = off "
        "(published SAO post-mortems: a collapsed run's critic was clipped 7-70x)",
    )
    critic_ev_steps: int = Field(
        0,
        ge=0,
        description="critic not explaining: value/explained_variance below 0 (worse than "
        "predicting the mean return) for this many steps in a row; 0 = off",
    )
    gap_rise: float = Field(
        10.0,
        ge=0,
        description="mismatch rise: moving average of gap/k3_stale0 (or mismatch/k3; learner vs "
        "engine on the same weights) above this x its initial level + mismatch_floor; 0 = off",
    )

    @field_validator(
        "entropy_high", "length_high", "grad_norm_spike", "kl_spike", "masked_frac_spike"
    )
    @classmethod
    def _check_factor(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError(f"must be 0 (off) or greater than 1 (a factor), got {value}")
        return value

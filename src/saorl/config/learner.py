"""The `[learner]` section: the policy optimizer, batches, staleness, pushes, supervised warm-up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from saorl.config.base import _Section


class LearnerConfig(_Section):
    """Policy optimisation, batching and asynchrony limits."""

    lr: float = Field(1e-4, gt=0, description="policy AdamW learning rate; paper: 1e-6")
    weight_decay: float = Field(0.0, ge=0, description="policy AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm of a policy update")
    batch_size: int = Field(
        64, ge=1, description="trajectories per optimizer step; paper: 128 (from 128 prompts)"
    )
    micro_batch_size: int = Field(
        64, ge=1, description="trajectories per forward/backward pass (gradient accumulation)"
    )
    micro_batch_tokens: int = Field(
        0,
        ge=0,
        description="tokens per packed forward/backward pass: the rows of a micro-batch run as "
        "one row without padding; 0 = padded micro-batches of micro_batch_size rows",
    )
    fsdp: bool = Field(
        False,
        description="shard policy and critic with FSDP2 over the ranks of the initialised "
        "torch.distributed group (run under torchrun); ignored without one",
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none",
        description="compute precision of the learner's forward/backward passes: 'bf16' = "
        "bfloat16 compute, weights and optimizer state in model.dtype (FSDP2: "
        "MixedPrecisionPolicy with float32 gradient reduction; one process: torch.autocast, "
        "CPU included); 'none' = model.dtype throughout",
    )
    max_staleness: int = Field(
        4, ge=0, description="policy versions a trajectory may lag; staler ones are dropped"
    )
    push_every: int = Field(
        1,
        ge=1,
        description="policy versions (policy optimizer steps taken) between weight pushes to "
        "the engines: a push once this many have passed since the last one; design: 1",
    )
    lr_warmup_steps: int = Field(
        20,
        ge=0,
        description="policy updates over which the policy lr ramps linearly from 0 (Adam's "
        "first steps move every weight by ~lr whatever the signal); a CPU-demo departure: the "
        "paper states none, so paper-settings configs set 0",
    )
    max_nonfinite_in_a_row: int = Field(
        5,
        ge=1,
        description="learner steps in a row with a NaN/Inf gradient (skipped, weights unchanged) "
        "after which the run stops with an error",
    )
    sft_steps: int = Field(
        500, ge=0, description="supervised warm-up steps on the built-in task before RL; 0 = none"
    )
    sft_lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the supervised warm-up")
    sft_batch_size: int = Field(64, ge=1, description="examples per supervised warm-up step")
    sft_cache: str = Field(
        "",
        description="directory where the supervised warm-up's weights are kept and reused by "
        "runs with the same model, env, sft_* settings and seed (`saorl compare` sets it: one "
        "warm-up per seed for all its arms); '' = always train it",
    )

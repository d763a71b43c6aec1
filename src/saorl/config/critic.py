"""The critic's section (`[critic]`): the value model that replaces GRPO's group baseline."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from saorl.config.base import _Section


class CriticConfig(_Section):
    """The value model that replaces GRPO's group baseline."""

    lr: float = Field(
        5e-4,
        gt=0,
        description="critic AdamW learning rate; paper: 5e-6 (5x policy); preset vapo: 2 x "
        "learner.lr (VAPO: 2e-6 vs 1e-6)",
    )
    name_or_path: str = Field(
        "policy",
        description="the critic's model: 'policy' = a copy of the policy's backbone, made "
        "again after the warm-up (paper); or a Hugging Face directory or hub id of another "
        "(smaller) model with the policy's tokenizer (AsyPPO-style mini-critic), used as loaded",
    )
    init_from: str = Field(
        "",
        description="critic checkpoint written by `saorl value-pretrain`; '' = initialise "
        "from the policy (paper: value pre-training corpus, section 3)",
    )
    updates_per_step: int = Field(
        2, ge=1, description="critic optimizer steps per policy step; paper: K=2; VAPO: 1"
    )
    warmup_steps: int = Field(
        10,
        ge=0,
        description="critic-only steps at the start, within run.total_steps, on rollouts of the "
        "fixed initial policy (in-run value pre-training); paper: 10; preset vapo: 50",
    )
    freeze: Literal["attention", "none"] = Field(
        "attention",
        description="attention = critic attention frozen during RL (paper); none = all trains "
        "(VAPO)",
    )
    value_clip: float | None = Field(
        None, gt=0, description="clip values to old values +- this (reward units); unset = no clip"
    )
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm of a critic update")
    optimizer_offload: bool = Field(
        False,
        description="keep the critic's AdamW state and float32 master weights in CPU memory "
        "(the step runs there; weights are copied back): frees AdamW's two moments per critic "
        "parameter from accelerator memory; single-process learner only (not learner.fsdp); "
        "on CPU nothing is freed",
    )
    weight_decay: float = Field(0.0, ge=0, description="critic AdamW weight decay")
    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA rank of the critic's backbone adapters (targets and dropout from "
        "model.lora_*); 0 = full fine-tuning; the value head always trains fully",
    )
    lora_alpha: float = Field(
        32.0, gt=0, description="critic LoRA scale numerator (lora_alpha / lora_rank)"
    )
    concurrent: bool | Literal["auto"] = Field(
        "auto",
        description="run the critic's K updates beside the policy update (after the "
        "advantages; same numbers): on a thread of their own in one process, over a process "
        "group of their own with learner.fsdp; a step then takes the longer of the two, not the "
        "sum. 'auto' = on where it pays: the critic on a device of its own, or a CPU with a "
        "core to spare for it; off where both would share one GPU (both updates' activations "
        "at once), with learner.fsdp or under run.deterministic; summary.json says which and why",
    )
    device: str = Field(
        "",
        description="device of the critic in one process, e.g. 'cuda:1'; '' = the learner's "
        "(model.device); with critic.concurrent a second device runs the critic's updates "
        "truly in parallel",
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value in ("", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
            return value
        raise ValueError(f"must be '', 'cpu', 'cuda' or 'cuda:N', got {value!r}")

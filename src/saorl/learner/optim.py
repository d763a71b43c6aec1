"""The learner's optimizers: fused AdamW, and the critic's AdamW in CPU memory.

`adamw` is fused where the device has the kernel, so that a non-finite gradient skips the step
on the device (`saorl.learner.sharding.step_unless_nonfinite`). `OffloadedAdamW`
(`critic.optimizer_offload`) keeps AdamW's two moments per parameter, and a float32 master copy
of every parameter, in CPU memory: after the backward pass each gradient is copied to the CPU,
AdamW steps the master copies there, and the result is copied back into the module's
parameters (in their dtype). The accelerator holds only weights and gradients, for a
device-to-host and a host-to-device copy of the weights per step. With float32 weights a step
is AdamW's exactly (the test compares them); with bfloat16 weights the master copies keep the
float32 precision that the bfloat16 weights would round away. On CPU the copies run as well
(nothing is freed); that is what the tests exercise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from saorl.config import CriticConfig

# Devices with a fused AdamW kernel that takes `found_inf` (skips an update on the device).
FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu")


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused where the parameters' device has the kernel: a fused AdamW skips a step on
    a device-side `found_inf` flag, so that whether a gradient is finite needs no host sync
    (`saorl.learner.sharding.step_unless_nonfinite`); elsewhere the plain (foreach) one."""
    fused = all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def critic_optimizer(
    params: list[torch.nn.Parameter], cfg: CriticConfig
) -> torch.optim.AdamW | OffloadedAdamW:
    """AdamW over the critic's trainable parameters (`adamw`), in CPU memory with
    `critic.optimizer_offload` (`OffloadedAdamW`); `cfg` is the `[critic]` section."""
    if cfg.optimizer_offload:
        return OffloadedAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return adamw(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


class OffloadedAdamW:
    """AdamW over CPU float32 master copies of `params`; the optimizer API the learner uses
    (`step`, `zero_grad`, `state_dict`, `load_state_dict`, `param_groups`)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float) -> None:
        self.params = list(params)
        pin = torch.cuda.is_available()  # pinned host memory: faster, asynchronous-capable copies
        self.master = [self._host(p.detach(), pin) for p in self.params]
        # Fused, like the in-device critic optimizer (`adamw` above): the same
        # arithmetic, so offloading changes where the step runs, not its rounding.
        self.inner = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay, fused=True)

    @staticmethod
    def _host(t: torch.Tensor, pin: bool) -> torch.Tensor:
        out = t.to("cpu", torch.float32, copy=True)
        return out.pin_memory() if pin else out

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def step(self) -> None:
        """Gradients to the CPU, AdamW on the master copies, weights back to the module."""
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = None if p.grad is None else p.grad.detach().to("cpu", torch.float32)
        self.inner.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                if m.grad is not None:
                    p.copy_(m)
        for m in self.master:
            m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state over the master copies, and the master copies (a checkpoint must keep
        their float32 precision: bfloat16 module weights alone would not restore them)."""
        return {"adamw": self.inner.state_dict(), "master": list(self.master)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"adamw", "master"}:
            raise KeyError(
                "the critic optimizer state was not written with critic.optimizer_offload = "
                "true; resume with the run's own setting"
            )
        masters = state["master"]
        if len(masters) != len(self.master):
            raise ValueError(f"{len(masters)} master weights in the state, {len(self.master)} here")
        with torch.no_grad():
            for m, saved in zip(self.master, masters, strict=True):
                m.copy_(saved)
        self.inner.load_state_dict(state["adamw"])

"""Advantage estimators: pure functions of tensors and scalars, plus one small stateful baseline.

- :func:`skip_observation_gae`: token-level GAE over action tokens only (SAO's critic path).
- :func:`length_adaptive_lambda`: VAPO's ``lambda = 1 - 1/(alpha * l)`` per trajectory.
- :func:`group_normalized_advantages`: GRPO's ``(R - mean) / (std + eps)`` per group.
- :class:`RunningMeanBaseline`: single-rollout ``R - mean(last k rewards)`` of that prompt, of
  all prompts, or of the prompt with the global window as its fallback.

Everything here produces constants for the losses: outputs never carry gradient.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """Common floating dtype of ``tensors``, at least float32 (bf16 GAE sums drift)."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if not dtype.is_floating_point or torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def _reverse_discounted_cumsum(x: Tensor, coef: Tensor, chunk_size: int) -> Tensor:
    """``y_k = x_k + coef * y_{k+1}`` (``y_n = 0``) along dim 1 of a ``(B, n)`` tensor.

    ``coef`` is ``(B,)``. A chunked scan: inside a chunk of ``C`` steps the recursion is the
    upper-triangular product ``y_i = sum_{j >= i} coef^(j - i) x_j`` (one batched matmul), and
    only the carry between chunks is a Python loop, ``ceil(n / C)`` iterations instead of ``n``.
    Chunking also keeps every power ``coef^e`` at ``e <= C``, which a closed-form
    ``coef^-k * cumsum(coef^j x_j)`` would not (it under/overflows on long rows).
    """
    batch, n = x.shape
    size = max(1, min(chunk_size, n))
    pad = (-n) % size
    # Zeros appended at the end contribute nothing to a reverse recursion.
    blocks = F.pad(x, (0, pad)).view(batch, -1, size)
    steps = torch.arange(size, device=x.device)
    exponent = steps[None, :] - steps[:, None]  # [i, j] = j - i
    powers = coef[:, None, None] ** exponent.clamp_min(0).to(x.dtype)
    upper = torch.where(exponent >= 0, powers, torch.zeros((), dtype=x.dtype, device=x.device))
    local = torch.einsum("bij,bkj->bki", upper, blocks)
    # y_i of a chunk also receives coef^(C - i) * (y at the start of the next chunk).
    tail = coef[:, None] ** (size - steps).to(x.dtype)
    out = torch.empty_like(local)
    carry = torch.zeros(batch, dtype=x.dtype, device=x.device)
    for blk in range(local.shape[1] - 1, -1, -1):
        out[:, blk] = local[:, blk] + tail * carry[:, None]
        carry = out[:, blk, 0]
    return out.reshape(batch, -1)[:, :n]


@torch.no_grad()
def skip_observation_gae(
    rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    gamma: float,
    lam: float | Tensor,
    *,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE that skips observation tokens (SAO critic, docs/design.md section 1).

    Over the action positions ``t_1 < ... < t_n`` of each row::

        delta_k   = r_{t_k} + gamma * V(t_{k+1}) - V(t_k),    V(t_{n+1}) = 0
        A_k       = delta_k + gamma * lambda * A_{k+1},        A_{n+1} = 0
        returns_k = A_k + V(t_k)

    so the recursion jumps from the last token of one action to the first token of the next
    and tool/environment observation tokens in between never enter it. This is textbook GAE
    (Schulman et al. 2016) applied to the subsequence of action tokens; the paper describes it
    in words, with no numbered equation. ``values[b, t]`` is the critic's estimate of the state
    just before token t is generated.

    Rewards and values at non-action positions are ignored (the outcome reward sits on the last
    action token); non-action positions get advantage 0 and return 0. Vectorised over the
    batch: each row's action tokens are compacted to the left with a cumulative index, the
    recursion runs as a chunked scan (see ``_reverse_discounted_cumsum``) and the results are
    gathered back.

    Args:
        rewards: ``(B, T)`` per-token rewards.
        values: ``(B, T)`` critic values.
        action_mask: ``(B, T)``, nonzero on action tokens.
        gamma: discount (paper: 1).
        lam: GAE lambda, a float or a ``(B,)`` tensor (e.g. :func:`length_adaptive_lambda`
            for the policy, 1 for critic targets).
        chunk_size: scan chunk length; a performance knob only, results do not depend on it.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in the common float dtype of ``rewards`` and
        ``values`` (at least float32), without gradient.
    """
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != action_mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and action_mask "
            f"{tuple(action_mask.shape)} must all be the same (B, T) shape"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    m = action_mask.bool()
    batch, _ = m.shape
    dtype = _float_dtype(rewards, values)
    device = rewards.device
    coef = gamma * _per_row(lam, batch, dtype, device)

    # One slot per position: the most action tokens a row can have, known without reading the
    # mask back from the device. Slots past a row's last action token stay 0 (see below).
    n = m.shape[1]
    advantages = torch.zeros(m.shape, dtype=dtype, device=device)
    if m.numel() == 0:
        return advantages, advantages.clone()

    # Slot k of row b holds that row's k-th action token; non-action tokens all go to a dump
    # slot n, which only ever receives zeros and is read back as 0 for non-action positions.
    slot = torch.where(m, m.cumsum(dim=1) - 1, n)
    zero = torch.zeros((), dtype=dtype, device=device)
    r_c = torch.zeros(batch, n + 1, dtype=dtype, device=device)
    v_c = torch.zeros(batch, n + 1, dtype=dtype, device=device)
    r_c.scatter_(1, slot, torch.where(m, rewards.to(dtype), zero))
    v_c.scatter_(1, slot, torch.where(m, values.to(dtype), zero))
    r_c, v_c = r_c[:, :n], v_c[:, :n]

    # Slots past a row's last action token hold V = 0, so V(t_{n+1}) = 0 and their deltas are 0.
    next_v = F.pad(v_c[:, 1:], (0, 1))
    delta = r_c + gamma * next_v - v_c
    adv_c = _reverse_discounted_cumsum(delta, coef, chunk_size)
    ret_c = adv_c + v_c

    pad_zero = (0, 1)
    advantages = torch.gather(F.pad(adv_c, pad_zero), 1, slot)
    returns = torch.gather(F.pad(ret_c, pad_zero), 1, slot)
    return advantages, returns


def _per_row(lam: float | Tensor, batch: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(lam, Tensor):
        if lam.dim() == 0:
            return lam.to(dtype=dtype, device=device).expand(batch)
        if lam.shape != (batch,):
            raise ValueError(f"lam must be a float or a ({batch},) tensor, got {tuple(lam.shape)}")
        return lam.to(dtype=dtype, device=device)
    return torch.full((batch,), float(lam), dtype=dtype, device=device)


def length_adaptive_lambda(action_mask: Tensor, alpha: float = 1.5) -> Tensor:
    """Length-adaptive GAE lambda for the policy (VAPO; SAO uses ``alpha = 1.5``).

    ``lambda_b = 1 - 1 / (alpha * l_b)`` with ``l_b`` the number of action tokens of row b
    (docs/design.md section 1), so long trajectories get lambda near 1 (low bias) and short ones a
    smaller lambda (low variance).

    The result is clamped to ``[0, 1]``: for ``alpha * l < 1`` (only possible with
    ``alpha < 1``) the formula goes negative, and a negative lambda would flip the sign of
    future TD errors, so it becomes 0 (one-step TD). A row with ``l = 0`` gets 0; it has no
    action tokens, so its lambda is never used.

    Args:
        action_mask: ``(B, T)``, nonzero on action tokens.
        alpha: VAPO's length scale, must be positive.

    Returns:
        ``(B,)`` float32 tensor on ``action_mask``'s device.
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    lengths = action_mask.bool().sum(dim=-1).to(torch.float32)
    lam = 1.0 - 1.0 / (alpha * lengths.clamp_min(1.0))
    return torch.where(lengths > 0, lam, torch.zeros_like(lam)).clamp(0.0, 1.0)


@torch.no_grad()
def group_normalized_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    weights: Tensor | None = None,
    std_norm: bool = True,
) -> Tensor:
    """GRPO outcome advantage, normalised within each group (paper section 2).

    ``A_i = (R_i - mean_g(R)) / (std_g(R) + eps)`` where ``g`` is the group of sample i and
    ``std_g`` is the population (ddof=0) standard deviation; with ``std_norm=False``
    ``A_i = R_i - mean_g(R)`` (Dr. GRPO, Liu et al. 2025: dividing by the std weighs the
    groups that are nearly all right or all wrong most). A group whose rewards are all
    equal, one-member groups included, gets exactly 0 (never NaN or a rounding residue).
    Groups are found with ``torch.unique``; statistics use ``index_add_`` in float64, so
    there is no Python loop over groups and group ids need not be contiguous or sorted.

    Args:
        rewards: ``(N,)`` scalar rewards.
        group_ids: ``(N,)`` integer group id of each sample (e.g. the prompt index).
        eps: added to the std.
        weights: ``(N,)`` each sample's weight in its group's mean and std (None: 1 each).
            The segments of an agent episode weigh 1/k each (``Batch.episode_weights``), so
            the statistics are over episodes, each counted once.
        std_norm: divide by the group's std (GRPO); False: the mean-centred reward only.

    Returns:
        ``(N,)`` advantages in ``rewards``' float dtype (float32 for integer rewards).
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both "
            "be (N,) tensors"
        )
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    r = rewards.to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1
    w = None if weights is None else weights.to(device=r.device, dtype=torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=r.device)
    if w is None:
        counts = torch.bincount(inverse, minlength=num_groups).to(torch.float64)
    else:
        counts = zeros.clone().index_add_(0, inverse, w)
    mean = zeros.clone().index_add_(0, inverse, r if w is None else w * r) / counts
    dev = r - mean[inverse]
    var = zeros.clone().index_add_(0, inverse, dev**2 if w is None else w * dev**2) / counts
    gmax = torch.full_like(mean, -torch.inf).scatter_reduce_(0, inverse, r, reduce="amax")
    gmin = torch.full_like(mean, torch.inf).scatter_reduce_(0, inverse, r, reduce="amin")
    # Test constancy on the raw rewards: dev of a constant group can be a rounding residue
    # (mean of three 0.1s is not 0.1), which divided by eps would be far from 0.
    constant = (gmax == gmin)[inverse]
    scale = var.sqrt()[inverse] + eps if std_norm else torch.ones_like(dev)
    adv = torch.where(constant, torch.zeros_like(dev), dev / scale)
    return adv.to(out_dtype)


BaselineScope = Literal["prompt", "prompt_then_global", "global"]


class RunningMeanBaseline:
    """Running-mean baseline for single-rollout training (a paper baseline, section 2).

    ``advantage(key, R) = R - baseline``, then ``R`` joins the windows, so a reward is never
    compared with itself. The baseline, by ``scope``:

    - ``"prompt"`` (the paper's per-prompt baseline): the mean of the last ``window`` rewards
      seen for ``key``;
    - ``"global"`` (the paper's global variant): the mean of the last ``global_window`` rewards
      over all prompts (paper: 128), prompt history unused;
    - ``"prompt_then_global"``: the prompt's window when it has one, else the global window.
      On a dataset larger than the number of rollouts most prompts are seen once, and
      ``"prompt"`` gives every first visit advantage 0: no signal from most samples.

    No history (the first reward of a prompt under ``"prompt"``, the first reward of the run
    otherwise): the baseline is ``empty_baseline`` when given, otherwise the reward itself
    (advantage 0). The default is the conservative choice: without a baseline there is no
    unbiased signal, and a fixed baseline of 0 would reinforce every positive-reward first
    visit. Pass ``empty_baseline=0.0`` to train on first visits as plain REINFORCE does.

    ``state_dict()`` / ``load_state_dict()`` restore the windows exactly (checkpoint resume).
    """

    def __init__(
        self,
        window: int = 8,
        empty_baseline: float | None = None,
        scope: BaselineScope = "prompt",
        global_window: int = 128,
    ) -> None:
        if window < 1 or global_window < 1:
            raise ValueError(
                f"window and global_window must be >= 1, got {window}, {global_window}"
            )
        if scope not in ("prompt", "prompt_then_global", "global"):
            raise ValueError(f"scope must be prompt, prompt_then_global or global, got {scope!r}")
        self.window = window
        self.empty_baseline = empty_baseline
        self.scope = scope
        self.global_window = global_window
        self._history: dict[Hashable, deque[float]] = {}
        self._global: deque[float] = deque(maxlen=global_window)

    def baseline(self, key: Hashable) -> float | None:
        """The baseline ``key`` would get now under this scope, or None without history."""
        past = self._history.get(key) if self.scope != "global" else None
        if not past and self.scope != "prompt":
            past = self._global
        if not past:
            return None
        return sum(past) / len(past)

    def advantage(self, key: Hashable, reward: float) -> float:
        """Return ``reward - baseline(key)``, then record ``reward`` for ``key``."""
        reward = float(reward)
        base = self.baseline(key)
        if base is None:
            base = reward if self.empty_baseline is None else self.empty_baseline
        self._history.setdefault(key, deque(maxlen=self.window)).append(reward)
        self._global.append(reward)
        return reward - base

    def __len__(self) -> int:
        return len(self._history)

    def state_dict(self) -> dict[str, Any]:
        # A list of pairs rather than a dict: keys may be any hashable (tuples, ints), not
        # only strings, and insertion order is kept.
        return {
            "window": self.window,
            "empty_baseline": self.empty_baseline,
            "history": [(key, list(past)) for key, past in self._history.items()],
            "global_window": self.global_window,
            "global": list(self._global),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["window"]) != self.window:
            raise ValueError(
                f"state has window {state['window']} but this baseline has window "
                f"{self.window}; construct RunningMeanBaseline(window={state['window']})"
            )
        # Checkpoints from before the global window have none: it starts empty.
        global_window = int(state.get("global_window", self.global_window))
        if global_window != self.global_window:
            raise ValueError(
                f"state has global_window {global_window} but this baseline has "
                f"global_window {self.global_window}"
            )
        self.empty_baseline = state["empty_baseline"]
        self._history = {
            key: deque((float(r) for r in past), maxlen=self.window)
            for key, past in state["history"]
        }
        self._global = deque((float(r) for r in state.get("global", [])), maxlen=global_window)

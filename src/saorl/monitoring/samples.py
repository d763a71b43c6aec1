"""Sample dumps: a few trained trajectories, decoded, every `run.log_samples_every` steps.

A dump is due at every multiple of `run.log_samples_every` and at the run's last step (so a
run with sample logging on always ends with one). It takes the first `run.log_samples_count`
trajectories of that step's batch (completion order) and appends one JSON object per trajectory
to `run_dir/samples.jsonl`:

    step, index (row in the batch), prompt (decoded), turns ([{role, text}]: "model" for the
    tokens the policy wrote, "observation" for tool and environment output, from the loss
    mask), reward, staleness (policy versions, as trained), stop_reason, prompt_key, group_id,
    action_tokens, observation_tokens, versions ([oldest, newest] policy version of its action
    tokens), info (the agent loop's scalars: turns, tool_calls, ...), advantage (this
    trajectory's advantages over its action tokens: mean, min, max; null where the learner
    reports none), batch_advantage (the step's `advantage/*` metrics)

The per-row advantages come from the learner in the step's metrics, under
`sample/advantage_{mean,min,max}/<row>` keys for the first `log_samples_count` rows at a due
step only: they travel in the same single device-to-host transfer as every other metric of the
step (through every learner topology) and are taken out of the metrics (`pop_row_advantages`)
before the metrics row is written, so metrics.jsonl keeps the same columns on every step.

and hands the same rows to the trackers as a table (`MetricsLogger.log_samples`). A resumed
run drops the rows past its checkpoint first, as it does for metrics.jsonl.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saorl.monitoring.metrics import MetricsLogger
from saorl.security.safe_io import open_write
from saorl.types import Trajectory

if TYPE_CHECKING:
    import torch

SAMPLES_FILE = "samples.jsonl"
_ROW_PREFIX = "sample/advantage_"


def samples_due(step: int, every: int, last_step: int) -> bool:
    """Whether step `step` (counted from 1) dumps samples."""
    return every > 0 and (step % every == 0 or step == last_step)


def row_advantages(
    advantages: torch.Tensor, mask: torch.Tensor, rows: int
) -> dict[str, torch.Tensor]:
    """0-dim tensors of the first `rows` rows' advantage mean, min and max over their action
    tokens (`mask` 1), keyed `sample/advantage_{stat}/<row>`; a row without action tokens
    gives 0."""
    out: dict[str, torch.Tensor] = {}
    for i in range(min(rows, advantages.shape[0])):
        a = advantages[i]
        m = mask[i] > 0
        if not bool(m.any()):  # a host read, only on the few rows of a due step
            continue
        acted = a[m]
        out[f"{_ROW_PREFIX}mean/{i}"] = acted.mean()
        out[f"{_ROW_PREFIX}min/{i}"] = acted.min()
        out[f"{_ROW_PREFIX}max/{i}"] = acted.max()
    return out


def pop_row_advantages(metrics: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Take the per-row advantage keys out of a step's metrics: {row: {mean, min, max}}."""
    rows: dict[int, dict[str, float]] = {}
    for key in [k for k in metrics if k.startswith(_ROW_PREFIX)]:
        stat, _, row = key.removeprefix(_ROW_PREFIX).partition("/")
        rows.setdefault(int(row), {})[stat] = _finite(metrics.pop(key))
    return rows


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    # Special tokens stay visible: an <eos> (or its absence) is part of what the policy did.
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


# Python writes an int of at most 4300 digits as text (sys.int_max_str_digits): ~14,000 bits.
_MAX_INT_BITS = 14_000


def _finite(value: Any) -> Any:
    """NaN and inf as None (JSON has neither); an integer too long to write as JSON text as a
    string saying how long it is (an environment's `info` may hold anything); anything else
    as it is."""
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        return f"<integer of {value.bit_length()} bits>"
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def split_turns(tokenizer: Any, traj: Trajectory) -> list[dict[str, str]]:
    """The completion as alternating runs of model and observation tokens, decoded."""
    turns: list[dict[str, str]] = []
    start = 0
    ids = traj.completion_ids
    mask = traj.loss_mask
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            role = "model" if mask[start] else "observation"
            turns.append({"role": role, "text": _decode(tokenizer, ids[start:i])})
            start = i
    return turns


def sample_row(
    tokenizer: Any,
    traj: Trajectory,
    step: int,
    index: int,
    staleness: int,
    batch_metrics: Mapping[str, Any],
    advantage: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One samples.jsonl object (module docstring)."""
    versions = [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m]
    return {
        "step": step,
        "index": index,
        "prompt": _decode(tokenizer, traj.prompt_ids),
        "turns": split_turns(tokenizer, traj),
        "reward": _finite(float(traj.reward)),
        "staleness": int(staleness),
        "stop_reason": traj.stop_reason,
        "prompt_key": traj.prompt_key,
        "group_id": traj.group_id,
        "action_tokens": traj.num_action_tokens,
        "observation_tokens": len(traj.loss_mask) - traj.num_action_tokens,
        "versions": [min(versions), max(versions)] if versions else None,
        "info": {str(_finite(k)): _finite(v) for k, v in traj.info.items() if _scalar(v)},
        "advantage": dict(advantage) if advantage else None,
        "batch_advantage": {
            k.removeprefix("advantage/"): _finite(v)
            for k, v in batch_metrics.items()
            if k.startswith("advantage/")
        },
    }


class SampleLogger:
    """Writes the sample dumps of a run (`run.log_samples_every`, `run.log_samples_count`)."""

    def __init__(
        self,
        run_dir: Path,
        tokenizer: Any,
        every: int,
        count: int,
        last_step: int,
        log: MetricsLogger,
    ) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        self.tokenizer = tokenizer
        self.every = every
        self.count = count
        self.log = log
        self.last_step = last_step

    def due(self, step: int) -> bool:
        return samples_due(step, self.every, self.last_step)

    def maybe_log(
        self,
        step: int,
        trajectories: Sequence[Trajectory],
        staleness: Sequence[int],
        batch_metrics: Mapping[str, Any],
        advantages: Mapping[int, Mapping[str, float]] | None = None,
        failed: Sequence[Trajectory] = (),
    ) -> list[dict[str, Any]]:
        """At a due step: the dump's rows, appended to samples.jsonl and sent to the trackers.
        `advantages`: per-row advantage stats (`pop_row_advantages`); `failed`: episodes that
        failed while the batch formed (not trained), dumped after the batch's rows with
        `index` null and their `error` and `traceback` in `info`."""
        if not self.due(step):
            return []
        adv = advantages or {}
        rows = [
            sample_row(self.tokenizer, t, step, i, staleness[i], batch_metrics, adv.get(i))
            for i, t in enumerate(trajectories[: self.count])
        ]
        for t in failed:
            rows.append({**sample_row(self.tokenizer, t, step, 0, 0, {}), "index": None})
        with open_write(self.path, "a") as f:
            f.write("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        self.log.log_samples(rows, step)
        return rows

"""Collapse detection: a streaming detector fed each step's metrics row, live and after the run.

Why: the paper's headline comparison is *when* an arm collapses (vanilla GRPO after ~160 async
steps, vanilla VAPO after ~90, SAO not at all), and a run that has collapsed is compute burnt
until someone looks at it. `CollapseDetector.update(row)` runs inside the training loop on every
step (`saorl.loop`: the `collapse/*` columns of metrics.jsonl, the progress line, summary.json,
`run.stop_on_collapse`); `detect_collapse(rows)` replays a finished run's rows through the same
detector, so the comparison report and the live run can never disagree. Thresholds are the
`[collapse]` config section (`saorl.config.collapse.CollapseConfig`).

Signals (`collapse/<name>`), one rule each:

- `reward_crash`: the moving average (`window` steps) of `rollout/reward_mean` falls below its
  running best by more than `max(reward_drop * (best - initial), reward_noise * sigma)`, where
  `initial` is the mean of the first `window` rewards and `sigma` the per-step noise of the
  reward, `sqrt(pi) / 2 * mean |r_t - r_(t-1)|` over the run so far (differences remove slow
  trends; the whole run, because a reward that fell to a constant has no noise left). Both
  terms are in the reward's own units, so scaling or shifting the rewards changes nothing: it
  sees GRPO's 0.23 -> 0.10 (a run that never gained anything has no gain to lose, but its drop
  is many noise sds) and a reward going from -0.2 to -0.9 alike, where "half of the best
  value" means nothing.
- `eval_drop`: held-out `eval/accuracy` below `eval_drop` x its best so far (once that best is
  at least `eval_min_best`) at two evaluations in a row; each evaluation already averages the
  whole held-out set, so the second one is the confirmation. At the end of a run the last
  evaluation needs none (`finish`).
- `entropy_collapse`, `length_collapse`: the moving average of `policy/entropy` /
  `rollout/response_len_mean` falls below `entropy_low` (5 %) / `length_low` (30 %) of its
  initial level. Healthy RL sharpens the policy a lot: the built-in tool task's successful run
  went 0.315 -> 0.044 nats/token (14 %) while its accuracy rose 0.44 -> 0.93.
- `entropy_explosion`, `length_explosion`, `grad_norm_spike`, `kl_spike` (`dis/kl_k3` or
  `ppo/kl_k3`: the policy against the sampler), `mismatch_spike` (`mismatch/k3`: the learner's
  log-probs against the engine's), `masked_frac_spike` (`dis/masked_frac`, or `ppo/clip_frac`):
  the raw value exceeds `factor * median + floor`, the median being the larger of the median
  over the `baseline_window` values before it and the median of the whole run so far. A median
  ignores earlier one-off spikes, and a jump is judged against where the metric has been
  lately, so slow drift (lengths growing over a long run) does not fire; the run's median keeps
  a metric that has sunk (the gradient norm of a solved task: most batches carry almost
  nothing, median 0.013 against 0.1 over the run) from turning its ordinary values into spikes.
  The KL and mismatch thresholds have floors of their own (`kl_floor`, `mismatch_floor`): a
  policy trained on 8-version-old rollouts is expected to differ from its sampler by a few
  hundredths of a nat, an engine from the learner on the same weights by almost nothing.
  For these two k3 estimates the reference is also at least the upper decile of the last
  `baseline_window` values: k3 is heavy-tailed (a healthy SAO run's median 2e-4 nats, its
  ordinary excursions 0.01-0.04), so 10x its median is next to nothing and the floor alone
  set the threshold: a healthy run whose KL is a few times higher (a higher lr, more
  staleness: k3 grows with the square of the policy's change) crossed it. Against the run's
  own excursions the rule is scale-free like the reward rule (KL x4 throughout fires nothing
  new), and a collapse stands out as far: VAPO's 7.26 nats is 128x its threshold.
- `ess_collapse`: `corr/ess_raw`, the normalised effective sample size of the importance
  ratios (trainer over engine, staleness included; 1 = on-policy), below `ess_low`: most of
  the batch's weight sits on a few tokens, so any importance-weighted update is mostly noise.
- `critic_clipped`, `critic_unexplained` (the critic's health; both off by default): the
  critic's gradient norm above `critic_clip_x` x its clip (`critic/grad_norm_over_clip`) for
  `patience` steps (published SAO post-mortems: a collapsed run's critic was clipped 7-70x),
  and `value/explained_variance` below 0 for `critic_ev_steps` steps: a critic worse than the
  mean return hands the policy advantages that are mostly its own error.
- `mismatch_rise`: the moving average of `gap/k3_stale0` (or `mismatch/k3`: the learner
  against the engine on the tokens sampled with the learner's own weights, i.e. mismatch
  without policy lag) above `gap_rise` x its initial level + `mismatch_floor`. Unlike
  `mismatch_spike`, which judges a value against the recent median, this sees a slow climb
  (an engine drifting from the trainer as the weights move), which a median follows.

A rule fires when it holds on `patience` consecutive logged values of its metric, or a spike at
once when its value is more than `spike_instant` x its threshold (VAPO on the tool task took one
step of 7.3 nats KL and 48.8 gradient norm, about x10^5 and x280 their medians, and never recovered
its held-out accuracy; the next steps were back under the threshold); the finding
names the first of those steps (`step`, the onset) and the step it fired (`detected_step`).
Each signal's metric is a score: 0 at its reference (best, initial level or median), 1 at the
threshold; 0 too while the rule has no reference yet or its metric is absent from the row
(every row gets every column, with a number).
Missing and null values are skipped. A NaN or infinite value of a signal's metric fires that
signal at once (the step that most needs an alarm: an overflowed ratio, a NaN loss); its score
is then -1 (`collapse_rules.NONFINITE`), which metrics.jsonl keeps where it writes the value as
null, so a replay of the file finds the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from saorl.config.collapse import CollapseConfig
from saorl.monitoring.collapse_rules import (
    Above,
    Below,
    EvalDrop,
    Finding,
    Grow,
    RewardCrash,
    Rule,
    Shrink,
    Spike,
    as_step,
    number,
)

REWARD_KEY = "rollout/reward_mean"
EVAL_KEY = "eval/accuracy"
ENTROPY_KEY = "policy/entropy"
LENGTH_KEY = "rollout/response_len_mean"
GRAD_NORM_KEY = "policy/grad_norm"
KL_KEYS = ("dis/kl_k3", "ppo/kl_k3")
# The k3 rules' reference: at least this quantile of the trailing window (module docstring).
K3_QUANTILE = 0.9
MISMATCH_KEY = "mismatch/k3"
MASKED_KEYS = ("dis/masked_frac", "ppo/clip_frac")
ESS_KEY = "corr/ess_raw"
GAP_KEYS = ("gap/k3_stale0", MISMATCH_KEY)  # staleness 0: pure mismatch
CRITIC_CLIP_KEY = "critic/grad_norm_over_clip"
EV_KEY = "value/explained_variance"
DETECTED = "collapse/detected"


class CollapseDetector:
    """Streaming collapse detection: `update(row)` per step, `first` the first finding.

    `update` returns the `collapse/*` columns for that row; a row may hold only some metrics (an
    evaluation-only row advances only `eval_drop`), so feeding a step's row in two parts gives
    the same result as feeding it whole. `replay(rows)` feeds a metrics.jsonl (a resumed run
    rebuilds its detector this way, so nothing needs to be checkpointed).
    """

    def __init__(self, cfg: CollapseConfig | None = None, eval_key: str = EVAL_KEY) -> None:
        c = cfg or CollapseConfig()
        self.rules: list[Rule] = [
            RewardCrash(c, REWARD_KEY),
            EvalDrop(c, eval_key),
            Shrink("entropy_collapse", ENTROPY_KEY, c.entropy_low, c),
            Spike("entropy_explosion", (ENTROPY_KEY,), c.entropy_high, 0.0, c),
            Shrink("length_collapse", LENGTH_KEY, c.length_low, c),
            Spike("length_explosion", (LENGTH_KEY,), c.length_high, 0.0, c),
            Spike("grad_norm_spike", (GRAD_NORM_KEY,), c.grad_norm_spike, 0.0, c),
            Spike("kl_spike", KL_KEYS, c.kl_spike, c.kl_floor, c, K3_QUANTILE),
            Spike("mismatch_spike", (MISMATCH_KEY,), c.kl_spike, c.mismatch_floor, c, K3_QUANTILE),
            Spike("masked_frac_spike", MASKED_KEYS, c.masked_frac_spike, c.masked_frac_floor, c),
            Below("ess_collapse", (ESS_KEY,), c.ess_low, c.patience),
            Above("critic_clipped", (CRITIC_CLIP_KEY,), c.critic_clip_x, c.patience),
            Below("critic_unexplained", (EV_KEY,), 0.0, c.critic_ev_steps, c.critic_ev_steps > 0),
            Grow("mismatch_rise", GAP_KEYS, c.gap_rise, c.mismatch_floor, c),
        ]
        self.first: Finding | None = None
        self._rows = 0

    @property
    def signals(self) -> list[str]:
        return [r.name for r in self.rules]

    def update(self, row: dict[str, Any]) -> dict[str, float]:
        """Judge one metrics row; the `collapse/<signal>` scores and `collapse/detected`."""
        step = number(row.get("step"))
        step = float(self._rows) if step is None else step
        self._rows += 1
        out: dict[str, float] = {}
        for rule in self.rules:
            score = rule.update(step, row)
            out[f"collapse/{rule.name}"] = 0.0 if score is None else score
            self._note(rule)
        out[DETECTED] = float(self.first is not None)
        return out

    def _note(self, rule: Rule) -> None:
        if self.first is None and rule.finding is not None:
            self.first = rule.finding

    def finish(self) -> Finding | None:
        """The run ended (post-hoc): a last low evaluation fires unconfirmed. The first finding."""
        for rule in self.rules:
            if isinstance(rule, EvalDrop):
                rule.finish()
                self._note(rule)
        return self.first

    def replay(self, rows: Iterable[dict[str, Any]]) -> None:
        """Feed logged rows, one merged row per step in step order (see `merge_steps`)."""
        for row in merge_steps(list(rows)):
            self.update(row)


def merge_steps(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step, in step order; for a step logged twice (a resumed run re-logs the
    steps after its last checkpoint) the last value of each key wins. Rows without a numeric
    `step` are skipped, unless no row has one: then the row index is the step."""
    has_step = any(number(r.get("step")) is not None for r in rows)
    by_step: dict[float, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        step = number(row.get("step")) if has_step else float(i)
        if step is None:
            continue
        merged = by_step.setdefault(step, {})
        merged.update({k: v for k, v in row.items() if v is not None})
        merged["step"] = as_step(step)
    return [by_step[s] for s in sorted(by_step)]


def detect_collapse(
    metrics: Sequence[dict[str, Any]],
    config: CollapseConfig | None = None,
    key: str = EVAL_KEY,
) -> Finding | None:
    """The first collapse finding of a run's metrics rows, or None (the live rules, replayed).

    Returns `{"step", "detected_step", "signal", "metric", "value", "threshold", "reason"}`:
    `step` is the onset, `metric` the key that fired, `value` and `threshold` its value and the
    threshold it crossed there, `reason` one human-readable line for the report. `key` is the
    held-out metric of `eval_drop`.
    """
    detector = CollapseDetector(config, eval_key=key)
    detector.replay(metrics)
    return detector.finish()


def metric_series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, sorted by step; the last value logged for a step wins.

    A resumed run re-logs the steps after its last checkpoint, hence "last wins". Rows without
    a numeric `step` are skipped, unless no row has one: then the row index is the step.
    Missing keys and nulls (e.g. `loss/policy` during critic warm-up) are skipped.
    """
    has_step = any(number(r.get("step")) is not None for r in rows)
    by_step: dict[float, float] = {}
    for i, row in enumerate(rows):
        step = number(row.get("step")) if has_step else float(i)
        value = number(row.get(key))
        if step is not None and value is not None:
            by_step[step] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last `window` values at every index (a partial window at the start)."""
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out

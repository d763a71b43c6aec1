"""The baselines of the stability lab: each algorithm trains, groups stay whole, the math of
vanilla GRPO and the running-mean baseline matches hand-computed values, PPO's clip acts once
there are several mini-batches, and VAPO's LM loss weighs correct rows like one full batch."""

from __future__ import annotations

import copy
import json
import math
import queue
import string

import pytest
import torch

from saorl.envs.arithmetic import ArithmeticTask
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.rollout.collector import BatchCollector
from saorl.types import Batch, Trajectory
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch

STOP_ON_MOST_CHARS = "rollout.stop=" + str(list(string.ascii_letters + string.digits))


@pytest.mark.parametrize(
    "name", ["sao", "grpo", "grpo_dis", "running_mean", "vapo", "sao_ppo_clip"]
)
def test_each_algorithm_runs_async_steps(tmp_path, monkeypatch, name):
    monkeypatch.setattr(ArithmeticTask, "reward", staticmethod(lambda p, t: float(len(t) % 2)))
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        f"algorithm.name={name}",
        "algorithm.group_size=4",
        "run.total_steps=3",
        "run.eval_every=0",
        STOP_ON_MOST_CHARS,
        "algorithm.minibatches=2",
    )
    summary = train_from_config(cfg)
    assert summary["steps"] == 3
    rows = [
        json.loads(x) for x in (tmp_path / "default" / "metrics.jsonl").read_text().splitlines()
    ]
    trained = [r for r in rows if r.get("learner/warmup") == 0.0]
    assert trained, "no policy step was taken"
    for r in trained:
        assert math.isfinite(r["loss/policy"]) and math.isfinite(r["policy/grad_norm"])
    uses_ppo = name in ("grpo", "vapo", "sao_ppo_clip")
    assert ("ppo/clip_frac" in trained[-1]) == uses_ppo
    assert ("dis/masked_frac" in trained[-1]) == (not uses_ppo)
    assert ("loss/value" in trained[-1]) == (name in ("sao", "vapo", "sao_ppo_clip"))
    assert ("loss/lm" in trained[-1]) == (name == "vapo")  # VAPO's positive-example LM loss
    if name in ("grpo", "grpo_dis", "vapo"):  # VAPO samples groups too (group sampling)
        assert all("async/group_wait_s" in r for r in rows if "learner/version" in r)
    # Two mini-batches: two policy versions per policy step.
    assert trained[-1]["learner/version"] == 2 * len(trained)


def _traj(group: int, reward: float, n: int = 2, version: int = 0) -> Trajectory:
    return Trajectory(
        [5, 6],
        [7] * n,
        [1] * n,
        [-0.5] * n,
        [version] * n,
        reward=reward,
        group_id=group,
        prompt_key=f"p{group}",
    )


class _Feed:
    released = 0

    def release(self) -> None:
        self.released += 1


def test_group_batches_contain_whole_groups():
    out: queue.Queue = queue.Queue()
    # Members of groups 0, 1, 2 finish interleaved; group 1 completes first, then group 0.
    for g in (0, 1, 1, 2, 0, 2):
        out.put(_traj(g, 1.0))
    feed = _Feed()
    collector = BatchCollector([], feed, out, group_size=2, sync=False)  # type: ignore[arg-type]
    batch, dropped, _, waits = collector.collect(version=0, n=4, max_staleness=4)
    assert [t.group_id for t in batch] == [1, 1, 0, 0]
    assert dropped == 0 and len(waits) == 2
    # Stale groups are dropped whole and free their slots: group 2 (its first member arrived
    # above, its second is still queued) and group 3 were sampled at version 0.
    out.put(_traj(3, 1.0, version=0))
    out.put(_traj(3, 1.0, version=0))
    for _ in range(2):
        out.put(_traj(4, 1.0, version=9))
    batch, dropped, _, _ = collector.collect(version=9, n=2, max_staleness=4)
    assert [t.group_id for t in batch] == [4, 4]
    assert dropped == 4 and feed.released == 4


def test_vanilla_grpo_loss_is_ppo_clip_on_group_normalised_advantages(tiny_policy):
    policy, _ = tiny_policy
    cfg = tiny_config("algorithm.name=grpo", "algorithm.group_size=2", "algorithm.minibatches=1")
    learner = Learner(cfg, policy, torch.device("cpu"))
    # One group: rewards 1 and 0 -> mean 0.5, population std 0.5 -> advantages +1 and -1
    # (up to the 1e-6 in the denominator). Row 0 has 3 action tokens, row 1 has 1.
    batch = Batch.from_trajectories([_traj(0, 1.0, n=3), _traj(0, 0.0, n=1)], pad_id=0)
    m = learner.step(batch)
    # The old policy is the current one, so every ratio is 1 and nothing is clipped:
    # loss = -(3 * (+1) + 1 * (-1)) / 4 action tokens = -0.5.
    assert m["loss/policy"] == pytest.approx(-0.5, abs=1e-5)
    assert m["ppo/clip_frac"] == 0.0


def test_grpo_without_std_normalisation_uses_the_centred_reward(tiny_policy):
    policy, _ = tiny_policy
    cfg = tiny_config(
        "algorithm.name=grpo",
        "algorithm.group_size=2",
        "algorithm.minibatches=1",
        "algorithm.group_std_norm=false",
    )
    learner = Learner(cfg, policy, torch.device("cpu"))
    # Rewards 1 and 0.5 -> mean 0.75 -> advantages +0.25 and -0.25 (the std, 0.25, would make
    # them +1 and -1): loss = -(3 * 0.25 + 1 * (-0.25)) / 4 = -0.125.
    batch = Batch.from_trajectories([_traj(0, 1.0, n=3), _traj(0, 0.5, n=1)], pad_id=0)
    assert learner.step(batch)["loss/policy"] == pytest.approx(-0.125, abs=1e-6)


def test_running_mean_baseline_is_per_prompt(tiny_policy):
    policy, _ = tiny_policy
    learner = Learner(tiny_config("algorithm.name=running_mean"), policy, torch.device("cpu"))
    # First visit of each prompt: no history, advantage 0 (the baseline is the reward itself).
    m1 = learner.step(Batch.from_trajectories([_traj(0, 1.0), _traj(1, 0.0)], pad_id=0))
    assert m1["advantage/mean"] == pytest.approx(0.0)
    # Second visit: prompt 0 had mean 1.0 -> 0 - 1 = -1; prompt 1 had mean 0.0 -> 1 - 0 = +1.
    m2 = learner.step(Batch.from_trajectories([_traj(0, 0.0), _traj(1, 1.0)], pad_id=0))
    assert m2["advantage/mean"] == pytest.approx(0.0)  # (-1 * 2 + 1 * 2) / 4 tokens
    assert learner.baseline.baseline("p0") == pytest.approx(0.5)
    assert learner.baseline.baseline("p1") == pytest.approx(0.5)


@pytest.mark.parametrize("name", ["sao_ppo_clip", "grpo"])
def test_ppo_clip_acts_only_with_several_minibatches(tiny_policy, name):
    policy, _ = tiny_policy
    batch = _batch(policy)  # 8 rows, rewards 0 and 1 alternating
    batch.group_ids[:] = torch.arange(8) // 4  # two groups of 4 for grpo's advantage
    clip = {}
    for n in (1, 2):
        cfg = tiny_config(
            f"algorithm.name={name}",
            "algorithm.group_size=4",
            f"algorithm.minibatches={n}",
            "critic.warmup_steps=0",
            "learner.lr=0.05",
            "learner.lr_warmup_steps=0",
        )
        learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
        m = learner.step(batch)
        assert learner.version == n
        clip[n] = m["ppo/clip_frac"]
    # One mini-batch: the old policy is the policy being updated, every ratio is 1 and the
    # clip never acts. Two: the second mini-batch's ratios are taken after the first update.
    assert clip[1] == 0.0
    assert clip[2] > 0.0


def test_positive_lm_loss_weighs_correct_rows_like_one_full_batch(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)  # rows 1, 3, 5, 7 have reward 1: the correct ones
    common = ("algorithm.name=vapo", "algorithm.group_size=8", "critic.warmup_steps=0")
    full = Learner(
        tiny_config(*common, "algorithm.minibatches=1", "learner.micro_batch_size=8"),
        copy.deepcopy(policy),
        torch.device("cpu"),
    )
    micro = Learner(
        tiny_config(*common, "algorithm.minibatches=1", "learner.micro_batch_size=3"),
        copy.deepcopy(policy),
        torch.device("cpu"),
    )
    m_full, m_micro = full.step(batch), micro.step(batch)
    # Before the update the policy is the one that recorded the rollout log-probs, so the LM
    # loss is the mean of -rollout_logp over the correct rows' action tokens.
    correct = batch.action_mask * (batch.scores >= 1.0)[:, None]
    nll = -(batch.rollout_logprobs * correct).sum() / correct.sum()
    assert m_full["loss/lm"] == pytest.approx(float(nll), rel=1e-4)
    assert m_full["lm/positive_frac"] == pytest.approx(0.5)
    # Micro-batches of 3 rows split the correct rows unevenly; their weights still add up.
    assert m_micro["loss/lm"] == pytest.approx(m_full["loss/lm"], rel=1e-5)
    for a, b in zip(full.policy.parameters(), micro.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    # Without the LM loss the same step differs: the term really is in the gradient.
    plain = Learner(
        tiny_config(*common, "algorithm.minibatches=1", "algorithm.lm_loss_coef=0"),
        copy.deepcopy(policy),
        torch.device("cpu"),
    )
    assert "loss/lm" not in plain.step(batch)
    pairs = zip(full.policy.parameters(), plain.policy.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)

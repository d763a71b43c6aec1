"""`critic.concurrent`: the critic's K updates on their own thread, beside the policy update.

The concurrent step must compute what the sequential one computes: from the same init, every
metric, every weight and every optimizer state agree after several steps (critic warm-up
included), for one and two policy mini-batches and for packed micro-batches.
"""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.learner.learner import Learner
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch


def _run(policy, concurrent: bool, *overrides: str, steps: int = 3):
    cfg = tiny_config(*overrides, f"critic.concurrent={str(concurrent).lower()}")
    torch.manual_seed(0)
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    metrics = [learner.step(_batch(policy, seed=s)) for s in range(steps)]
    learner.close()
    return learner, metrics


def _assert_same_metrics(rows_a: list[dict], rows_b: list[dict], rel: float) -> None:
    """Step by step the same keys, None where the other is None, values to `rel`."""
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if value is None or b[key] is None:
                assert value is None and b[key] is None, key
            else:
                assert b[key] == pytest.approx(value, rel=rel, abs=1e-7), key


def _assert_same_state(a: Learner, b: Learner) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    for key in ("policy", "critic"):
        assert sa[key].keys() == sb[key].keys()
        for name in sa[key]:
            torch.testing.assert_close(sa[key][name], sb[key][name], msg=f"{key}.{name}")
    for key in ("policy_opt", "critic_opt"):
        for pid, state in sa[key]["state"].items():
            for name, value in state.items():
                torch.testing.assert_close(value, sb[key]["state"][pid][name], msg=f"{key}.{name}")
    assert sa["version"] == sb["version"] and sa["skipped_steps"] == sb["skipped_steps"]


@pytest.mark.parametrize(
    "overrides",
    [
        ("critic.updates_per_step=2", "critic.warmup_steps=1", "algorithm.minibatches=1"),
        (
            "critic.updates_per_step=2",
            "critic.warmup_steps=1",
            "algorithm.minibatches=2",
            "learner.micro_batch_size=3",
        ),
        ("critic.warmup_steps=0", "learner.micro_batch_tokens=40", "algorithm.minibatches=2"),
    ],
    ids=["k2-warmup-mb1", "k2-warmup-mb2-micro", "packed-mb2"],
)
def test_concurrent_step_equals_sequential(tiny_policy, overrides):
    policy, _ = tiny_policy
    seq, m_seq = _run(policy, False, "learner.batch_size=8", *overrides)
    con, m_con = _run(policy, True, "learner.batch_size=8", *overrides)
    assert con.critic_updater._pool is not None and seq.critic_updater._pool is None
    assert seq.version == con.version >= 2  # policy updates happened after the warm-up
    _assert_same_metrics(m_seq, m_con, rel=1e-6)
    _assert_same_state(seq, con)


def test_concurrent_step_counts_skipped_critic_updates(tiny_policy):
    policy, _ = tiny_policy
    cfg = tiny_config("critic.warmup_steps=0", "critic.concurrent=true")
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    batch = _batch(policy)
    batch.rewards[batch.rewards != 0] = float("nan")
    critic_before = copy.deepcopy(learner.critic.state_dict())
    m = learner.step(batch)
    assert m["learner/skipped_steps"] == learner.skipped_steps == 3  # K=2 critic + 1 policy
    assert learner.nonfinite_streak == 1 and learner.version == 0
    for k, v in learner.critic.state_dict().items():
        assert torch.equal(v, critic_before[k]), k
    learner.close()


def test_concurrent_critic_failure_reaches_the_step(tiny_policy):
    policy, _ = tiny_policy
    cfg = tiny_config("critic.warmup_steps=0", "critic.concurrent=true")
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))

    def broken(*args):
        raise RuntimeError("critic thread broke")

    learner.critic_updater.update = broken
    with pytest.raises(RuntimeError, match="critic thread broke"):
        learner.step(_batch(policy))
    learner.close()


def test_critic_device_is_checked():
    from saorl.config import ConfigError, load_config

    assert load_config(None, ["critic.device=cuda:1"]).critic.device == "cuda:1"
    with pytest.raises(ConfigError, match=r"critic\.device"):
        load_config(None, ["critic.device=gpu1"])

"""Unit tests for saorl.advantages: hand-computed values, properties and loop parity."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from saorl.advantages import (
    RunningMeanBaseline,
    group_normalized_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
)

PROPERTY = settings(max_examples=40, deadline=None)
_reals = st.floats(min_value=-2.0, max_value=2.0, allow_nan=False)


# ----------------------------------------------------------------------------- references


def _textbook_gae(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """GAE over every token of one row, V after the last token = 0 (Schulman et al. 2016)."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def _loop_skip_gae(
    rewards: list[list[float]],
    values: list[list[float]],
    mask: list[list[bool]],
    gamma: float,
    lams: list[float],
) -> tuple[list[list[float]], list[list[float]]]:
    """The plain per-row, per-token loop that skip_observation_gae vectorises."""
    all_adv, all_ret = [], []
    for r_row, v_row, m_row, lam in zip(rewards, values, mask, lams, strict=True):
        positions = [t for t, is_action in enumerate(m_row) if is_action]
        adv_row, ret_row = [0.0] * len(m_row), [0.0] * len(m_row)
        running = 0.0
        for k in reversed(range(len(positions))):
            t = positions[k]
            next_v = v_row[positions[k + 1]] if k + 1 < len(positions) else 0.0
            delta = r_row[t] + gamma * next_v - v_row[t]
            running = delta + gamma * lam * running
            adv_row[t] = running
            ret_row[t] = running + v_row[t]
        all_adv.append(adv_row)
        all_ret.append(ret_row)
    return all_adv, all_ret


def _t(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ----------------------------------------------------------------------------- GAE by hand


def test_skip_observation_gae_by_hand_two_actions_around_observation() -> None:
    # Positions: 0, 1 = action (turn 1), 2, 3 = tool observation, 4 = action (turn 2, reward 1),
    # 5 = padding. Observation/padding values are NaN and must not matter. gamma=0.9, lam=0.5.
    # Action positions t1=0, t2=1, t3=4 with V = 0.5, 0.6, 0.8:
    #   delta_3 = 1 + 0.9 * 0   - 0.8 = 0.2
    #   delta_2 = 0 + 0.9 * 0.8 - 0.6 = 0.12   (jumps over positions 2, 3 to V(t3))
    #   delta_1 = 0 + 0.9 * 0.6 - 0.5 = 0.04
    #   A_3 = 0.2
    #   A_2 = 0.12 + 0.45 * 0.2  = 0.21
    #   A_1 = 0.04 + 0.45 * 0.21 = 0.1345
    #   returns = A + V = 0.6345, 0.81, 1.0
    nan = math.nan
    rewards = _t([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = _t([[0.5, 0.6, nan, nan, 0.8, nan]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    adv, ret = skip_observation_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, _t([[0.1345, 0.21, 0.0, 0.0, 0.2, 0.0]]))
    torch.testing.assert_close(ret, _t([[0.6345, 0.81, 0.0, 0.0, 1.0, 0.0]]))


def test_skip_observation_gae_per_row_lambda_and_empty_row() -> None:
    # Row 0 as above but lam = 1 (critic targets), gamma = 1: returns are the final reward on
    # every action token, advantages R - V = [0.5, 0.4, 0.2]. Row 1 has no action token.
    rewards = _t([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [5.0] * 6])
    values = _t([[0.5, 0.6, 3.0, 3.0, 0.8, 3.0], [1.0] * 6])
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0] * 6])
    adv, ret = skip_observation_gae(rewards, values, mask, 1.0, torch.tensor([1.0, 0.3]))
    torch.testing.assert_close(adv, _t([[0.5, 0.4, 0.0, 0.0, 0.2, 0.0], [0.0] * 6]))
    torch.testing.assert_close(ret, _t([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 6]))


def test_skip_observation_gae_dtype_and_no_grad() -> None:
    values = torch.ones(2, 3, dtype=torch.bfloat16, requires_grad=True)
    adv, ret = skip_observation_gae(
        torch.ones(2, 3, dtype=torch.bfloat16), values, torch.ones(2, 3), 1.0, 0.95
    )
    assert adv.dtype == ret.dtype == torch.float32  # bf16 is promoted for the sums
    assert not adv.requires_grad and not ret.requires_grad


def test_skip_observation_gae_rejects_bad_shapes() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same"):
        skip_observation_gae(x, torch.zeros(2, 4), x, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\(2,\) tensor"):
        skip_observation_gae(x, x, x, 1.0, torch.ones(3))


# ----------------------------------------------------------------------------- GAE properties


@st.composite
def _row(draw: st.DrawFn, min_size: int = 1, max_size: int = 10) -> tuple[list[float], ...]:
    n = draw(st.integers(min_size, max_size))
    rewards = draw(st.lists(_reals, min_size=n, max_size=n))
    values = draw(st.lists(_reals, min_size=n, max_size=n))
    return rewards, values


@PROPERTY
@given(_row(), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.sampled_from([1, 3, 64]))
def test_all_action_mask_equals_textbook_gae(
    row: tuple[list[float], ...], gamma: float, lam: float, chunk: int
) -> None:
    rewards, values = row
    adv, ret = skip_observation_gae(
        _t([rewards]), _t([values]), torch.ones(1, len(rewards)), gamma, lam, chunk_size=chunk
    )
    ref_adv, ref_ret = _textbook_gae(rewards, values, gamma, lam)
    torch.testing.assert_close(adv, _t([ref_adv]))
    torch.testing.assert_close(ret, _t([ref_ret]))


@PROPERTY
@given(_row(), st.data(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_inserting_observation_tokens_leaves_action_tokens_unchanged(
    row: tuple[list[float], ...], data: st.DataObject, gamma: float, lam: float
) -> None:
    rewards, values = row
    n = len(rewards)
    # k observation tokens in each of the n + 1 gaps (before, between and after actions),
    # each with arbitrary reward and value: both must be ignored.
    gaps = data.draw(st.lists(st.integers(0, 3), min_size=n + 1, max_size=n + 1))
    long_r: list[float] = []
    long_v: list[float] = []
    long_m: list[bool] = []
    for i in range(n + 1):
        for _ in range(gaps[i]):
            long_r.append(data.draw(_reals))
            long_v.append(data.draw(_reals))
            long_m.append(False)
        if i < n:
            long_r.append(rewards[i])
            long_v.append(values[i])
            long_m.append(True)
    short_adv, short_ret = skip_observation_gae(
        _t([rewards]), _t([values]), torch.ones(1, n), gamma, lam
    )
    mask = torch.tensor([long_m])
    adv, ret = skip_observation_gae(_t([long_r]), _t([long_v]), mask, gamma, lam)
    torch.testing.assert_close(adv[mask], short_adv[0])
    torch.testing.assert_close(ret[mask], short_ret[0])
    assert adv[~mask].eq(0).all() and ret[~mask].eq(0).all()


@PROPERTY
@given(st.data(), st.floats(-3.0, 3.0))
def test_gamma_lambda_one_returns_equal_final_reward(data: st.DataObject, reward: float) -> None:
    t = data.draw(st.integers(1, 12))
    mask = data.draw(st.lists(st.booleans(), min_size=t, max_size=t).filter(any))
    values = data.draw(st.lists(_reals, min_size=t, max_size=t))
    last = max(i for i, is_action in enumerate(mask) if is_action)
    rewards = [reward if i == last else 0.0 for i in range(t)]
    m = torch.tensor([mask])
    _, ret = skip_observation_gae(_t([rewards]), _t([values]), m, 1.0, 1.0)
    torch.testing.assert_close(ret[m], torch.full((sum(mask),), reward, dtype=torch.float64))


@PROPERTY
@given(
    st.data(),
    st.integers(1, 5),
    st.integers(1, 16),
    st.floats(0.0, 1.0),
    st.sampled_from([1, 2, 3, 5, 64]),
)
def test_vectorised_gae_matches_per_row_loop(
    data: st.DataObject, b: int, t: int, gamma: float, chunk: int
) -> None:
    def mat(elems: st.SearchStrategy) -> list:
        return data.draw(st.lists(st.lists(elems, min_size=t, max_size=t), min_size=b, max_size=b))

    rewards, values, mask = mat(_reals), mat(_reals), mat(st.booleans())
    lams = data.draw(st.lists(st.floats(0.0, 1.0), min_size=b, max_size=b))
    adv, ret = skip_observation_gae(
        _t(rewards), _t(values), torch.tensor(mask), gamma, _t(lams), chunk_size=chunk
    )
    ref_adv, ref_ret = _loop_skip_gae(rewards, values, mask, gamma, lams)
    torch.testing.assert_close(adv, _t(ref_adv))
    torch.testing.assert_close(ret, _t(ref_ret))


# ----------------------------------------------------------------------------- lambda


def test_length_adaptive_lambda_by_hand() -> None:
    # l = 1, 3, 0, 10 action tokens; alpha = 1.5:
    #   1 - 1/1.5 = 1/3;  1 - 1/4.5 = 7/9;  l = 0 -> 0;  1 - 1/15 = 14/15.
    mask = torch.zeros(4, 10)
    mask[0, 4] = 1
    mask[1, [0, 5, 9]] = 1
    mask[3] = 1
    torch.testing.assert_close(
        length_adaptive_lambda(mask), torch.tensor([1 / 3, 7 / 9, 0.0, 14 / 15])
    )
    # alpha = 0.5: l = 1 -> 1 - 2 = -1, clamped to 0;  l = 2 -> 0;  l = 4 -> 0.5.
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(length_adaptive_lambda(mask, alpha=0.5), torch.tensor([0, 0, 0.5]))
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(mask, alpha=0.0)


def test_length_adaptive_lambda_is_monotone_in_length() -> None:
    mask = torch.tril(torch.ones(50, 50))  # row i has i + 1 action tokens
    lam = length_adaptive_lambda(mask)
    assert (lam[1:] > lam[:-1]).all() and (lam < 1).all()


# ----------------------------------------------------------------------------- GRPO groups


def test_group_normalized_advantages_by_hand() -> None:
    # Group 0: [1, 0, 1, 0], mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-6).
    # Group 7: one member -> 0.   Group 3: [2, 2, 2] constant -> 0.
    # Group 1: [0, 3], mean 1.5, std 1.5 -> -+1.5 / (1.5 + 1e-6).
    # Group 9: three 0.1s: constant, exactly 0 although their float mean is not exactly 0.1.
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 1.0, 5.0, 2.0, 0.1, 0.0, 3.0, 0.1, 2.0, 0.1])
    groups = torch.tensor([0, 0, 1, 3, 0, 7, 3, 9, 0, 1, 9, 3, 9])
    a = 0.5 / (0.5 + 1e-6)
    c = 1.5 / (1.5 + 1e-6)
    expected = torch.tensor([a, -a, -c, 0.0, a, 0.0, 0.0, 0.0, -a, c, 0.0, 0.0, 0.0])
    out = group_normalized_advantages(rewards, groups)
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32
    constant = torch.tensor([3, 5, 6, 7, 10, 11, 12])
    assert torch.equal(out[constant], torch.zeros(7))  # exactly 0, not approximately


def test_group_normalized_advantages_edge_cases() -> None:
    empty = group_normalized_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)
    ints = group_normalized_advantages(torch.tensor([0, 1]), torch.tensor([4, 4]))
    torch.testing.assert_close(ints, torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        group_normalized_advantages(torch.zeros(3), torch.zeros(2))


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 4), _reals), min_size=1, max_size=20))
def test_group_normalized_matches_per_group_loop(pairs: list[tuple[int, float]]) -> None:
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    out = group_normalized_advantages(rewards, groups)
    for g in set(groups.tolist()):
        members = rewards[groups == g]
        if (members == members[0]).all():
            expected = torch.zeros_like(members)
        else:
            expected = (members - members.mean()) / (members.std(unbiased=False) + 1e-6)
        torch.testing.assert_close(out[groups == g], expected)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------- running mean


def test_running_mean_baseline_first_visit_and_window_eviction() -> None:
    b = RunningMeanBaseline(window=3)
    # No history: the baseline is the reward itself, so the advantage is 0.
    assert b.advantage("p", 1.0) == 0.0
    # History [1]: 0 - 1 = -1.   History [1, 0]: 1 - 0.5 = 0.5.
    assert b.advantage("p", 0.0) == -1.0
    assert b.advantage("p", 1.0) == 0.5
    # History [1, 0, 1] (full): 0 - 2/3.
    assert b.advantage("p", 0.0) == pytest.approx(-2 / 3)
    # The first 1.0 has been evicted; history [0, 1, 0]: 1 - 1/3.
    assert b.advantage("p", 1.0) == pytest.approx(2 / 3)
    assert b.baseline("p") == pytest.approx(2 / 3)  # window [1, 0, 1]
    # Prompts do not share history.
    assert b.advantage(("q", 2), 7.0) == 0.0 and b.baseline("other") is None
    assert len(b) == 2


def test_running_mean_baseline_explicit_empty_baseline() -> None:
    b = RunningMeanBaseline(empty_baseline=0.0)
    assert b.window == 8
    assert b.advantage(0, 1.0) == 1.0  # REINFORCE-style first visit: R - 0
    assert b.advantage(0, 0.0) == -1.0


def test_running_mean_baseline_state_dict_round_trip() -> None:
    b = RunningMeanBaseline(window=4)
    for i in range(10):
        b.advantage(i % 3, float(i))
        b.advantage(("tuple", "key"), i / 7)
    restored = RunningMeanBaseline(window=4)
    restored.load_state_dict(b.state_dict())
    # Identical future behaviour, key by key and step by step.
    for i in range(10):
        for key in (0, 1, 2, ("tuple", "key"), "new"):
            assert restored.advantage(key, i * 0.3) == b.advantage(key, i * 0.3)
    assert restored.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="window=4"):
        RunningMeanBaseline(window=8).load_state_dict(b.state_dict())


def test_running_mean_baseline_global_window_over_all_prompts() -> None:
    # The paper's global variant: the mean of the last `global_window` rewards of any prompt.
    b = RunningMeanBaseline(window=3, scope="global", global_window=2)
    assert b.advantage("a", 1.0) == 0.0  # nothing seen yet: advantage 0
    assert b.advantage("b", 0.0) == -1.0  # window [1]
    assert b.advantage("c", 1.0) == 0.5  # window [1, 0]
    # The first 1.0 is evicted: window [0, 1]; "a"'s own history is not used.
    assert b.advantage("a", 0.0) == -0.5
    assert b.baseline("never seen") == pytest.approx(0.5)  # window [1, 0]


def test_running_mean_baseline_prompt_then_global_fills_first_visits() -> None:
    # Per-prompt baseline, with the global window for a prompt's first visit: on a dataset
    # with few revisits most samples would otherwise get advantage 0.
    b = RunningMeanBaseline(window=2, scope="prompt_then_global", global_window=4)
    assert b.advantage("a", 1.0) == 0.0  # first reward of the run: no baseline at all
    assert b.advantage("b", 0.0) == -1.0  # "b" is new: global window [1]
    assert b.advantage("c", 1.0) == 0.5  # "c" is new: global window [1, 0]
    assert b.advantage("a", 0.0) == -1.0  # "a" has history [1]: its own mean
    plain = RunningMeanBaseline(window=2)  # the default scope gives first visits nothing
    assert [plain.advantage(k, r) for k, r in [("a", 1.0), ("b", 0.0), ("c", 1.0)]] == [0, 0, 0]


def test_running_mean_baseline_global_state_round_trip_and_old_checkpoints() -> None:
    b = RunningMeanBaseline(window=2, scope="prompt_then_global", global_window=3)
    for i in range(7):
        b.advantage(i % 4, float(i % 3))
    restored = RunningMeanBaseline(window=2, scope="prompt_then_global", global_window=3)
    restored.load_state_dict(b.state_dict())
    for i in range(6):
        for key in (0, 5, "new"):
            assert restored.advantage(key, i * 0.5) == b.advantage(key, i * 0.5)
    with pytest.raises(ValueError, match="global_window"):
        RunningMeanBaseline(window=2, global_window=128).load_state_dict(b.state_dict())
    # A checkpoint written before the global window existed: per-prompt windows restored,
    # the global window starts empty.
    old = {"window": 2, "empty_baseline": None, "history": [("p", [1.0, 0.0])]}
    c = RunningMeanBaseline(window=2, scope="prompt_then_global")
    c.load_state_dict(old)
    assert c.baseline("p") == 0.5 and c.baseline("q") is None


def test_running_mean_baseline_scope_is_the_config_field() -> None:
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy
    from tests.conftest import tiny_config

    cfg = tiny_config(
        "algorithm.name=running_mean",
        "algorithm.baseline_scope=global",
        "algorithm.baseline_global_window=16",
    )
    learner = Learner(cfg, load_policy(cfg.model)[0], torch.device("cpu"))
    assert (learner.baseline.scope, learner.baseline.global_window) == ("global", 16)

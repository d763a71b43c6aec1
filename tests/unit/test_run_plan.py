"""Short runs say what they did: critic-only steps within run.total_steps, policy updates."""

from __future__ import annotations

import pytest

from saorl.config import load_config
from saorl.run_plan import critic_only_steps, policy_updates, warn_short_run


@pytest.mark.parametrize(
    "overrides, warm, updates, warned",
    [
        (["run.total_steps=5"], 5, 0, "never updates the policy"),  # sao: 10 warm-up steps
        (["run.total_steps=15"], 10, 5, "only 5 of run.total_steps=15 steps update"),
        (["run.total_steps=100"], 10, 90, None),
        (["run.total_steps=5", "algorithm.name=grpo"], 0, 5, None),  # no critic
    ],
)
def test_policy_updates_and_the_warning(overrides, warm, updates, warned, capsys) -> None:
    cfg = load_config(None, overrides)
    assert (critic_only_steps(cfg), policy_updates(cfg)) == (warm, updates)
    text = warn_short_run(cfg)
    err = capsys.readouterr().err
    if warned is None:
        assert text is None and err == ""
    else:
        assert warned in text and "saorl: warning: " + text in err

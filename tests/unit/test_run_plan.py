"""Short runs say what they did: critic-only steps within run.total_steps, policy updates."""

from __future__ import annotations

import pytest

from saorl.config import load_config
from saorl.run.plan import critic_only_steps, policy_updates, warn_short_run


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


@pytest.mark.parametrize(
    "overrides, warned",
    [
        ([], False),  # the built-in task: what the tiny model is for
        (["env.name=tool_arithmetic"], False),
        (["env.name=agent", "env.agent.function=a.py:run", "env.agent.tasks=arithmetic"], False),
        (["env.name=math", "env.dataset=gsm8k"], True),  # a dataset it cannot know
        (["env.name=reasoning_gym", "env.reasoning_gym.datasets=['chain_sum']"], True),
        (["env.name=math", "model.name_or_path=smollm2-135m"], False),  # a real model
    ],
)
def test_the_tiny_model_on_a_task_it_cannot_know_points_at_the_real_model(
    overrides, warned, capsys
) -> None:
    from saorl.run.plan import warn_tiny_model

    text = warn_tiny_model(load_config(None, overrides))
    err = capsys.readouterr().err
    if not warned:
        assert text is None and err == ""
    else:
        assert "2-digit sums" in text and "model.name_or_path=smollm2-135m" in text
        assert "saorl: warning: " + text in err

"""critic.concurrent = "auto": on where the two updates have hardware to overlap on."""

from __future__ import annotations

import os

import pytest
import torch

from saorl.learner.critic_updater import concurrent_critic
from tests.conftest import tiny_config

CPU = torch.device("cpu")


def test_auto_is_the_default_and_explicit_settings_win():
    assert tiny_config().critic.concurrent == "auto"
    assert concurrent_critic(tiny_config("critic.concurrent=false"), CPU) == (
        False,
        "critic.concurrent = false",
    )
    assert concurrent_critic(tiny_config("critic.concurrent=true"), CPU)[0] is True


def test_auto_on_cpu_counts_the_cores(monkeypatch):
    for cores, threads, want in ((2, 1, True), (1, 1, False), (4, 2, True), (3, 2, False)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        on, why = concurrent_critic(tiny_config(f"run.torch_threads={threads}"), CPU)
        assert on is want, (cores, threads, why)
        assert f"{cores} CPU core" in why


def test_auto_is_off_on_one_shared_accelerator_and_on_with_a_device_of_its_own(monkeypatch):
    cuda = torch.device("cuda", 0)
    on, why = concurrent_critic(tiny_config(), cuda)
    assert on is False and "share cuda:0" in why
    monkeypatch.setattr(
        "saorl.learner.critic_updater.critic_device", lambda cfg, dev: torch.device("cuda", 1)
    )
    on, why = concurrent_critic(tiny_config("critic.device=cuda:1"), cuda)
    assert on is True and "device of its own (cuda:1)" in why


def test_auto_is_off_with_fsdp():
    on, why = concurrent_critic(tiny_config("learner.fsdp=true"), CPU)
    assert on is False and "learner.fsdp" in why


def test_auto_is_off_under_deterministic_runs():
    on, why = concurrent_critic(tiny_config("run.deterministic=true"), CPU)
    assert on is False and "deterministic" in why


def test_the_learner_resolves_auto_once(tiny_policy, monkeypatch):
    from saorl.learner.learner import Learner

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    cfg = tiny_config()
    learner = Learner(cfg, tiny_policy[0], CPU)
    assert learner.critic_concurrent is True
    assert learner.critic_updater._pool is not None
    # Reported, never written back: the learner's config and the caller's keep "auto".
    assert learner.cfg.critic.concurrent == "auto" and cfg.critic.concurrent == "auto"
    assert "2 CPU cores" in learner.critic_concurrent_why


@pytest.mark.parametrize("value", ["true", "false", '"auto"'])
def test_config_accepts_bool_and_auto(value):
    want = {"true": True, "false": False}.get(value, "auto")
    assert tiny_config(f"critic.concurrent={value}").critic.concurrent == want

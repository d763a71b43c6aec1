"""The `[ray]` config section, the --ray flags and the cluster example (no Ray needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.config import ConfigError, load_config

CLUSTER = Path(__file__).parents[2] / "examples" / "cluster_qwen3_30b_a3b.toml"


def test_cluster_example_loads_with_the_paper_settings():
    raw = tomllib.loads(CLUSTER.read_text())
    cfg = load_config(CLUSTER)
    # Every key written in the file is a config field with the value written (no typo'd key
    # silently ignored: unknown keys are errors, and this pins the values).
    for section, table in raw.items():
        for key, value in table.items():
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"
    assert (cfg.rollout.engine, cfg.rollout.num_workers, cfg.ray.rollout_num_gpus) == ("vllm", 8, 1)
    assert (cfg.ray.learner_ranks, cfg.ray.learner_num_gpus, cfg.learner.fsdp) == (8, 1, True)
    assert cfg.ray.address == "auto"
    assert (cfg.algorithm.eps_low, cfg.algorithm.eps_high) == (0.3, 5.0)
    assert (cfg.learner.lr, cfg.critic.lr, cfg.critic.updates_per_step) == (1e-6, 5e-6, 2)
    assert cfg.learner.batch_size == 128 and cfg.env.name == "math" and cfg.env.use_tool


@pytest.mark.parametrize(
    ("flags", "enabled", "address"),
    [
        ([], False, ""),
        (["--ray"], True, ""),
        (["--ray-address", "auto"], True, "auto"),
        (["--ray-address", "10.0.0.1:6379"], True, "10.0.0.1:6379"),
    ],
)
def test_ray_flags_become_the_ray_section(capsys, flags, enabled, address):
    assert main(["train", *flags, "--print-config"]) == 0
    ray = tomllib.loads(capsys.readouterr().out)["ray"]
    assert (ray["enabled"], ray["address"]) == (enabled, address)


def test_an_address_without_ray_enabled_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"ray\.address.*ray\.enabled = true"):
        load_config(None, ["ray.address=auto"])


def test_a_critic_actor_goes_with_several_learner_ranks():
    # One critic actor per learner rank, a critic group sharding the critic (no refusal).
    over = ["ray.critic_actor=true", "ray.learner_ranks=4", "learner.fsdp=true"]
    cfg = load_config(None, over)
    assert (cfg.ray.critic_actor, cfg.ray.learner_ranks) == (True, 4)


def test_custom_resources_pin_actors_and_are_checked():
    cfg = load_config(None, ["ray.learner_resources={learner_node = 1}"])
    assert (cfg.ray.learner_resources, cfg.ray.rollout_resources) == ({"learner_node": 1.0}, {})
    with pytest.raises(ConfigError, match=r"'CPU' is not a custom resource.*num_cpus"):
        load_config(None, ["ray.rollout_resources={CPU = 1}"])
    with pytest.raises(ConfigError, match=r"'rollout_node': the amount must be > 0"):
        load_config(None, ["ray.rollout_resources={rollout_node = 0}"])


def test_a_failed_ray_run_says_to_give_the_cluster_again(monkeypatch):
    from saorl.run import lock

    monkeypatch.setattr(lock, "last_claimed", Path("runs/r"))
    assert lock.resume_hint().endswith("saorl train --resume runs/r")
    # The saved address is not trusted on its own (saorl.security.trust): it must be given.
    assert "saorl train --resume runs/r --ray-address ADDRESS" in lock.resume_hint("auto")


def test_a_rollout_actor_lost_past_its_restarts_stops_with_the_resume_command(
    monkeypatch, capsys, tmp_path
):
    from saorl import api
    from saorl.distributed.ray_learner import ActorFailure
    from saorl.run import lock

    def lost(cfg, resume=None):  # what the batch collector raises past run.max_worker_restarts
        dead = ActorFailure("rollout-0: the Ray actor died: its node has died")
        raise RuntimeError("rollout-0 failed (3 restarts so far, run.max_worker_restarts=3)") from (
            dead
        )

    monkeypatch.setattr(api, "train", lost)
    monkeypatch.setattr(lock, "last_claimed", tmp_path / "r")
    assert main(["train", "--ray-address", "auto", f"run.output_dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert "saorl train: error: rollout-0 failed (3 restarts so far" in err
    assert f"saorl train --resume {tmp_path / 'r'} --ray-address ADDRESS" in err
    assert "Traceback" not in err

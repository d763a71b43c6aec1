"""Every config field is either allowed in a run folder's saved config or gated by
--trust-remote-code (`saorl.security.trust`): a new field must be put in one of the two lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from saorl.config import Config, ConfigError, config_to_toml, load_config
from saorl.config.base import leaf_fields
from saorl.security.trust import ALLOWED, GATED, load_trusted

# A value for each gated field that names something (with what makes the config valid).
EXAMPLES = {
    "model.trust_remote_code": ["model.trust_remote_code=true"],
    "env.name": ["env.name=/tmp/evil.py:make"],
    "env.reward_fns": ['env.reward_fns=["/tmp/evil.py:reward"]'],
    "env.tools": [
        "env.name=math",
        "env.tool_format=hermes",
        'env.tools=["/tmp/evil.py:tool"]',
    ],
    "env.agent.function": ["env.name=agent", "env.agent.function=/tmp/evil.py:run"],
    "env.agent.command": ["env.name=agent", "env.agent.command=touch /tmp/x"],
    "env.agent.tasks": ["env.agent.tasks=/tmp/evil.py:tasks"],
    "env.agent.env_passthrough": ['env.agent.env_passthrough=["HF_TOKEN"]'],
    "env.agent.host": ["env.agent.host=0.0.0.0"],
    "env.openenv.app": ["env.name=openenv", "env.openenv.app=/tmp/evil.py:app"],
    "env.openenv.url": ["env.name=openenv", "env.openenv.url=http://10.0.0.1:8000"],
    "env.verifiers.taskset": ["env.name=verifiers", "env.verifiers.taskset=/tmp/evil.py"],
    "env.verifiers.python": ["env.verifiers.python=/tmp/evil-python"],
    "env.swe.pip_args": ["env.swe.pip_args=--index-url http://x/simple"],
    "env.swe.tasks": ["env.swe.tasks=/tmp/tasks.jsonl"],
    "env.swe.repos_root": ["env.swe.repos_root=/tmp/repos"],
    "env.swe.cache_dir": ["env.swe.cache_dir=/tmp/cache"],
    "env.dataset": ["env.dataset=/etc/passwd"],
    "env.eval_dataset": ["env.eval_dataset=/etc/passwd"],
    "env.data_root": ["env.data_root=/etc"],
    "critic.init_from": ["critic.init_from=/tmp/critic.pt"],
    "learner.sft_cache": ["learner.sft_cache=/tmp/warmup"],
    "run.trackers": ['run.trackers=["wandb"]'],
    "ray.address": ["ray.enabled=true", "ray.address=10.0.0.1:6379"],
}


def _all_fields() -> set[str]:
    return set(leaf_fields(Config))  # nested tables' fields too: env.swe.tasks


def test_the_walk_reaches_nested_tables():
    fields = _all_fields()
    assert {"env.swe.tasks", "env.agent.function", "env.reasoning_gym.datasets"} <= fields
    assert "env.swe" not in fields


def test_every_config_field_is_allowed_or_gated():
    fields = _all_fields()
    unclassified = sorted(fields - ALLOWED - set(GATED))
    assert not unclassified, (
        f"new config fields {unclassified}: add each to saorl.security.trust.ALLOWED (a setting a "
        "received run folder may make) or saorl.security.trust.GATED (it names code, a command, an "
        "interpreter, a file, an address or a package)"
    )
    assert not ALLOWED & set(GATED)
    assert not (ALLOWED | set(GATED)) - fields, "a listed field no longer exists"
    assert set(EXAMPLES) == set(GATED)


@pytest.mark.parametrize("key", sorted(GATED))
def test_a_saved_gated_field_is_refused_unless_trusted_or_given(tmp_path: Path, key: str):
    saved = tmp_path / "config.toml"
    saved.write_text(config_to_toml(load_config(None, EXAMPLES[key])))
    with pytest.raises(ConfigError, match=rf"{key} = .*--trust-remote-code"):
        load_trusted(None, str(saved), [], trust=False)
    assert load_trusted(None, str(saved), [], trust=True)
    given = next(o for o in EXAMPLES[key] if o.startswith(f"{key}="))
    assert load_trusted(None, str(saved), [given], trust=False)


def test_settings_and_built_in_names_are_not_refused(tmp_path: Path):
    saved = tmp_path / "config.toml"
    mine = [
        "env.name=math",
        "env.dataset=math500",
        "env.agent.tasks=arithmetic",
        "run.trackers=[]",
        "model.name_or_path=Qwen/Qwen3-0.6B",
        "learner.lr=0.5",
        "run.output_dir=/somewhere/else",
    ]
    saved.write_text(config_to_toml(load_config(None, mine)))
    assert load_trusted(None, str(saved), [], trust=False).env.dataset == "math500"

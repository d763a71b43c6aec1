"""`[env]`'s families as nested tables (`env.swe`, `env.agent`, `env.openenv`, `env.verifiers`,
`env.reasoning_gym`): read from TOML, overrides and the Python API, written back, and the old
flat keys refused with the new key's name (pre-1.0: no silent aliases)."""

from __future__ import annotations

from pathlib import Path

import pytest

import saorl.api as api
from saorl.config import Config, ConfigError, EnvConfig, config_to_toml, load_config
from saorl.config.env_families import MOVED_ENV_KEYS
from saorl.security.trust import override_keys

# An old key's value in TOML (and as an override), valid for its new field.
OLD_VALUES = {"swe_validate": "false", "agent_env_passthrough": '["X"]', "rg_datasets": '["a"]'}
for _name in ("swe_num_tasks", "swe_max_output_chars"):
    OLD_VALUES[_name] = "200"
for _name in MOVED_ENV_KEYS:
    if _name.endswith("timeout_s"):
        OLD_VALUES[_name] = "5.0"


@pytest.mark.parametrize("old", sorted(MOVED_ENV_KEYS))
def test_an_old_flat_key_is_refused_naming_the_new_one(tmp_path: Path, old: str) -> None:
    new = f"env.{MOVED_ENV_KEYS[old]}"
    value = OLD_VALUES.get(old, '"x"')
    with pytest.raises(ConfigError, match=rf"env\.{old} is now {new}\b"):
        load_config(None, [f"env.{old}={value}"])
    path = tmp_path / "old.toml"
    path.write_text(f"[env]\n{old} = {value}\n")
    with pytest.raises(ConfigError, match=rf"env\.{old} is now {new}\b") as info:
        load_config(path)
    assert str(path) in str(info.value)  # the file it came from
    with pytest.raises(ConfigError, match=rf"is now {new}\b"):
        api.make_config({"env": {old: "x"}})
    with pytest.raises(ValueError, match=rf"is now {new}\b"):
        EnvConfig(**{old: "x"})


def test_old_and_new_names() -> None:
    assert MOVED_ENV_KEYS["swe_tasks"] == "swe.tasks"
    assert MOVED_ENV_KEYS["swe_validate"] == "swe.validate_tasks"
    assert MOVED_ENV_KEYS["agent"] == "agent.function"
    assert MOVED_ENV_KEYS["verifiers_env"] == "verifiers.taskset"
    assert MOVED_ENV_KEYS["rg_answer_format"] == "reasoning_gym.answer_format"
    # every new key exists; no old key does
    env = Config().env
    for old, new in MOVED_ENV_KEYS.items():
        family, field = new.split(".")
        assert field in type(getattr(env, family)).model_fields
        assert old == "agent" or old not in EnvConfig.model_fields


def test_nested_tables_from_toml_and_overrides_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        '[env]\nname = "agent"\n\n[env.agent]\nfunction = "my_agent.py:run"\n'
        'tasks = "reasoning_gym"\n\n[env.reasoning_gym]\ndatasets = ["chain_sum"]\n'
    )
    cfg = load_config(path, ["env.reasoning_gym.answer_format=plain", "env.swe.num_tasks=3"])
    assert cfg.env.agent.function.endswith("/my_agent.py:run")  # stored absolute
    assert cfg.env.agent.tasks == "reasoning_gym" and cfg.env.agent.host == "127.0.0.1"
    assert cfg.env.reasoning_gym.datasets == ["chain_sum"]
    assert cfg.env.reasoning_gym.answer_format == "plain" and cfg.env.swe.num_tasks == 3
    text = config_to_toml(cfg)
    assert "[env.agent]\nfunction = " in text and "\n[env.swe]\n" in text
    saved = tmp_path / "saved.toml"
    saved.write_text(text)
    assert load_config(saved) == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.swe.bogus=1", r"unknown key 'env\.swe\.bogus'; valid keys in \[env\.swe\]: source"),
        ("env.swe.num_task=3", r"did you mean 'env\.swe\.num_tasks'"),
        ("env.swe.num_tasks=0", r"env\.swe\.num_tasks: must be >= 1, got 0"),
        ("env.agent.tasks=agent", r"env\.agent\.tasks: names the task source, not 'agent'"),
        ("env.swe.pip_args='unclosed", r"env\.swe\.pip_args: cannot split"),
        ("env.openenv.url=localhost", r"env\.openenv\.url: 'localhost' is not a server URL"),
    ],
)
def test_nested_errors_name_the_nested_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_family_is_a_table_not_a_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[env]\nswe = 3\n")
    with pytest.raises(ConfigError, match=r"env\.swe: must be a table \(\[env\.swe\] in TOML\)"):
        load_config(path)


def test_cross_family_checks_name_the_new_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"exactly one of env\.agent\.function .*env\.agent\.command"
    ):
        load_config(None, ["env.name=agent"])
    with pytest.raises(ConfigError, match=r"env\.verifiers\.taskset"):
        load_config(None, ["env.name=verifiers"])
    with pytest.raises(ConfigError, match=r"env\.reasoning_gym\.datasets is for env\.name"):
        load_config(None, ['env.reasoning_gym.datasets=["chain_sum"]'])


def test_the_python_api_takes_nested_and_dotted_keys() -> None:
    nested = api.make_config({"env": {"swe": {"num_tasks": 5}}}, {"env.swe.test_timeout_s": 2.0})
    assert nested.env.swe.num_tasks == 5 and nested.env.swe.test_timeout_s == 2.0
    dotted = api.make_config({"env.swe": {"num_tasks": 5}, "env.swe.test_timeout_s": 2.0})
    assert dotted == nested
    # env.args is a table that is a value: kept whole, not read as keys
    rg = api.make_config(
        {"env": {"name": "reasoning_gym", "args": {"chain_sum": {"weight": 2}}}},
        {"env.reasoning_gym.datasets": ["chain_sum"]},
    )
    assert rg.env.args == {"chain_sum": {"weight": 2}}
    assert api._dotted_items({"env": {"agent": {"command": "x"}}}) == {"env.agent.command": "x"}


def test_override_keys_of_nested_fields_are_their_dotted_names() -> None:
    assert override_keys(["env.swe.tasks=/x.jsonl", "run.name=a"]) == {"env.swe.tasks", "run.name"}


def test_flat_views_name_nested_fields_by_their_dotted_keys(tmp_path: Path) -> None:
    from saorl.experiments.compare import _config_diff
    from saorl.monitoring.tracking import flat_config

    cfg = load_config(None, ["env.swe.num_tasks=3", 'env.reasoning_gym.answer_format="plain"'])
    flat = flat_config(cfg)  # MLflow params
    assert flat["env.swe.num_tasks"] == 3 and flat["env.agent.env_passthrough"] == "[]"
    assert "env.swe" not in flat and flat["learner.lr"] == cfg.learner.lr
    saved = tmp_path / "config.toml"
    saved.write_text(config_to_toml(Config()))
    assert _config_diff(saved, cfg) == ["env.swe.num_tasks", "env.reasoning_gym.answer_format"]

"""Config models, TOML loading, overrides and the error messages users see."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from saorl.config import (
    AlgorithmConfig,
    Config,
    ConfigError,
    CriticConfig,
    EnvConfig,
    config_to_toml,
    describe_config,
    load_config,
)
from saorl.config.base import leaf_fields
from saorl.config.env_families import SweConfig


def _all_fields() -> list[tuple[str, str, object]]:
    out = []
    for section, info in Config.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in leaf_fields(model).items():  # nested tables too: swe.tasks
            out.append((section, name, field))
    return out


def _all_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    subs = [f.annotation for f in model.model_fields.values()]
    nested = [m for m in subs if isinstance(m, type) and issubclass(m, BaseModel)]
    return [model, *(m for sub in nested for m in _all_models(sub))]


def test_defaults_validate() -> None:
    cfg = Config()
    assert Config.model_validate(cfg.model_dump()) == cfg
    assert load_config() == cfg
    assert cfg.algorithm.eps_low == 0.3 and cfg.algorithm.eps_high == 5.0
    assert cfg.critic.updates_per_step == 2 and cfg.critic.warmup_steps == 10
    assert cfg.model.max_seq_len > cfg.rollout.max_new_tokens


def test_every_field_has_default_and_one_line_description() -> None:
    for section, name, field in _all_fields():
        has_default = field.default is not PydanticUndefined or field.default_factory is not None
        assert has_default, f"{section}.{name} has no default"
        assert field.description, f"{section}.{name} has no description"
        assert "\n" not in field.description, f"{section}.{name}: description is not one line"


def test_every_model_forbids_extra_and_validates_assignment() -> None:
    models = _all_models(Config)
    assert EnvConfig in models and SweConfig in models
    for model in models:
        assert model.model_config.get("extra") == "forbid"
        assert model.model_config.get("validate_assignment") is True
    cfg = Config()
    with pytest.raises(ValueError):
        cfg.algorithm.eps_low = -1.0


def test_toml_round_trip_defaults(tmp_path: Path) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text(config_to_toml(Config()))
    assert load_config(path) == Config()


def test_toml_round_trip_non_defaults(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "critic.value_clip=0.2",
            'rollout.stop=["\\n", "a\\"b\\\\c", "tab\\there", "é"]',
            "run.name=exp1",
            "algorithm.eps_low=0.8",
            "algorithm.eps_high=3.0",
            "learner.lr=1e-6",
            "run.progress=false",
            "model.device=cuda:0",
        ]
    )
    assert cfg.rollout.stop == ["\n", 'a"b\\c', "tab\there", "é"]
    for comments in (False, True):
        path = tmp_path / f"cfg{comments}.toml"
        path.write_text(config_to_toml(cfg, comments=comments), encoding="utf-8")
        assert load_config(path) == cfg


def test_none_values_are_omitted_from_toml() -> None:
    text = config_to_toml(Config())
    assert "value_clip" not in text
    assert "value_clip = 0.5" in config_to_toml(load_config(overrides=["critic.value_clip=0.5"]))


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text('[learner]\nlr = 2e-5\nbatch_size = 8\n[run]\nname = "from_file"\n')
    cfg = load_config(path, ["learner.batch_size=16", "learner.batch_size=32"])
    assert cfg.learner.lr == 2e-5
    assert cfg.learner.batch_size == 32  # later override wins
    assert cfg.run.name == "from_file"
    assert cfg.critic == CriticConfig()  # sections absent from the file keep defaults


@pytest.mark.parametrize(
    ("override", "section", "name", "expected"),
    [
        ("learner.lr=1e-4", "learner", "lr", 1e-4),
        ("learner.lr=3", "learner", "lr", 3.0),  # an int is fine for a float field
        ("learner.batch_size=16", "learner", "batch_size", 16),
        ("run.progress=false", "run", "progress", False),
        ("algorithm.skip_observations=true", "algorithm", "skip_observations", True),
        ("run.name=exp1", "run", "name", "exp1"),  # bare word: a plain string
        ('run.name="quoted"', "run", "name", "quoted"),
        ("run.name=123", "run", "name", "123"),  # string field keeps the text as written
        ("run.name = spaced ", "run", "name", "spaced"),
        ("algorithm.loss_agg=seq_mean_token_mean", "algorithm", "loss_agg", "seq_mean_token_mean"),
        ('rollout.stop=["a", "b"]', "rollout", "stop", ["a", "b"]),
        ("rollout.stop=[]", "rollout", "stop", []),
        ("model.device=cuda:1", "model", "device", "cuda:1"),
        ("model.dtype=bfloat16", "model", "dtype", "bfloat16"),
        ("critic.value_clip=0.2", "critic", "value_clip", 0.2),
        ("critic.value_clip=none", "critic", "value_clip", None),
        ("run.output_dir=/tmp/x=y", "run", "output_dir", "/tmp/x=y"),  # split on the first '='
    ],
)
def test_override_types(override: str, section: str, name: str, expected: object) -> None:
    cfg = load_config(overrides=[override])
    value = getattr(getattr(cfg, section), name)
    assert value == expected
    assert type(value) is type(expected)


def test_none_override_unsets_value_from_file(tmp_path: Path) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text("[critic]\nvalue_clip = 0.2\n")
    assert load_config(path).critic.value_clip == 0.2
    assert load_config(path, ["critic.value_clip=null"]).critic.value_clip is None


_BAD_OVERRIDES = [
    # (overrides, dotted key that must be named, further text the message must contain)
    (["algorith.eps_low=0.3"], "algorith", "did you mean 'algorithm'"),
    (["algorithm.eps_lo=0.3"], "algorithm.eps_lo", "did you mean 'algorithm.eps_low'"),
    (["learner.seed=1"], "learner.seed", "run.seed"),
    (["learner.batch_size=abc"], "learner.batch_size", "must be an integer"),
    (["learner.batch_size=2.5"], "learner.batch_size", "must be an integer"),
    (["learner.lr=fast"], "learner.lr", "must be a number"),
    (["run.progress=1"], "run.progress", "true or false"),
    (["rollout.stop=x"], "rollout.stop", "must be a list"),
    (["algorithm.eps_low=-0.1"], "algorithm.eps_low", "must be > 0, got -0.1"),
    (["algorithm.eps_low=0"], "algorithm.eps_low", "must be > 0, got 0"),
    (["algorithm.eps_high=0"], "algorithm.eps_high", "must be > 0"),
    (["algorithm.eps_high=-1.0"], "algorithm.eps_high", "must be > 0"),
    (["algorithm.lambda_policy=1.5"], "algorithm.lambda_policy", "must be in [0, 1]"),
    (["algorithm.lambda_policy=-0.1"], "algorithm.lambda_policy", "must be in [0, 1]"),
    (["algorithm.lambda_critic=1.01"], "algorithm.lambda_critic", "must be in [0, 1]"),
    (["algorithm.gamma=2"], "algorithm.gamma", "must be in [0, 1]"),
    (["algorithm.gamma=-0.5"], "algorithm.gamma", "must be in [0, 1]"),
    (["rollout.top_p=0"], "rollout.top_p", "must be in (0, 1]"),
    (["rollout.temperature=0"], "rollout.temperature", "must be > 0"),
    (["learner.batch_size=0"], "learner.batch_size", "must be >= 1, got 0"),
    (["learner.max_staleness=-1"], "learner.max_staleness", "must be >= 0, got -1"),
    (["env.num_digits=9"], "env.num_digits", "must be in [1, 8]"),
    (["critic.value_clip=0"], "critic.value_clip", "must be > 0"),
    (["learner.lr=inf"], "learner.lr", "finite"),
    (["algorithm.name=foo"], "algorithm.name", '"sao"'),
    (["model.dtype=fp8"], "model.dtype", '"float32", "bfloat16", "float16"'),
    (["run.concurrency=async"], "run.concurrency", '"threads", "sync"'),
    (["model.device=gpu"], "model.device", "'cuda:N'"),
    (["model.name_or_path=builtin:huge"], "model.name_or_path", "builtin:tiny"),
    (["run.name=a/b"], "run.name", "path separators"),
    (["run.name="], "run.name", "directory name"),
    (["model.num_kv_heads=3"], "model.num_kv_heads", "must divide"),
    (["model.max_seq_len=8"], "model.max_seq_len", "rollout.max_new_tokens"),
    (["algorithm.eps_low"], "algorithm.eps_low", "no '='"),
    (["eps_low=0.3"], "eps_low", "section.field"),
]


@pytest.mark.parametrize(("overrides", "key", "text"), _BAD_OVERRIDES)
def test_bad_overrides_name_the_key(overrides: list[str], key: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    message = str(info.value)
    assert key in message
    assert text in message


_BAD_FILES = [
    # (TOML text, dotted key that must be named, further text the message must contain)
    ("[algorithmm]\neps_low = 0.3\n", "algorithmm", "did you mean 'algorithm'"),
    ("seed = 3\n", "seed", "run.seed"),
    ("[critic]\nupdate_per_step = 2\n", "critic.update_per_step", "critic.updates_per_step"),
    ('[learner]\nbatch_size = "64"\n', "learner.batch_size", "must be an integer"),
    ("[learner]\nbatch_size = 2.0\n", "learner.batch_size", "must be an integer"),
    ("[algorithm]\neps_low = -0.1\n", "algorithm.eps_low", "must be > 0, got -0.1"),
    ('[algorithm]\nname = "ppo"\n', "algorithm.name", '"grpo"'),
    ("algorithm = 3\n", "algorithm", "must be a table"),
    ("[run]\nname = 5\n", "run.name", "must be a string"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), _BAD_FILES)
def test_bad_files_name_the_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert key in message
    assert fragment in message
    assert str(path) in message  # says where the bad value came from


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_several_errors_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[algorithm]\neps_low = 0\ngamma = 3\n[learner]\nbatch_size = 0\n")
    message = _error(path)
    for key in ("algorithm.eps_low", "algorithm.gamma", "learner.batch_size"):
        assert key in message
    assert message.startswith("3 config errors")


def test_malformed_toml_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[learner]\nlr = 1e-4\nbatch_size = = 3\n")
    message = _error(path)
    assert "malformed TOML" in message
    assert str(path) in message
    assert "line 3" in message and "column" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    message = _error(path)
    assert "not found" in message and str(path) in message


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_describe_config_lists_every_field() -> None:
    text = describe_config()
    for section, name, field in _all_fields():
        assert f"{section}.{name} = " in text
        assert field.description in text
    assert '"token_mean" | "seq_mean_token_mean"' in text
    assert "algorithm.eps_low = 0.3  (float, > 0)" in text


def test_sections_validate_alone() -> None:
    assert AlgorithmConfig(eps_low=0.8, eps_high=3.0).eps_high == 3.0
    with pytest.raises(ValueError, match="extra"):
        AlgorithmConfig(eps=0.2)  # type: ignore[call-arg]


def test_example_config_lists_every_default():
    # examples/sao.toml documents every field; it must stay loadable and equal to the defaults.
    path = Path(__file__).resolve().parents[2] / "examples" / "sao.toml"
    assert load_config(path) == Config()


def test_dataset_paths_are_stored_absolute_presets_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    cfg = load_config(None, ["env.dataset=data/train.jsonl", "env.eval_dataset=aime25"])
    assert cfg.env.dataset == str(tmp_path / "data" / "train.jsonl")
    assert cfg.env.eval_dataset == "aime25"
    # A path that does not exist is kept as written, for the loader's error to name.
    assert load_config(None, ["env.dataset=missing.jsonl"]).env.dataset == "missing.jsonl"

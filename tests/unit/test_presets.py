"""`algorithm.name` presets across sections: each recipe's components, explicit settings winning,
saved configs that mean what they say, and the listing of `--help-config`."""

from __future__ import annotations

from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.config import AlgorithmConfig, Config, ConfigError, config_to_toml, load_config
from saorl.config.presets import PRESETS, Times


def _field(cfg: Config, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def test_vapo_is_the_published_recipe() -> None:
    cfg = load_config(None, ["algorithm.name=vapo"])
    a, c = cfg.algorithm, cfg.critic
    assert (a.advantage, a.policy_loss) == ("gae", "ppo_clip")
    assert (a.lambda_mode, a.lambda_alpha, a.lambda_critic) == ("adaptive", 0.05, 1.0)
    assert (a.clip_eps_low, a.clip_eps_high) == (0.2, 0.28)
    assert a.minibatches > 1  # the ratio moves, so clip-higher can act
    assert a.lm_loss_coef == 0.1
    assert a.group_sampling and a.group_size == 16 and a.samples_per_prompt == 16
    assert c.freeze == "none" and c.updates_per_step == 1 and c.warmup_steps == 50
    assert c.lr == pytest.approx(2 * cfg.learner.lr)  # VAPO: 2e-6 vs 1e-6


def test_the_old_vapo_arm_keeps_sao_critic_recipe_under_an_honest_name() -> None:
    old, sao = load_config(None, ["algorithm.name=sao_ppo_clip"]), load_config(None, [])
    assert (old.algorithm.advantage, old.algorithm.policy_loss) == ("gae", "ppo_clip")
    assert old.critic == sao.critic  # frozen attention, K=2, 5x lr, 10 warm-up steps
    assert old.algorithm.lambda_alpha == 1.5 and old.algorithm.minibatches == 1


def test_sao_preset_is_the_field_defaults() -> None:
    # Fields no preset names keep their defaults, so SAO's settings must be exactly those.
    default = Config()
    for setting in PRESETS["sao"].settings:
        assert not isinstance(setting.value, Times)
        assert _field(default, setting.key) == setting.value, setting.key
    assert load_config(None, ["algorithm.name=sao"]) == default


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_sets_what_it_lists(name: str) -> None:
    cfg = load_config(None, [f"algorithm.name={name}"])
    for setting in PRESETS[name].settings:
        value = setting.value
        if isinstance(value, Times):
            value = value.factor * _field(cfg, value.key)  # type: ignore[operator]
        assert _field(cfg, setting.key) == value, setting.key
        assert setting.source.strip()


def test_explicit_settings_win_over_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "cfg.toml"
    path.write_text(
        '[algorithm]\nname = "vapo"\nlambda_alpha = 1.5\n[critic]\nfreeze = "attention"\n'
    )
    cfg = load_config(path, ["critic.updates_per_step=3", "algorithm.minibatches=1"])
    assert cfg.algorithm.lambda_alpha == 1.5 and cfg.critic.freeze == "attention"
    assert cfg.critic.updates_per_step == 3 and cfg.algorithm.minibatches == 1
    assert cfg.algorithm.lm_loss_coef == 0.1  # what was not set still comes from the preset
    # A derived value follows the field it derives from, and an explicit one beats it.
    assert load_config(None, ["algorithm.name=vapo", "learner.lr=1e-6"]).critic.lr == 2e-6
    assert load_config(None, ["algorithm.name=vapo", "critic.lr=3e-6"]).critic.lr == 3e-6


def test_saved_config_round_trips_and_another_name_means_what_it_says(tmp_path: Path) -> None:
    vapo = load_config(None, ["algorithm.name=vapo", "learner.lr=1e-6", "run.name=v"])
    saved = tmp_path / "config.toml"
    saved.write_text(config_to_toml(vapo))
    assert load_config(saved) == vapo
    for comments in (False, True):
        saved.write_text(config_to_toml(vapo, comments=comments))
        assert load_config(saved) == vapo
    # The saved VAPO run with algorithm.name=sao is SAO, not SAO with VAPO's critic.
    switched = load_config(saved, ["algorithm.name=sao"])
    expected = load_config(None, ["algorithm.name=sao", "learner.lr=1e-6", "run.name=v"])
    assert switched == expected
    # --print-config still shows every value in effect: the preset's ones commented out.
    text = config_to_toml(vapo)
    assert '# freeze = "none"  # algorithm.name = "vapo"' in text
    assert "# lr = 2e-06  # algorithm.name" in text


def test_section_instances_get_the_preset_too() -> None:
    alone = AlgorithmConfig(name="vapo")
    assert alone.lambda_alpha == 0.05 and alone.minibatches == 4
    cfg = Config(algorithm=AlgorithmConfig(name="vapo"))
    assert cfg.critic.freeze == "none" and cfg.critic.lr == 2 * cfg.learner.lr


def test_group_sampling_needs_whole_groups_in_a_batch() -> None:
    with pytest.raises(ConfigError, match=r"learner.batch_size \(24\).*group_size \(16\)"):
        load_config(None, ["algorithm.name=vapo", "learner.batch_size=24"])
    cfg = load_config(
        None, ["algorithm.name=vapo", "learner.batch_size=24", "algorithm.group_size=8"]
    )
    assert cfg.algorithm.samples_per_prompt == 8
    assert (
        load_config(
            None, ["algorithm.name=sao", "learner.batch_size=24"]
        ).algorithm.samples_per_prompt
        == 1
    )


def test_unknown_name_is_still_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r'algorithm\.name: must be one of .*"sao_ppo_clip"'):
        load_config(None, ["algorithm.name=ppo"])


def test_help_config_lists_each_component_with_its_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.name presets" in out
    assert "  vapo: VAPO as published" in out
    assert "algorithm.lambda_alpha = 0.05  (VAPO (arXiv 2504.05118): alpha = 0.05)" in out
    assert "critic.lr = 2 x learner.lr" in out
    assert "  sao_ppo_clip: SAO's critic recipe with PPO clip-higher" in out

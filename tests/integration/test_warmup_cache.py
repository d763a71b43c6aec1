"""`learner.sft_cache`: the supervised warm-up's weights stored under a key of the settings that
shape them, and loaded back by a run with the same key (saorl/learner/sft.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from saorl.envs.factory import build_env
from saorl.learner.sft import supervised_warmup, warmup_key
from saorl.models.loading import load_policy
from tests.conftest import tiny_config


def test_the_key_changes_with_what_shapes_the_warm_up_only() -> None:
    base = warmup_key(tiny_config("learner.sft_steps=5"))
    changes = ("run.seed=1", "model.hidden_size=48", "learner.sft_lr=3e-4", "learner.sft_steps=6")
    for changed in (*changes, "learner.sft_batch_size=8", "env.num_digits=3"):
        assert warmup_key(tiny_config("learner.sft_steps=5", changed)) != base, changed
    # The algorithm, critic and RL budget act after the warm-up: arms differing there share it.
    after = ("algorithm.name=grpo", "critic.lr=1e-3", "run.total_steps=7", "learner.lr=1e-4")
    for same in (*after, "learner.sft_cache='elsewhere'"):
        assert warmup_key(tiny_config("learner.sft_steps=5", same)) == base, same


def _warmed(cache: Path | None, *overrides: str) -> tuple[dict[str, torch.Tensor], Path | None]:
    where = [f"learner.sft_cache={str(cache)!r}"] if cache else []
    cfg = tiny_config("learner.sft_steps=4", "learner.sft_batch_size=8", *where, *overrides)
    torch.manual_seed(cfg.run.seed)  # as saorl.loop does before building the model
    policy, tokenizer = load_policy(cfg.model)
    supervised_warmup(policy, tokenizer, build_env(cfg.env), cfg, None)
    return policy.state_dict(), next(iter(cache.glob("sft-*.pt")), None) if cache else None


def test_a_loaded_warm_up_equals_the_one_trained_here(tmp_path: Path, capsys) -> None:
    cache = tmp_path / "warmup"
    first, stored = _warmed(cache)
    assert stored is not None and "reused" not in capsys.readouterr().err
    # Another arm (another algorithm) loads it, and it is what it would have trained itself.
    loaded, _ = _warmed(cache, "algorithm.name=grpo")
    assert "supervised warm-up reused from" in capsys.readouterr().err
    fresh, _ = _warmed(None, "algorithm.name=grpo")
    torch.manual_seed(tiny_config().run.seed)
    untrained = load_policy(tiny_config().model)[0].state_dict()
    for k, v in fresh.items():
        torch.testing.assert_close(loaded[k], v, rtol=0, atol=0)
        torch.testing.assert_close(first[k], v, rtol=0, atol=0)
    assert any(not torch.equal(fresh[k], untrained[k]) for k in fresh)  # it did train


def test_another_seed_does_not_load_it(tmp_path: Path, capsys) -> None:
    cache = tmp_path / "warmup"
    a, _ = _warmed(cache)
    b, _ = _warmed(cache, "run.seed=1")
    assert "reused" not in capsys.readouterr().err
    assert len(list(cache.glob("sft-*.pt"))) == 2
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_no_cache_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _warmed(None)
    _warmed(None)
    assert list(tmp_path.iterdir()) == [] and "reused" not in capsys.readouterr().err

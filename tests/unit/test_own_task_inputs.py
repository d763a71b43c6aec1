"""Own-dataset inputs checked before step 1: the held-out split of a small file, prompts against
`model.max_seq_len` (with the real char tokenizer), newlines on the built-in model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saorl.config import ConfigError, load_config
from saorl.envs.factory import build_env, recorded_env
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.prompt_check import check_prompts


def _data(tmp_path: Path, rows: int, text: str = "What is {i} plus 1?") -> Path:
    path = tmp_path / "train.jsonl"
    lines = [json.dumps({"prompt": text.format(i=i), "answer": str(i + 1)}) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_small_file_holds_out_a_tenth_and_the_run_records_it(tmp_path: Path) -> None:
    cfg = load_config(None, ["env.name=math", f"env.dataset={_data(tmp_path, 30)}"])
    spec = build_env(cfg.env)
    assert (len(spec.task.train), len(spec.task.held_out)) == (27, 3)
    assert cfg.env.eval_size is None  # resolved where used, never written back
    assert recorded_env(cfg.env, spec).eval_size == 3  # what the run's config.toml records
    cfg = load_config(
        None, ["env.name=math", f"env.dataset={_data(tmp_path, 30)}", "env.eval_size=30"]
    )
    with pytest.raises(ConfigError, match=r"env.eval_size=30 holds out every one of .* 30 rows"):
        build_env(cfg.env)


def _cfg(tmp_path: Path, *extra: str):
    return load_config(
        None, ["env.name=math", "env.use_tool=false", *extra, f"env.dataset={_data(tmp_path, 20)}"]
    )


def test_prompts_too_long_stop_before_step_1_naming_the_length(tmp_path: Path, capsys) -> None:
    cfg = _cfg(tmp_path)  # model.max_seq_len=64: the instructions alone are longer
    tok = build_char_tokenizer(with_newlines=cfg.model.builtin_newlines)
    with pytest.raises(
        ConfigError,
        match=r"model.max_seq_len=64: 10 of 10 sampled prompts are "
        r"longer than the context .*set model.max_seq_len=\d+",
    ):
        check_prompts(cfg, build_env(cfg.env), tok)
    cfg = _cfg(tmp_path, "model.max_seq_len=256", "rollout.max_new_tokens=64")
    check_prompts(cfg, build_env(cfg.env), tok)
    assert capsys.readouterr().err == ""


def test_newlines_on_the_built_in_model(tmp_path: Path, capsys) -> None:
    # A dataset on the built-in model gets newline tokens unless told otherwise ...
    assert _cfg(tmp_path).model.builtin_newlines
    assert not load_config(None, []).model.builtin_newlines  # the default run keeps its vocab
    # ... and without them the check says which characters read as <unk> and what to set.
    cfg = _cfg(tmp_path, "model.builtin_newlines=false", "model.max_seq_len=256")
    check_prompts(cfg, build_env(cfg.env), build_char_tokenizer(with_newlines=False))
    err = capsys.readouterr().err
    assert "reads as <unk> ('\\n')" in err and "model.builtin_newlines=true" in err


def test_a_failed_run_folder_with_its_recorded_split_is_still_removed(tmp_path: Path) -> None:
    from saorl.config import config_to_toml
    from saorl.run.lock import remove_failed_run

    cfg = load_config(None, ["env.name=math", "run.name=r", f"run.output_dir={tmp_path}"])
    recorded = cfg.model_copy(update={"env": cfg.env.model_copy(update={"eval_size": 3})})
    other = load_config(None, ["env.name=math", "run.name=r", "learner.lr=0.5"])
    for name, saved in (("r", recorded), ("r-1", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(config_to_toml(saved))
    remove_failed_run(cfg, tmp_path, before=set())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-1"]  # another run's is kept

"""Every checkpoint carries the policy in Hugging Face format (`run.save_hf`): an intermediate
step loads with plain `transformers` and gives the learner's logits at that step, `saorl eval`
takes it with the run's own config, `run.keep_last_checkpoints` prunes both, and a resume deletes
what a killed write left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from saorl.checkpoint.io import (
    checkpoint_dir,
    hf_checkpoint_path,
    list_checkpoints,
    load_latest_checkpoint,
    load_state_file,
)
from saorl.cli.main import main
from saorl.config import load_config
from saorl.models.loading import load_policy
from tests.conftest import tiny_config

# Sync: the learner's weights at a checkpoint are exactly those of its step. A random policy
# earns no reward, so an entropy bonus is what moves it (and tells the steps' copies apart).
RUN = (
    "run.total_steps=3",
    "run.checkpoint_every=1",
    "run.eval_every=0",
    "run.concurrency=sync",
    "run.trackers=[]",
    "algorithm.entropy_coef=0.01",
    "learner.lr_warmup_steps=0",
)


def _train(out: Path, *overrides: str) -> Path:
    from saorl.loop import train_from_config

    cfg = tiny_config(*RUN, f"run.output_dir={out}", *overrides)
    return Path(train_from_config(cfg)["run_dir"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("hf"), "run.keep_last_checkpoints=0")


def _names(run: Path) -> list[str]:
    return sorted(p.name for p in checkpoint_dir(run).iterdir())


def test_each_checkpoint_has_its_policy_in_hf_format(run_dir: Path):
    steps = range(4)  # the checkpoint before RL (step 0), then one per step
    want = sorted(f"step_{s:08d}{x}" for s in steps for x in (".hf", ".pt", ".sha256"))
    assert _names(run_dir) == want
    for s in steps:
        hf = hf_checkpoint_path(run_dir, s)
        files = {p.name for p in hf.iterdir()}
        assert {
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        } <= files, files
    # final/ is written by the same function: the last checkpoint's weights, the same files.
    final = run_dir / "final"
    assert {p.name for p in final.iterdir()} == {p.name for p in hf.iterdir()}
    last, exported = load_file(hf / "model.safetensors"), load_file(final / "model.safetensors")
    assert last.keys() == exported.keys()
    assert all(torch.equal(last[k], exported[k]) for k in last)


def test_intermediate_checkpoint_loads_with_transformers_and_matches_the_learner(run_dir: Path):
    cfg = load_config(run_dir / "config.toml")
    hf = hf_checkpoint_path(run_dir, 2)
    model = AutoModelForCausalLM.from_pretrained(hf).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf)
    # The learner's policy at step 2, from the checkpoint it resumes from.
    policy, run_tokenizer = load_policy(cfg.model)
    policy.load_state_dict(load_state_file(run_dir / "checkpoints" / "step_00000002.pt")["policy"])
    policy.eval()
    text = "12+7="
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == run_tokenizer.encode(text)
    with torch.no_grad():
        got, want = model(ids).logits, policy(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # Step 1 was critic warm-up, step 2 updated the policy: each copy is its own step's.
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(hf_checkpoint_path(run_dir, 1))(ids).logits
    assert (before - got).abs().max() > 1e-4


def test_saorl_eval_takes_a_checkpoint_copy_with_the_runs_config(run_dir: Path, tmp_path, capsys):
    hf = hf_checkpoint_path(run_dir, 2)
    assert main(["eval", str(hf), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "hidden_size = 32" in printed and "eval_size = 16" in printed  # the run's, not defaults
    out = tmp_path / "e.jsonl"
    assert main(["eval", str(hf), "--limit", "3", "--out", str(out)]) == 0
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["problems"] == 3 and summary["model"] == str(hf)


def test_keep_last_checkpoints_prunes_the_hf_copies_too(tmp_path: Path):
    run = _train(tmp_path, "run.keep_last_checkpoints=2")
    want = [f"step_{s:08d}{x}" for s in (2, 3) for x in (".hf", ".pt", ".sha256")]
    assert _names(run) == want
    run = _train(tmp_path, "run.save_hf=false", "run.name=plain")
    assert [p.name for p in list_checkpoints(run)] == [f"step_{s:08d}.pt" for s in (1, 2, 3)]
    assert not list(checkpoint_dir(run).glob("*.hf"))
    assert (run / "final" / "config.json").is_file()


def test_resume_deletes_what_a_killed_write_left(run_dir: Path, tmp_path: Path):
    import shutil

    run = Path(shutil.copytree(run_dir, tmp_path / "r"))
    d = checkpoint_dir(run)
    (d / "step_00000009.hf").mkdir()  # exported, then killed before its .pt
    (d / ".step_00000009.hf.tmp.123").mkdir()  # killed while exporting
    (d / ".step_00000009.pt.tmp.123").write_bytes(b"torn")
    (d / "step_00000009.sha256").write_text("")  # digests written, killed before the rename
    (run / ".final.tmp.123").mkdir()  # killed while exporting final/
    keep = set(_names(run)) - {
        "step_00000009.hf",
        ".step_00000009.hf.tmp.123",
        ".step_00000009.pt.tmp.123",
        "step_00000009.sha256",
    }
    path, state = load_latest_checkpoint(run, quarantine=True)
    assert path.name == "step_00000003.pt" and state["step"] == 3
    assert set(_names(run)) == keep
    assert not (run / ".final.tmp.123").exists() and (run / "final" / "config.json").is_file()

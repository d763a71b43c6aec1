"""Hostile input: each malformed file gets a clear error naming it (exit code 2, no traceback)
or a contained failure, and no checkpoint is ever lost. The README's reliability table lists
these cases."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, save_checkpoint
from saorl.cli.main import main
from saorl.config import load_config
from saorl.models.loading import load_policy, save_pretrained
from tests.faults._common import TINY_SYNC

pytestmark = pytest.mark.faults

RUN = [*TINY_SYNC, "run.total_steps=1"]


def _train(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    code = main(["train", *RUN, f"run.output_dir={tmp_path / 'runs'}", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


# -- config files ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[learner\nlr = 1e-4\n", "malformed TOML"),
        (b"[learner]\nlr = ", "malformed TOML"),  # truncated mid-value
        (b"\xff\xfe[learner]\n", "not UTF-8"),
        (b"[learner]\nlr = 'fast'\n", "learner.lr"),
        (b"[learnr]\nlr = 1e-4\n", "learnr"),
    ],
    ids=["malformed", "truncated", "binary", "wrong_type", "unknown_section"],
)
def test_bad_config_file(tmp_path: Path, capsys, content: bytes, message: str):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    code, err = _train(tmp_path, capsys, "--config", str(path))
    assert code == 2 and message in err and "bad.toml" in err


# -- dataset files -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"problem": "1+1", "answer": "2"}\n{"problem": "2+', "line 2: invalid JSON"),
        (b'{"problem": "1+1", "answer": "2"}\n\xff\xfe\n', "line 2: not UTF-8"),
        (b'{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n', "answer"),
        (b"", "no"),
        # valid JSON that Python's parser still rejects (RecursionError, ValueError)
        (b'{"problem": "1+1", "answer": "2"}\n' + b"[" * 100_000 + b"\n", "line 2: unreadable"),
        (b'{"problem": "1+1", "answer": ' + b"1" * 5000 + b"}\n", "line 1: unreadable JSON"),
        # TRL/verl layouts: a conversation that does not end with the user, a verl row
        # without its ground truth
        (
            b'{"prompt": [{"role": "user", "content": "1+1"}], "answer": "2"}\n'
            b'{"prompt": [{"role": "assistant", "content": "2"}], "answer": "2"}\n',
            "row 2: field 'prompt': the last message is from 'assistant'",
        ),
        (
            b'{"prompt": [{"role": "user", "content": "1+1"}], "reward_model": {"style": "r"}}\n',
            "row 1: no field 'answer' or 'reward_model.ground_truth'",
        ),
    ],
    ids=[
        "truncated",
        "binary",
        "missing_answer",
        "empty",
        "deeply_nested",
        "huge_integer",
        "conversation_ends_with_assistant",
        "verl_without_ground_truth",
    ],
)
def test_bad_dataset_file(tmp_path: Path, capsys, content: bytes, message: str):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    code, err = _train(tmp_path, capsys, "env.name=math", f"env.dataset={path}", "env.eval_size=1")
    assert code == 2 and message in err and "data.jsonl" in err
    assert not (tmp_path / "runs").exists()  # refused before any run directory was made


def test_unreadable_parquet_dataset(tmp_path: Path, capsys):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1 not really PAR1")
    code, err = _train(tmp_path, capsys, "env.name=math", f"env.dataset={path}", "env.eval_size=1")
    # without pyarrow: "needs pyarrow"; with it: "not readable as Parquet"
    assert code == 2 and "data.parquet" in err and "Parquet" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("saved", [False, True], ids=["plain_directory", "no_datasets_package"])
def test_dataset_directory_that_cannot_be_read(tmp_path: Path, capsys, monkeypatch, saved: bool):
    folder = tmp_path / "saved"
    folder.mkdir()
    if saved:  # looks like Dataset.save_to_disk output, but `datasets` is not importable
        (folder / "state.json").write_text("{}")
        monkeypatch.setitem(sys.modules, "datasets", None)
    code, err = _train(tmp_path, capsys, "env.name=math", f"env.dataset={folder}")
    want = "needs the `datasets` package" if saved else "not one written by Dataset.save_to_disk"
    assert code == 2 and "saved" in err and want in err
    assert not (tmp_path / "runs").exists()


def test_prompts_longer_than_the_context(tmp_path: Path, capsys):
    path = tmp_path / "long.jsonl"
    path.write_text(
        "".join(
            json.dumps({"problem": "x" * 80 + str(i), "answer": str(i)}) + "\n" for i in range(40)
        )
    )
    code, err = _train(
        tmp_path,
        capsys,
        "env.name=math",
        f"env.dataset={path}",
        "env.eval_size=4",
        "run.total_steps=50",
    )
    assert code == 2 and "longer than the context" in err and "model.max_seq_len" in err
    # The run stopped on its input after making its directory: nothing of it is left.
    assert not (tmp_path / "runs").exists()


def test_failed_start_removes_only_its_own_run_directory(tmp_path: Path, capsys):
    runs = tmp_path / "runs"
    (runs / "other").mkdir(parents=True)
    (runs / "other" / "keep.txt").write_text("someone else's")
    code, err = _train(tmp_path, capsys, f"critic.init_from={tmp_path / 'missing.pt'}")
    assert code == 2 and "critic.init_from" in err
    assert sorted(p.name for p in runs.iterdir()) == ["other"]
    assert (runs / "other" / "keep.txt").read_text() == "someone else's"


# -- model directories -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    cfg = load_config(None, [*RUN])
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    path = tmp_path_factory.mktemp("model") / "good"
    save_pretrained(model, tok, path)
    model.save_pretrained(str(path.parent / "sharded"), max_shard_size="20KB")
    tok.save_pretrained(str(path.parent / "sharded"))
    return path


def _damage(kind: str, good: Path, dest: Path) -> Path:
    src = good.parent / "sharded" if kind == "missing_shard" else good
    shutil.copytree(src, dest)
    if kind == "truncated_weights":
        w = dest / "model.safetensors"
        w.write_bytes(w.read_bytes()[:1000])
    elif kind == "missing_weights":
        (dest / "model.safetensors").unlink()
    elif kind == "missing_shard":
        sorted(dest.glob("model-*.safetensors"))[1].unlink()
    elif kind == "bad_config_json":
        (dest / "config.json").write_text('{"model_type": "qwen3", ')
    elif kind == "missing_tokenizer":
        for f in dest.glob("tok*"):
            f.unlink()
    elif kind == "tokenizer_mismatch":  # the model's vocabulary is smaller than the tokenizer's
        conf = json.loads((dest / "config.json").read_text())
        conf["vocab_size"] = 50
        (dest / "config.json").write_text(json.dumps(conf))
        (dest / "model.safetensors").unlink()
    return dest


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated_weights", "could not load the weights"),
        ("missing_weights", "could not load the weights"),
        ("missing_shard", "could not load the weights"),
        ("bad_config_json", "config"),
        ("missing_tokenizer", "no usable tokenizer"),
        ("tokenizer_mismatch", "do not match"),
    ],
)
def test_bad_model_directory(tmp_path: Path, capsys, model_dir: Path, kind: str, message: str):
    path = _damage(kind, model_dir, tmp_path / kind)
    if kind == "tokenizer_mismatch":  # weights that fit the smaller vocabulary
        from transformers import AutoConfig, AutoModelForCausalLM

        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).save_pretrained(path)
    code, err = _train(tmp_path, capsys, f"model.name_or_path={path}")
    assert code == 2 and message in err and str(path) in err


# -- checkpoints -------------------------------------------------------------------------------
def _one_step_run(tmp_path: Path, capsys) -> Path:
    code, _ = _train(tmp_path, capsys, "run.name=r", "run.total_steps=2")
    assert code == 0
    return tmp_path / "runs" / "r"


def test_every_checkpoint_damaged(tmp_path: Path, capsys):
    run = _one_step_run(tmp_path, capsys)
    for p in list_checkpoints(run):
        p.write_bytes(p.read_bytes()[:100])
    code, err = _train(tmp_path, capsys, "--resume", str(run))
    assert code == 2 and "no loadable checkpoint" in err
    assert len(list((run / "checkpoints").glob("*.pt.damaged"))) == 3  # kept, not deleted
    assert len(list((run / "checkpoints").glob("*.sha256.damaged"))) == 3  # with their digests


def test_damaged_latest_checkpoint_resumes_from_previous(tmp_path: Path, capsys):
    run = _one_step_run(tmp_path, capsys)
    latest = list_checkpoints(run)[-1]
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])  # a torn write
    code, err = _train(tmp_path, capsys, "--resume", str(run), "run.total_steps=3")
    assert code == 0 and f"{latest.name}.damaged" in err
    assert (latest.parent / f"{latest.name}.damaged").exists()
    assert [p.name for p in list_checkpoints(run)][-1] == "step_00000003.pt"


def test_checkpoint_of_another_model_is_refused_and_kept(tmp_path: Path, capsys):
    run = _one_step_run(tmp_path, capsys)
    before = {p.name: p.read_bytes() for p in list_checkpoints(run)}
    code, err = _train(tmp_path, capsys, "--resume", str(run), "model.hidden_size=64")
    assert code == 2 and "does not fit" in err
    assert {p.name: p.read_bytes() for p in list_checkpoints(run)} == before


def test_not_a_checkpoint(tmp_path: Path, capsys):
    run = _one_step_run(tmp_path, capsys)
    for p in list_checkpoints(run):
        save_checkpoint(run, int(p.name[5:13]), {"weights": "elsewhere"}, keep=0)
    code, err = _train(tmp_path, capsys, "--resume", str(run))
    assert code == 2 and "not a saorl checkpoint" in err


def test_corrupt_metrics_file_on_resume(tmp_path: Path, capsys):
    run = _one_step_run(tmp_path, capsys)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "[" * 100_000, *lines[1:]]) + "\n")
    code, err = _train(tmp_path, capsys, "--resume", str(run), "run.total_steps=3")
    assert code == 2 and f"{metrics}:2" in err


# -- other commands on odd inputs --------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\n{}\n", "not UTF-8"),
        (b'{"step": 1}\n' + b"[" * 100_000 + b'\n{"step": 2}\n', "metrics.jsonl:2"),
    ],
    ids=["binary", "deeply_nested"],
)
def test_report_on_a_bad_metrics_file(tmp_path: Path, capsys, content: bytes, message: str):
    (tmp_path / "metrics.jsonl").write_bytes(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path) in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "RUN", "--out", "FILE"], "File exists"),
        (["compare", "--arms", "", "--out", "OUT"], "names no arm"),
        (["compare", "--arms", "sao", "--out", "FILE"], "is a file"),
        (["eval", "builtin:tiny", "--k", "0"], "--k must be >= 1"),
        (["eval", "builtin:tiny", "--limit", "-1"], "--limit must be"),
        (["value-pretrain", "--rollouts", "1", "--out", "OUT/c.pt"], "--rollouts must be >= 2"),
        (["value-pretrain", "--rollouts", "4", "--out", "RUN"], "is a directory"),
    ],
    ids=[
        "report_out_file",
        "compare_no_arms",
        "compare_out_file",
        "eval_k0",
        "eval_limit",
        "value_pretrain_rollouts",
        "value_pretrain_out_dir",
    ],
)
def test_odd_command_lines(tmp_path: Path, capsys, argv: list[str], message: str):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "rollout/reward_mean": 0.5}\n')
    (tmp_path / "file").write_text("x")
    paths = {"RUN": str(run), "FILE": str(tmp_path / "file"), "OUT": str(tmp_path / "out")}
    argv = [paths.get(a, a.replace("OUT", paths["OUT"])) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything was written

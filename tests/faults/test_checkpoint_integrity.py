"""A damaged checkpoint is caught, not trained on; the edges of a run say what happened.

- one byte flipped in the middle of a `.pt` (torch does not check the archive's CRCs), of a
  checkpoint's Hugging Face copy or of a shard file: the digest written at save differs, the
  checkpoint is set aside as `.damaged` and the resume names it and the one it resumed from;
- a full disk during a save: exit 2 saying so, naming the file, the previous checkpoint intact;
- the metrics rows are synced to disk before the checkpoint that follows them;
- `saorl eval` of a checkpoint deleted since, or with `--out` a directory: exit 2 before any
  evaluation runs.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from saorl.checkpoint.io import (
    DamagedCheckpointError,
    list_checkpoints,
    load_latest_checkpoint,
    load_state_file,
    save_checkpoint,
    sharded_checkpoint_path,
)
from saorl.cli.main import main
from tests.faults._common import TINY_SYNC, run_saorl

pytestmark = [
    pytest.mark.faults,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]

RUN = [*TINY_SYNC, "run.total_steps=2"]


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made")
    made = run_saorl("train", *RUN, f"run.output_dir={out}", "run.name=r")
    assert made.returncode == 0, made.stderr
    return out / "r"


@pytest.fixture
def run_dir(trained_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained_run, tmp_path / "r"))


def test_a_flipped_byte_in_a_pt_is_caught_and_skipped(run_dir: Path):
    newest = run_dir / "checkpoints" / "step_00000002.pt"
    assert (run_dir / "checkpoints" / "step_00000002.sha256").is_file()
    _flip(newest)
    with pytest.raises(DamagedCheckpointError, match="SHA-256"):
        load_state_file(newest)
    proc = run_saorl("train", "--resume", str(run_dir), "run.total_steps=3")
    assert proc.returncode == 0, proc.stderr
    assert "step_00000002.pt: damaged" in proc.stderr, proc.stderr
    assert "resuming from step_00000001.pt (step 1)" in proc.stderr
    assert (run_dir / "checkpoints" / "step_00000002.pt.damaged").is_file()
    assert (run_dir / "checkpoints" / "step_00000002.sha256.damaged").is_file()
    # steps 2 and 3 trained from step 1's state; the rebuilt step 2 reads back
    assert load_latest_checkpoint(run_dir)[1]["step"] == 3
    assert load_state_file(run_dir / "checkpoints" / "step_00000002.pt")["step"] == 2


def test_a_flipped_byte_in_a_hugging_face_copy_is_refused_by_eval(run_dir: Path, tmp_path):
    hf = run_dir / "checkpoints" / "step_00000002.hf"
    _flip(hf / "model.safetensors")
    out = tmp_path / "e.jsonl"
    code = main(["eval", str(hf), "--limit", "2", "--out", str(out)])
    assert code == 2 and not out.exists()


def test_a_flipped_byte_in_a_shard_falls_back(tmp_path: Path, capsys):
    for step in (1, 2):
        folder = sharded_checkpoint_path(tmp_path, step)
        dcp.save({"policy": {"w": torch.arange(4096.0) * step}}, checkpoint_id=str(folder))
        save_checkpoint(tmp_path, step, {"step": step, "sharded": folder.name}, keep=0)
    shard = next(sharded_checkpoint_path(tmp_path, 2).glob("*.distcp"))
    _flip(shard)
    path, state = load_latest_checkpoint(tmp_path, quarantine=True)
    assert state["step"] == 1 and path.name == "step_00000001.pt"
    err = capsys.readouterr().err
    assert shard.name in err and "damaged" in err and "resuming from step_00000001.pt" in err


def test_a_full_disk_during_a_save_exits_2_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch, capsys
):
    real_save = torch.save

    def fill_the_disk(obj, f, *args, **kwargs):
        if ".step_00000002.pt.tmp" not in str(getattr(f, "name", "")):
            return real_save(obj, f, *args, **kwargs)
        f.write(b"\0" * 64)  # what torch's writer does: the OSError inside its own error
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from e

    monkeypatch.setattr(torch, "save", fill_the_disk)
    code = main(["train", *RUN, "run.total_steps=3", f"run.output_dir={tmp_path}", "run.name=f"])
    err = capsys.readouterr().err
    run_dir = tmp_path / "f"
    assert code == 2 and "the disk is full" in err and "step_00000002.pt" in err, err
    assert (
        f"the previous checkpoint {run_dir / 'checkpoints' / 'step_00000001.pt'} is intact" in err
    )
    assert "Traceback" not in err and f"--resume {run_dir}" in err
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_00000000.pt", "step_00000001.pt"]
    assert load_latest_checkpoint(run_dir)[1]["step"] == 1  # and the run folder is kept
    assert not list((run_dir / "checkpoints").glob(".step_*.tmp.*"))


def test_metrics_rows_are_synced_before_each_checkpoint(tmp_path: Path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = main(["train", *RUN, f"run.output_dir={tmp_path}", "run.name=m", "run.save_hf=false"])
    assert code == 0
    ckpts = [i for i, name in enumerate(synced) if name.startswith(".step_") and ".pt.tmp" in name]
    assert len(ckpts) == 3  # steps 0, 1, 2
    for prev, i in zip([-1, *ckpts], ckpts, strict=False):
        assert "metrics.jsonl" in synced[prev + 1 : i], synced


def test_eval_of_a_checkpoint_deleted_since(run_dir: Path, capsys):
    gone = run_dir / "checkpoints" / "step_00000000.pt"
    gone.unlink()
    assert main(["eval", str(gone), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{gone} no longer exists" in err and "step_00000002.pt" in err


def test_eval_with_out_a_directory_stops_before_evaluating(run_dir: Path, tmp_path, capsys):
    ckpt = run_dir / "checkpoints" / "step_00000002.pt"
    assert main(["eval", str(ckpt), "--limit", "2", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a directory" in capsys.readouterr().err

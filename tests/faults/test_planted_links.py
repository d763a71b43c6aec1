"""Files saorl writes never follow a symbolic link (`saorl.security.safe_io`).

A run folder received from someone else (or shared) can hold `metrics.jsonl -> ~/.bashrc`.
Each test plants a link where a run, `saorl report` or `saorl eval` writes, runs the real
command, and checks that it stops with a clear error naming the link and that the link's
target is untouched.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.security.safe_io import UnsafePathError, open_write, write_atomic
from tests.faults._common import TINY_SYNC

pytestmark = pytest.mark.faults

RUN = [*TINY_SYNC, "run.total_steps=2", "run.log_samples_every=1"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base")
    assert main(["train", *RUN, f"run.output_dir={out}", "run.name=r"]) == 0
    return out / "r"


def _copy(base: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base, run, symlinks=True)
    return run


def _plant(link: Path, tmp_path: Path) -> tuple[Path, object]:
    """Replace `link` by a symbolic link to a victim (a file with the same content, or a
    folder with one file); return the victim and what it holds now."""
    victim = tmp_path / "victim"
    if link.is_dir() and not link.is_symlink():
        shutil.copytree(link, victim)
        shutil.rmtree(link)
    elif link.exists():
        shutil.copyfile(link, victim)
        link.unlink()
    else:
        victim.write_text("precious\n")
    link.symlink_to(victim)
    return victim, _snapshot(victim)


def _snapshot(path: Path) -> object:
    if path.is_dir():
        return sorted((str(p), p.is_file() and p.read_bytes()) for p in path.rglob("*"))
    return path.read_bytes()


# Every file and folder a resumed run writes in its run folder.
PLANTED = [
    ".saorl.lock",
    "metrics.jsonl",
    "samples.jsonl",
    "summary.json",
    "config.toml",
    "trackers.json",
    "tensorboard",
    "final",
    "checkpoints",
    "checkpoints/step_00000003.pt",
]
# A digest file or Hugging Face copy without its checkpoint is a leftover of a killed write,
# removed at the resume; final/ is replaced whole by a fresh folder: the link itself goes,
# never followed, and the run writes its own file there.
REMOVED = [
    "checkpoints/step_00000003.sha256",
    "checkpoints/step_00000003.hf",
    "final/config.json",
]


@pytest.mark.parametrize("name", PLANTED + REMOVED)
def test_a_resumed_run_never_writes_through_a_planted_link(
    base_run: Path, tmp_path: Path, capsys, name: str
):
    run = _copy(base_run, tmp_path)
    victim, before = _plant(run / name, tmp_path)
    code = main(["train", "--resume", str(run), "run.total_steps=3"])
    err = capsys.readouterr().err
    if name in REMOVED:
        assert code == 0 and not (run / name).is_symlink(), err
    else:
        assert code == 2, err
        assert "symbolic link" in err and str(run / name) in err and "Traceback" not in err, err
    assert _snapshot(victim) == before


def test_a_run_folder_that_is_a_link_is_refused(base_run: Path, tmp_path: Path, capsys):
    real = _copy(base_run, tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    before = _snapshot(real / "metrics.jsonl")
    assert main(["train", "--resume", str(link), "run.total_steps=3"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert _snapshot(real / "metrics.jsonl") == before


def test_report_and_eval_never_write_through_a_link(base_run: Path, tmp_path: Path, capsys):
    run = _copy(base_run, tmp_path)
    victim, before = _plant(run / "report.png", tmp_path)
    assert main(["report", str(run)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert _snapshot(victim) == before
    out = tmp_path / "evals" / "e.jsonl"
    out.parent.mkdir()
    out.symlink_to(victim)
    code = main(["eval", str(run), "--limit", "1", "--out", str(out)])
    assert code == 2 and "symbolic link" in capsys.readouterr().err
    assert _snapshot(victim) == before


def test_the_helpers_refuse_links_fifos_and_other_users_files(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(victim)
    for mode in ("w", "a", "wb", "ab"):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            open_write(link, mode)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_atomic(link, "x")
    dangling = tmp_path / "dangling"  # a link to a file that does not exist yet: not created
    dangling.symlink_to(tmp_path / "chosen")
    for mode in ("a", "w"):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            open_write(dangling, mode)
    assert not (tmp_path / "chosen").exists()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_write(tmp_path / "fifo", "a")  # O_NONBLOCK: refused, not hung
    assert victim.read_text() == "precious"
    new = tmp_path / "new.txt"
    with open_write(new) as f:
        f.write("mine")
    assert new.read_text() == "mine" and (new.stat().st_mode & 0o777) == 0o600
    write_atomic(new, "again")
    assert new.read_text() == "again"
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []

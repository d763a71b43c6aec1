"""A checkpoint is data, never code: a `.pt` whose pickle calls a function (here `os.system`
touching a marker file) is refused with exit code 2 naming the file, by `saorl train --resume`,
`saorl eval RUN/checkpoints/step_X.pt` and `critic.init_from`; nothing from it runs and no file
of the run is changed. A malicious file is never mistaken for a torn one and skipped."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import queue
import random
import shutil
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, load_state_file, save_checkpoint
from saorl.cli.main import main
from saorl.envs.data.datasets import load_problems
from saorl.envs.factory import DatasetTask
from saorl.rollout.resume import restore_rollouts, snapshot_rollouts
from saorl.types import Trajectory
from tests.faults._common import TINY_SYNC, run_saorl

pytestmark = pytest.mark.faults

RUN = [*TINY_SYNC, "run.total_steps=2"]


class _RunsCommand:
    """Unpickling it runs `touch MARKER` (what an attacker's checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write_malicious(path: Path, marker: Path, how: str) -> None:
    """A file that looks like a saorl checkpoint and runs a command when fully unpickled."""
    state = {"step": 99, "policy": {}, "critic": _RunsCommand(marker)}
    if how == "torch.save":  # the zip format saorl writes (pickle protocol 2, GLOBAL)
        buf = io.BytesIO()
        torch.save(state, buf)
        path.write_bytes(buf.getvalue())
    else:  # a bare pickle of protocol 5 (STACK_GLOBAL), which torch also accepts as a .pt
        path.write_bytes(pickle.dumps(state, protocol=5))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("made")
    made = run_saorl("train", *RUN, f"run.output_dir={out}", "run.name=r")
    assert made.returncode == 0, made.stderr
    assert [p.name for p in list_checkpoints(out / "r")][-1] == "step_00000002.pt"
    return out / "r"


@pytest.fixture
def run_dir(trained_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained_run, tmp_path / "r"))


def _refused(proc, name: str, marker: Path) -> None:
    assert not marker.exists(), "the checkpoint's code ran"
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert name in proc.stderr and "must not have" in proc.stderr, proc.stderr


@pytest.mark.parametrize("how", ["torch.save", "pickle5"])
def test_resume_refuses_a_malicious_newest_checkpoint(run_dir: Path, tmp_path: Path, how: str):
    marker = tmp_path / "MARKER"
    evil = run_dir / "checkpoints" / "step_00000003.pt"
    _write_malicious(evil, marker, how)
    # a torn temporary file too: a refused resume must not clean it up either
    (run_dir / "checkpoints" / ".step_00000004.pt.tmp.123").write_bytes(b"torn")
    before = _snapshot(run_dir)
    proc = run_saorl("train", "--resume", str(run_dir), "run.total_steps=4")
    _refused(proc, str(evil), marker)
    assert _snapshot(run_dir) == before  # nothing renamed .damaged, deleted or rewritten


def test_malicious_checkpoint_behind_a_torn_one_is_not_skipped(run_dir: Path, tmp_path: Path):
    marker = tmp_path / "MARKER"
    evil = run_dir / "checkpoints" / "step_00000003.pt"
    _write_malicious(evil, marker, "torch.save")
    torn = run_dir / "checkpoints" / "step_00000004.pt"
    torn.write_bytes(evil.read_bytes()[:200])
    before = _snapshot(run_dir)
    proc = run_saorl("train", "--resume", str(run_dir), "run.total_steps=5")
    _refused(proc, str(evil), marker)
    assert _snapshot(run_dir) == before


def test_eval_refuses_a_malicious_checkpoint(run_dir: Path, tmp_path: Path):
    marker = tmp_path / "MARKER"
    evil = run_dir / "checkpoints" / "step_00000003.pt"
    _write_malicious(evil, marker, "torch.save")
    before = _snapshot(run_dir)
    out = tmp_path / "evals" / "e.jsonl"
    proc = run_saorl("eval", str(evil), "--limit", "2", "--out", str(out))
    _refused(proc, str(evil), marker)
    assert _snapshot(run_dir) == before and not out.exists()


def test_critic_init_from_refuses_a_malicious_file(tmp_path: Path):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "critic.pt"
    _write_malicious(evil, marker, "torch.save")
    out = tmp_path / "runs"
    proc = run_saorl("train", *RUN, f"run.output_dir={out}", f"critic.init_from={evil}")
    _refused(proc, str(evil), marker)
    assert not out.exists() or not list(out.iterdir())  # no half-made run left behind


def test_eval_checkpoint_without_a_policy(run_dir: Path, tmp_path: Path, capsys):
    ckpt = save_checkpoint(run_dir, 3, {"step": 3})
    code = main(["eval", str(ckpt), "--limit", "2", "--out", str(tmp_path / "e.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and str(ckpt) in err and "no policy" in err and "Traceback" not in err


def test_resume_still_works_from_a_safe_checkpoint(run_dir: Path):
    proc = run_saorl("train", "--resume", str(run_dir), "run.total_steps=3")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in list_checkpoints(run_dir)][-1] == "step_00000003.pt"


def test_resume_folder_without_checkpoint_is_left_untouched(tmp_path: Path, capsys):
    folder = tmp_path / "not_a_run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "config.toml").write_text('[run]\nname = "x"\n')
    (folder / "checkpoints" / ".step_00000001.pt.tmp.123").write_bytes(b"half a file")
    (folder / ".step_00000002.pt.tmp.456").write_bytes(b"another")
    before = _snapshot(folder)
    listing = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    code = main(["train", "--resume", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and "no checkpoint" in err and str(folder) in err
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == listing
    assert _snapshot(folder) == before


# -- what saorl itself writes loads back under the allow-list -----------------------------------
def _feed(task, group_size: int = 2):
    from saorl.rollout.worker import PromptFeed

    return PromptFeed(task, random.Random(0), batch_size=4, max_staleness=2, group_size=group_size)


def _trajectory(key: str, group: int) -> Trajectory:
    return Trajectory(
        [1, 2],
        [3, 4],
        [1, 1],
        [-0.5, -0.25],
        [0, 0],
        reward=1.0,
        prompt_key=key,
        group_id=group,
        info={"turns": 1, "tool_calls": 0},
    )


def test_pending_rollouts_of_a_dataset_round_trip_as_plain_data(tmp_path: Path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i}+{i}", "answer": str(2 * i)}) + "\n" for i in range(8))
    )
    task = DatasetTask(load_problems(data), [])
    feed = _feed(task)
    first, group = feed.next()  # one member of a group of two handed out, one still owed
    out: queue.Queue[Trajectory] = queue.Queue()
    out.put(_trajectory(first.key, group))
    snap = snapshot_rollouts([], feed, out, {})
    save_checkpoint(tmp_path / "run", 1, {"step": 1, **snap})
    state = load_state_file(tmp_path / "run" / "checkpoints" / "step_00000001.pt")
    assert state["feed_group"][1] == {"saorl_train_task": task.train.index(first), "key": first.key}

    resumed, out2 = _feed(task), queue.Queue()
    assert restore_rollouts(state, [], resumed, out2) == 1
    assert out2.get_nowait() == _trajectory(first.key, group)
    owed, owed_group = resumed.next()
    assert owed is first and owed_group == group  # the same training problem, same group


def test_pending_rollouts_of_an_openenv_run_are_kept(tmp_path: Path, capsys):
    # OpenEnv episodes are seeds drawn at random, with no training list to point into.
    from saorl.envs.openenv import SeedTask, SeedTasks

    feed = _feed(SeedTasks(first=0, n_held_out=4))
    task, group = feed.next()
    out: queue.Queue[Trajectory] = queue.Queue()
    out.put(_trajectory(task.key, group))
    snap = snapshot_rollouts([], feed, out, {})
    assert "checkpoint without" not in capsys.readouterr().err
    save_checkpoint(tmp_path, 1, {"step": 1, **snap})
    state = load_state_file(tmp_path / "checkpoints" / "step_00000001.pt")
    resumed, out2 = _feed(SeedTasks(first=0, n_held_out=4)), queue.Queue()
    assert restore_rollouts(state, [], resumed, out2) == 1
    owed, owed_group = resumed.next()
    assert owed == SeedTask(task.seed) and owed_group == group


@dataclasses.dataclass
class OddTask:  # pickles, but is neither allow-listed nor drawn from a `train` list
    key: str


def test_tasks_a_checkpoint_may_not_hold_are_left_out(tmp_path: Path, capsys):
    class Source:
        def sample(self, rng):
            return OddTask("odd")

    feed = _feed(Source())
    feed.next()
    out: queue.Queue[Trajectory] = queue.Queue()
    out.put(_trajectory("odd", 0))
    snap = snapshot_rollouts([], feed, out, {})
    err = capsys.readouterr().err
    assert "checkpoint without the 1 untrained" in err and "OddTask" in err
    assert not {"finished_untrained", "in_flight", "feed_group"} & snap.keys()
    save_checkpoint(tmp_path, 1, {"step": 1, **snap})
    assert load_state_file(tmp_path / "checkpoints" / "step_00000001.pt")["step"] == 1


def test_saving_a_state_that_could_not_be_loaded_back_fails(tmp_path: Path):
    with pytest.raises(TypeError, match="pathlib"):
        save_checkpoint(tmp_path, 1, {"step": 1, "where": Path("/")})
    assert list_checkpoints(tmp_path) == []
    assert not list((tmp_path / "checkpoints").iterdir())  # no temporary file left either

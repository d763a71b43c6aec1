"""Generated tasks: each validates when graded independently, and a seed fixes the tasks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from saorl.envs.swe.gen.generator import generate_pool
from saorl.envs.swe.grading import grade

pytestmark = pytest.mark.slow


def _fingerprint(task):
    return (
        task.key,
        task.prompt,
        task.fail_to_pass,
        task.pass_to_pass,
        task.snapshot.name,
        task.answer,
        task.edit,
    )


def test_generated_tasks_validate_and_are_deterministic(tmp_path: Path):
    t0 = time.monotonic()
    held, train = generate_pool(11, 2, 3, tmp_path / "a")  # validates, caches the records
    print(f"generated 5 tasks in {time.monotonic() - t0:.1f} s")
    assert len(held) == 2 and len(train) == 3
    assert not {t.snapshot.name for t in held} & {t.snapshot.name for t in train}
    for task in held + train:
        files = sorted(
            p.relative_to(task.base_dir()).as_posix()
            for p in task.base_dir().rglob("*")
            if p.is_file()
        )
        assert "README.md" in files and any(f.startswith("tests/test_") for f in files)
        assert task.fail_to_pass and task.prompt.count("Failing:") == 1
        assert task.answer.startswith("diff --git a/") and task.edit is not None
        # Graded afresh (not the generator's own runs): the bug fails, the gold fix passes.
        before = grade(task, {}, test_timeout_s=5.0, parent=tmp_path / "g")
        assert not before.resolved
        assert all(s != "passed" for s in before.fail_to_pass.values())
        assert all(s == "passed" for s in before.pass_to_pass.values())
        after = grade(task, task.gold, test_timeout_s=5.0, parent=tmp_path / "g")
        assert after.resolved, after.info()
    # The same seed gives the same tasks: validated again from scratch, and from the cache.
    again_held, again_train = generate_pool(11, 2, 1, tmp_path / "b", use_cache=False)
    assert [_fingerprint(t) for t in again_held + again_train] == [
        _fingerprint(t) for t in held + train[:1]
    ]
    cached = generate_pool(11, 2, 3, tmp_path / "a")  # read back from the records
    assert [_fingerprint(t) for t in cached[0] + cached[1]] == [
        _fingerprint(t) for t in held + train
    ]
    other, _ = generate_pool(12, 2, 0, tmp_path / "a")
    assert [_fingerprint(t) for t in other] != [_fingerprint(t) for t in held]

"""A coding task: a repository snapshot, an issue text, and the tests that decide it.

Both task sources produce `SweTask`s: the generator (`generator.py`, a small Python repository
with an injected bug) and the SWE-bench loader (`swebench.py`, a local checkout at a base
commit). The environment and the grader only see this class. A SWE-bench task also names where
its environment comes from (`EnvSource`) and, once `venv.py` has built it, carries it
(`TaskEnv`): the interpreter its tools and its grading run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saorl.envs.swe.workspace import Changes, materialize


@dataclass(frozen=True)
class EnvSource:
    """What a task's environment is built from: a repository checkout at a commit."""

    repo: str  # the task's `repo` ("owner/name" or "name")
    checkout: str  # the local git checkout
    commit: str  # SWE-bench's `environment_setup_commit` (else the base commit)


@dataclass(frozen=True)
class TaskEnv:
    """A built per-task virtual environment (see venv.py). Paths are absolute and resolved:
    the venv is bound read-only at the same path inside the sandbox."""

    venv: str
    roots: tuple[str, ...]  # import roots relative to the repository root ("src", ".")
    plugins: tuple[str, ...]  # pytest11 entry-point names grading loads
    key: str  # the cache key (its directory's name)

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    def sandbox_env(self, root: str = "/sandbox") -> dict[str, str]:
        """Variables of a tool call in the repository at `root`: the venv's `python` and
        `pytest` first on PATH, the repository's import roots on PYTHONPATH (an editable
        install's effect, without the install pointing at a host path)."""
        paths = [root if r == "." else f"{root}/{r}" for r in self.roots]
        return {
            "PATH": f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "VIRTUAL_ENV": self.venv,
            "PYTHONPATH": ":".join(paths),
        }


@dataclass(eq=False)
class SweTask:
    """One task. `key`, `prompt` and `answer` are what the loop and `saorl eval` read."""

    key: str  # instance id
    prompt: str  # the issue text (problem statement)
    fail_to_pass: tuple[str, ...]  # pytest node ids that the fix must make pass
    pass_to_pass: tuple[str, ...]  # pytest node ids that must keep passing
    snapshot: Path  # where the base repository is (or will be) materialized
    # writes the base repository into a dir; picklable (a partial), as checkpoints hold tasks
    fill: Callable[[Path], None] = field(repr=False)
    answer: str = ""  # the gold patch as a unified diff ('' when unknown); shown as reference
    test_patch: str = ""  # applied at grading (SWE-bench: the tests that check the fix)
    protected: tuple[str, ...] = ()  # paths (dirs end in '/') restored to the snapshot at grading
    plugin_autoload: bool = False  # let pytest load the venv's plugins while grading
    gold: Changes | None = field(default=None, repr=False)  # the fix as changes, when known
    # the fix as one str_replace (path, old, new), for demonstrations; generated tasks only
    edit: tuple[str, str, str] | None = field(default=None, repr=False)
    source: EnvSource | None = None  # where a per-task environment is built from (SWE-bench)
    env: TaskEnv | None = None  # the built environment; None: saorl's own interpreter
    # test id -> the xfail/xpass/skip its gold run showed (validation): only that one counts
    gold_outcomes: dict[str, str] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, str]:
        """What an agent program gets (`saorl.envs.agent`): SWE-bench's names for the issue,
        never the gold patch or the tests."""
        repo = self.source.repo if self.source else ""
        return {"instance_id": self.key, "problem_statement": self.prompt, "repo": repo}

    def base_dir(self) -> Path:
        """The snapshot directory, materialized on first use (read it, never write it)."""
        return materialize(self.snapshot, self.fill)


class TaskPool:
    """Training tasks sampled uniformly, and a disjoint held-out list."""

    def __init__(self, train: list[SweTask], held_out: list[SweTask]) -> None:
        self.train = train
        self.held_out = held_out

    def sample(self, rng: random.Random) -> SweTask:
        if not self.train:
            raise ValueError(
                "env 'swe': no training tasks left after the held-out split; lower "
                "env.eval_size or give more tasks"
            )
        return rng.choice(self.train)

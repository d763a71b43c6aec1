"""SWE-bench-format task files against local repository checkouts.

    tasks = load_swebench("swe_verified.jsonl", repos_root="/data/repos", cache_dir=...)

One JSON object per line with `instance_id`, `repo` ("owner/name"), `base_commit`,
`problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS` (lists of pytest node ids, or those lists
JSON-encoded as strings, as the Hugging Face dataset stores them), `test_patch` and optionally
`patch` (the gold fix). Nothing is downloaded: each `repo` must already be a git checkout under
`repos_root`, as `owner__name` (SWE-bench's naming), `owner/name` or `name`, holding
`base_commit`. The repository at `base_commit` is extracted once (`git archive`) into the cache
and each episode works on a copy of it; the agent does not see `test_patch`, which grading
applies (after restoring every file it touches, and every file a test id names).

Each task names its environment's source (`EnvSource`: the checkout at
`environment_setup_commit`, else `base_commit`); `venv.py` builds it and `validate.py` checks the
task before use (both applied by `spec.py`). Only pytest-style ids
(`path/test_x.py::test_name[param]`) can be graded; repositories graded with their own runner
(django's `runtests.py`, sympy's `bin/test`) are out of scope, and so is building compiled
extensions. Grading loads the environment's pytest plugins (`plugin_autoload`), each by its
entry point name, and reads the repository's own pytest config file as `base_commit` and
`test_patch` leave it; a submission can change neither (see grading.py).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from saorl.config import ConfigError
from saorl.envs.swe.git import git, git_popen
from saorl.envs.swe.task import EnvSource, SweTask

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "test_patch",
)


REPO_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?")
COMMIT_ID = re.compile(r"[0-9a-fA-F]{7,64}")


def repo_candidates(root: Path, repo: str) -> list[Path]:
    owner, _, name = repo.partition("/")
    paths = [root / f"{owner}__{name}", root / owner / name, root / name] if name else []
    return paths or [root / repo]


def check_repo_name(repo: str, where: str) -> None:
    """A row's `repo` names a checkout *under* the repos root: `name` or `owner/name`, never
    `..`, an absolute path or an empty part (`x//abs/path`); else a ConfigError naming the row."""
    if not REPO_NAME.fullmatch(repo) or ".." in repo.split("/") or "/." in f"/{repo}":
        raise ConfigError(
            f"{where}: repo {repo!r} is not a repository name ('name' or 'owner/name' of "
            "letters, digits, '_', '-', '.'); it must name a checkout under env.swe.repos_root"
        )


def find_repo(root: Path, repo: str, where: str) -> Path:
    """The checkout of `repo` under `root`, or a ConfigError naming every path tried."""
    check_repo_name(repo, where)
    tried = repo_candidates(root, repo)
    for path in tried:
        if (path / ".git").exists():
            return path
    owner, _, name = repo.partition("/")
    raise ConfigError(
        f"{where}: repository {repo!r} is not present under env.swe.repos_root={str(root)!r} "
        f"(looked for a git checkout at {', '.join(map(str, tried))}); clone it there, e.g. "
        f"`git clone <url of {repo}> {root / f'{owner}__{name}'}`"
    )


def _git(repo: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess:
    return git(repo, *args, **kw)  # hardened: the repository's own config runs nothing


def _ids(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{where}: {key} must be a list of test ids or its JSON") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of test id strings")
    return tuple(value)


def patch_paths(patch: str) -> list[str]:
    """Files a unified diff touches (both sides of renames)."""
    paths: list[str] = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        paths += [p for p in m.groups() if p not in paths]
    return paths


def _archive(repo: Path, commit: str, dest: Path) -> None:
    proc = git_popen(
        repo, "archive", "--format=tar", commit, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(dest, filter="tar")
    finally:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise RuntimeError(f"git archive {commit} in {repo} failed: {err.strip()}")


def load_swebench(path: str | Path, repos_root: str | Path, cache_dir: Path) -> list[SweTask]:
    """Every task of a SWE-bench JSONL file; raises ConfigError naming the line and the fix."""
    path, root = Path(path), Path(repos_root)
    if not path.is_file():
        raise ConfigError(f"env.swe.tasks: {str(path)!r} is not a file (a SWE-bench .jsonl)")
    if not str(repos_root) or not root.is_dir():
        raise ConfigError(
            f"env.swe.repos_root: {str(repos_root)!r} is not a directory; set it to the "
            "directory that holds the repository checkouts"
        )
    tasks = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"env.swe.tasks: {path} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg})") from None
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
        repo = find_repo(root, str(row["repo"]), where)
        tasks.append(task_from_row(row, repo, cache_dir, where))
    if not tasks:
        raise ConfigError(f"env.swe.tasks: {path} holds no tasks")
    return tasks


def task_from_row(row: dict[str, Any], repo: Path, cache_dir: Path, where: str) -> SweTask:
    """The task of one SWE-bench row whose repository is the checkout `repo`."""
    commit = resolve_commit(repo, "base_commit", str(row["base_commit"]), where)
    env_raw = str(row.get("environment_setup_commit") or commit)
    env_commit = resolve_commit(repo, "environment_setup_commit", env_raw, where)
    f2p = _ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _ids(row["PASS_TO_PASS"], "PASS_TO_PASS", where)
    test_patch = str(row["test_patch"])
    named = sorted({t.split("::")[0] for t in f2p + p2p})
    protected = tuple(dict.fromkeys([*patch_paths(test_patch), *named]))
    instance = str(row["instance_id"])
    # the snapshot's key names the repository and the full commit id (never a moving name)
    safe = "-".join(re.sub(r"[^A-Za-z0-9_.-]", "_", x)[:80] for x in (instance, str(row["repo"])))
    return SweTask(
        key=instance,
        prompt=str(row["problem_statement"]),
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        snapshot=cache_dir / "swebench" / f"{safe}-{commit}",
        fill=functools.partial(_archive, repo, commit),  # picklable: checkpoints
        answer=str(row.get("patch") or ""),
        test_patch=test_patch,
        protected=protected,
        plugin_autoload=True,
        source=EnvSource(str(row["repo"]), str(repo.resolve()), env_commit),
    )


def resolve_commit(repo: Path, key: str, value: str, where: str) -> str:
    """The full id of the commit `value` (a hex id, full or abbreviated) names in `repo`; a
    branch, tag or `HEAD` is refused: the task would change with the checkout."""
    if not COMMIT_ID.fullmatch(value):
        raise ConfigError(
            f"{where}: {key} {value!r} is not a commit id (hex); a moving name "
            "such as HEAD or a branch is not accepted"
        )
    proc = _git(repo, "rev-parse", "--verify", "--quiet", f"{value}^{{commit}}", text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ConfigError(
            f"{where}: {key} {value} is not in {repo}; fetch it (git -C {repo} "
            "fetch --all) or use a full clone"
        )
    return proc.stdout.strip()


def changes_from_patch(task: SweTask, patch: str) -> dict[str, bytes | None]:
    """The `Changes` a unified diff makes to the task's snapshot (e.g. its gold `patch`)."""
    from saorl.envs.swe.grading import apply_patch
    from saorl.envs.swe.workspace import collect_changes, copy_tree, remove_tree

    work = copy_tree(task.base_dir(), prefix="saorl-swe-patch-")
    try:
        error = apply_patch(work, patch)
        if error:
            raise ValueError(f"{task.key}: the patch does not apply: {error}")
        return collect_changes(task.base_dir(), work)
    finally:
        remove_tree(work)

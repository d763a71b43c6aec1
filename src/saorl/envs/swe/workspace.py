"""Repository directories of the coding environment: snapshots, per-episode copies, diffs.

A task's repository at its base commit is a read-only *snapshot* directory, materialized once
under the cache dir (atomically: filled in a temporary directory, then renamed). Each episode
works in its own copy of it (`copy_tree`: `cp -a --reflink=auto`, so a copy-on-write filesystem
shares the blocks), bound read-write into the sandbox. The agent's result is the set of
`Changes` between the snapshot and its copy: path -> new bytes, or None for a deleted file.

Decisions:
- Caches and bytecode (`__pycache__`, `.pytest_cache`, `*.pyc`, ...) are never changes, and
  neither are symlinks the agent made: a fix never needs one, and a symlink carried into the
  grading copy could point a later host-side write (a restored test file) outside it.
- A file whose size and mtime equal the snapshot's is unchanged (copies keep mtimes); only the
  others are read. The total of changed bytes is capped (`ChangesTooLarge`).
- Files are read with O_NOFOLLOW and written only below directories that are not symlinks.
- The agent's copy is hostile input (nests past PATH_MAX, symlink loops, fifos, names that are
  not UTF-8): it is walked and deleted by `saorl.sandbox.tree`, iteratively and without
  following links. A file whose path is longer than `MAX_PATH_BYTES` is never a change (no fix
  needs one, and it could not be re-created in a grading copy). Other names are kept as `str`
  (surrogate-escaped bytes, re-created as the same bytes); `display_path` is their text form.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

from saorl.sandbox.tree import FILE_FLAGS, Entry, read_at, remove_tree, walk

Changes = dict[str, bytes | None]  # relative posix path -> new content (None: deleted)

SKIP_DIRS = frozenset(
    {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".tox"}
)
SKIP_SUFFIXES = (".pyc", ".pyo")
RESULTS_PREFIX = ".saorl-"  # grading's own files in a work copy; never part of a diff
MAX_CHANGED_BYTES = 8 << 20
MAX_CHANGED_FILES = 2000
MAX_PATH_BYTES = 1024  # longest path of a change
ENTRY_BYTES = 4096  # least disk charge per entry: a million empty files exhaust inodes, not bytes


class ChangesTooLarge(ValueError):
    """The agent's changes exceed the cap; they are not graded."""


class UnsafeCacheDir(ValueError):
    """The cache directory could be written by someone else; nothing in it is used."""


def default_cache_dir() -> Path:
    """The per-user cache: `$XDG_CACHE_HOME/saorl/swe`, else `~/.cache/saorl/swe` (never a
    predictable folder of the shared temp directory, which another user could create first)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "saorl" / "swe"


def secure_cache_dir(path: Path) -> Path:
    """`path`, created (mode 0700) if missing, and checked: it must be ours and writable by
    nobody else, and each directory above it ours or root's and not writable by others unless
    sticky (/tmp); else `UnsafeCacheDir` (records planted in a cache would choose what saorl
    writes and runs, and a folder another user controls can be swapped under us)."""
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        for d in reversed([path, *path.parents]):
            if not os.path.lexists(d):
                with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                    os.mkdir(d, 0o700)
    me = os.getuid()
    for d in [path, *path.parents]:
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode) and st.st_uid in (me, 0):
            st = os.stat(d)  # a link of the user's (or the system's) to a folder elsewhere
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeCacheDir(f"cache directory {d} is not a directory")
        if st.st_uid not in (me, 0) or (d == path and st.st_uid != me):
            raise UnsafeCacheDir(
                f"cache directory {d} is owned by uid {st.st_uid}, not by this "
                f"user ({me}); use a directory of your own"
            )
        shared = st.st_mode & 0o022 and (d == path or not st.st_mode & stat.S_ISVTX)
        if shared:
            raise UnsafeCacheDir(
                f"cache directory {d} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):o}); chmod 700 it"
            )
    return path


def swe_cache_dir(configured: str) -> Path:
    """`env.swe.cache_dir` (default: `default_cache_dir()`), created and checked."""
    return secure_cache_dir(Path(configured).expanduser() if configured else default_cache_dir())


_snapshot_lock = threading.Lock()


def materialize(path: Path, fill: Callable[[Path], None]) -> Path:
    """`path`, created by `fill(tmp_dir)` and an atomic rename if it does not exist yet."""
    if path.is_dir():
        return path
    with _snapshot_lock:
        if path.is_dir():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
        try:
            fill(tmp)
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():  # another process may have won the rename: then use its copy
                raise
        finally:
            if tmp.exists():
                remove_tree(tmp)
    return path


def write_files(root: Path, files: dict[str, bytes]) -> None:
    """Write `files` (relative path -> bytes) below `root`; a path that is absolute, has `..`
    or is not already normal (a cached record someone forged) is a ValueError."""
    for rel, data in files.items():
        if safe_relpath(rel) != rel:
            raise ValueError(f"refusing to write {rel!r}: not a plain relative path")
        if not parents_are_dirs(root, rel):
            raise ValueError(f"refusing to write {rel!r}: a parent is a symlink")
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def copy_tree(src: Path, parent: Path | None = None, prefix: str = "saorl-swe-ws-") -> Path:
    """A fresh copy of `src` in a new temporary directory (under `parent`); returns its path."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        subprocess.run(
            ["cp", "-a", "--reflink=auto", f"{src}/.", str(dest)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError):
        remove_tree(dest)
        dest.mkdir()
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    return dest


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return (
        any(p in SKIP_DIRS for p in parts[:-1])
        or rel.endswith(SKIP_SUFFIXES)
        or parts[-1].startswith(RESULTS_PREFIX)
    )


def _entries(root: Path) -> Iterator[Entry]:
    """Every entry below `root` that could be a change: not a directory, not skipped, its path
    at most `MAX_PATH_BYTES` long."""
    with closing(walk(root, SKIP_DIRS, MAX_PATH_BYTES)) as tree:
        for entry in tree:
            rel = entry.rel
            if rel is not None and not stat.S_ISDIR(entry.st.st_mode) and not _skipped(rel):
                yield entry


def display_path(rel: str) -> str:
    """`rel` as valid text: bytes that are not UTF-8 shown as `\\xNN`."""
    return os.fsencode(rel).decode("utf-8", errors="backslashreplace")


def read_file(path: Path, limit: int = MAX_CHANGED_BYTES + 1) -> bytes:
    """The bytes of a regular file, refusing symlinks, fifos and devices; at most `limit`."""
    fd = os.open(path, FILE_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(fd)


def read_below(root: Path, rel: str, limit: int = MAX_CHANGED_BYTES + 1) -> bytes | None:
    """The bytes of the regular file `rel` below `root`, opened one component at a time
    without following any symlink (a link anywhere on the path, e.g. `up -> ../../..` in a
    repository, would reach host files); None when there is no such file."""
    parts = rel.split("/")
    if safe_relpath(rel) != rel:
        return None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], FILE_FLAGS, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(leaf).st_mode):
            return None
        with os.fdopen(leaf, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(leaf)


def collect_changes(
    base: Path, work: Path, max_bytes: int = MAX_CHANGED_BYTES, max_files: int = MAX_CHANGED_FILES
) -> Changes:
    """What differs in `work` from `base`: new or modified regular files, deleted files.

    A file the agent made unreadable is left out (as if unchanged)."""
    with closing(_entries(base)) as entries:
        base_entries = {e.rel: e.st for e in entries}
    changes: Changes = {}
    total = 0
    seen: set[str] = set()
    with closing(_entries(work)) as entries:
        for entry in entries:
            rel = entry.rel
            st = entry.st
            assert rel is not None
            seen.add(rel)
            if len(changes) > max_files:
                raise ChangesTooLarge(f"more than {max_files} files changed")
            old = base_entries.get(rel)
            if not stat.S_ISREG(st.st_mode):  # a symlink, fifo, socket: never carried
                if old is not None and not stat.S_ISLNK(old.st_mode):
                    changes[rel] = None  # a snapshot file replaced by one: it is gone
                continue
            if (
                old is not None
                and stat.S_ISREG(old.st_mode)
                and (old.st_size, old.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
            ):
                continue
            total += st.st_size
            if total > max_bytes:
                raise ChangesTooLarge(f"changed files exceed {max_bytes} bytes")
            try:
                data = read_at(entry, max_bytes + 1)
            except OSError:
                continue
            if old is not None and stat.S_ISREG(old.st_mode) and data == read_below(base, rel):
                continue
            changes[rel] = data
    for rel in base_entries:
        if rel not in seen:
            changes[rel] = None
    return changes


def tree_bytes(root: Path) -> int:
    """Disk space used below `root`: each entry's allocated blocks (directories included), at
    least `ENTRY_BYTES` per entry; symlinks not followed. A tree that is gone, or that changes
    under the walk (a watcher beside a running process), counts what the walk saw."""
    total = 0
    try:
        with closing(walk(root, max_rel=0)) as tree:
            for entry in tree:
                total += max(entry.st.st_blocks * 512, ENTRY_BYTES)
    except OSError:
        pass
    return total


def safe_relpath(rel: str) -> str | None:
    """`rel` normalised if it stays inside the tree (no absolute path, no `..`), else None."""
    if not rel or "\0" in rel or os.path.isabs(rel):
        return None
    norm = os.path.normpath(rel).replace(os.sep, "/")
    if norm == ".." or norm.startswith("../") or norm == ".":
        return None
    return norm


def parents_are_dirs(root: Path, rel: str) -> bool:
    cur = root
    for part in rel.split("/")[:-1]:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            return False
    return True


def apply_changes(root: Path, changes: Changes) -> list[str]:
    """Write `changes` into `root`; returns the paths skipped as unsafe."""
    skipped = []
    for rel, data in sorted(changes.items()):
        norm = safe_relpath(rel)
        if norm is None or not parents_are_dirs(root, norm):
            skipped.append(rel)
            continue
        dest = root / norm
        if dest.is_dir() and not dest.is_symlink():
            skipped.append(rel)  # a file never replaces a directory (and what it holds)
            continue
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        if data is not None:
            cur = root
            for part in norm.split("/")[:-1]:  # not mkdir(parents=True): it recurses per level
                cur = cur / part
                if not cur.is_dir():
                    cur.mkdir()
            dest.write_bytes(data)
    return skipped


def unified_diff(base: Path, changes: Changes, max_chars: int = 20000) -> str:
    """The changes as a git-style unified diff (binary files named only), capped."""
    out: list[str] = []
    for path, data in sorted(changes.items()):
        rel = display_path(path)
        old = read_below(base, path)  # never through a link: a host file is no "old" side
        try:
            a = [] if old is None else old.decode().splitlines(keepends=True)
            b = [] if data is None else data.decode().splitlines(keepends=True)
        except UnicodeDecodeError:
            out.append(f"diff --git a/{rel} b/{rel}\nBinary files differ\n")
            continue
        out.append(f"diff --git a/{rel} b/{rel}\n")
        src = f"a/{rel}" if old is not None else "/dev/null"
        dst = f"b/{rel}" if data is not None else "/dev/null"
        for line in difflib.unified_diff(a, b, src, dst):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    text = "".join(out)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[... diff truncated ...]\n"

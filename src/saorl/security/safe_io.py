"""Files saorl writes go only where saorl means them to: never through a symbolic link.

A run folder, an evaluation's output folder or a cache may be shared with, or received from,
someone else, who can plant `metrics.jsonl -> ~/.bashrc` there. Every file saorl writes goes
through this module:

- `open_write` opens a file for writing or appending with `O_NOFOLLOW` (a new file is created
  mode 0600) and refuses one that is not a regular file of this user;
- `write_atomic` and `staged` write a whole file to a fresh temporary file in the same folder
  (`mkstemp`: `O_EXCL`, mode 0600) and rename it over the path, so a reader never sees half of
  it and a link at the path is replaced, never followed;
- `make_dir` / `check_dir` create or accept a folder only if it is a real folder of this user
  (`check_dir` also refuses a link), `temp_dir` makes a fresh 0700 folder to write a directory
  (a Hugging Face model) into before it is renamed into place.

A link where saorl writes, or a folder of another user, is refused with `UnsafePathError` (a
`ConfigError`, exit 2, and an `OSError`) naming the path. docs/security.md says what this does
and does not cover.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from saorl.config import ConfigError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(ConfigError, OSError):
    """A path saorl would write through is a symbolic link or belongs to another user."""


def _refuse_link(path: Path, what: str) -> None:
    raise UnsafePathError(
        f"{path} is a symbolic link (to {os.readlink(path)!r}); saorl never writes {what} "
        "through a link: remove it (someone may have planted it to redirect the write)"
    )


def refuse_link(path: str | os.PathLike[str], what: str = "a file") -> None:
    """Raise `UnsafePathError` if `path` is a symbolic link."""
    if os.path.islink(path):
        _refuse_link(Path(path), what)


def _check_owner(path: Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise UnsafePathError(
            f"{path}: {what} belongs to user id {st.st_uid}, not to you ({os.geteuid()}); "
            "saorl writes only into folders and files of its own user (another user could "
            "read or replace what it writes there): pick another path"
        )


def check_owned_file(path: str | os.PathLike[str], fd: int) -> None:
    """Raise `UnsafePathError` unless the open `fd` (of `path`) is a regular file of this user."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device: O_NONBLOCK kept the open from hanging
        raise UnsafePathError(f"{path} is not a regular file; saorl writes only files there")
    _check_owner(Path(path), st, "the file")


def check_dir(path: str | os.PathLike[str], what: str = "run folder") -> Path:
    """`path` if it is a real folder (not a link) of this user, else `UnsafePathError`."""
    path = Path(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        _refuse_link(path, f"into a {what}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: the {what} is not a folder")
    _check_owner(path, st, f"the {what}")
    return path


def make_dir(path: str | os.PathLike[str], what: str = "folder", mode: int = 0o700) -> Path:
    """Create `path` (mode `mode`; missing parents with the default mode) or accept it as it
    is; `check_dir` either way."""
    path = Path(path)
    if not os.path.islink(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
    return check_dir(path, what)


def open_write(
    path: str | os.PathLike[str],
    mode: str = "w",
    encoding: str | None = "utf-8",
    newline: str | None = None,
) -> IO[Any]:
    """`path` opened for writing ("w", "wb": emptied) or appending ("a", "ab") without
    following a link; created mode 0600 if new; only a regular file of this user."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK
    flags |= os.O_APPEND if mode.startswith("a") else 0
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            _refuse_link(path, "a file")
        if e.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK): never a file saorl wrote
            raise UnsafePathError(
                f"{path} is not a regular file; saorl writes only files there"
            ) from e
        raise
    try:
        check_owned_file(path, fd)
        os.set_blocking(fd, True)
        if not mode.startswith("a"):
            os.ftruncate(fd, 0)  # after the checks: never empties someone else's file
        binary = "b" in mode
        return os.fdopen(
            fd,
            mode.replace("+", ""),
            encoding=None if binary else encoding,
            newline=None if binary else newline,
        )
    except BaseException:
        os.close(fd)
        raise


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o600)


@contextlib.contextmanager
def staged(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[tuple[IO[Any], Path]]:
    """`(file, temporary path)`: write the whole content of `path` to `file`; on a clean exit it
    is flushed, synced and renamed over `path`; on an error the temporary file is removed."""
    path = Path(path)
    refuse_link(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp.")
    os.close(fd)
    tmp = Path(name)
    try:
        binary = "b" in mode
        # Opened again by name (the file's `name` is its path) but never through a link.
        with open(tmp, mode, encoding=None if binary else "utf-8", opener=_no_follow) as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
        refuse_link(path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """`staged`, the file alone."""
    with staged(path, mode) as (f, _):
        yield f


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write `data` (text: UTF-8) as the whole new content of `path` (`staged`)."""
    with atomic_write(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def temp_dir(beside: str | os.PathLike[str]) -> Path:
    """A new empty folder (mode 0700) next to `beside`, to fill and rename into its place."""
    beside = Path(beside)
    return Path(tempfile.mkdtemp(dir=beside.parent, prefix=f".{beside.name}.tmp."))

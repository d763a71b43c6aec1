"""Walking and removing directory trees that sandboxed code wrote.

Such a tree is hostile input: a nest deeper than Python's recursion limit (`os.walk` and
`shutil.rmtree` recurse) or longer than PATH_MAX (no full path reaches its bottom), symlinks
out of the tree or in loops, fifos and sockets, directories without read or write permission,
names that are not UTF-8. The walk here is iterative and goes through directory file
descriptors, one at a time (a chain of one per level could run out of descriptors): it opens a
child with `openat(O_NOFOLLOW | O_DIRECTORY)` and climbs back through `..`, checking that it
lands where it came from. It never follows a symlink, never opens anything but a directory,
and stays on the root's filesystem. Names are `str` as `os.listdir` gives them
(surrogate-escaped where they are not UTF-8; `os.fsencode` gives the bytes back).

The walk assumes nothing moves the tree meanwhile (the code that wrote it has ended); if
something does, it stops with an OSError rather than wander off.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # no fifo blocks an open


@dataclass(frozen=True)
class Entry:
    """One entry below the root, as `walk` meets it."""

    rel: str | None  # '/'-separated path from the root; None when longer than `max_rel` bytes
    name: str
    st: os.stat_result  # lstat: a symlink is described, never followed
    dir_fd: int  # the directory holding it, open until the walk moves on (for `*at` calls)


@dataclass
class _Level:
    names: list[str]  # entries still to visit, in reverse order (pop() gives the next)
    rel: str | None
    name: str  # this directory's name in its parent
    ident: tuple[int, int]  # (st_dev, st_ino), to check the climb back through '..'


def _listing(fd: int) -> list[str]:
    return sorted(os.listdir(fd), reverse=True)


def _join(rel: str | None, name: str, max_rel: int) -> str | None:
    if rel is None:
        return None
    path = f"{rel}/{name}" if rel else name
    return path if len(path) <= max_rel and len(os.fsencode(path)) <= max_rel else None


def _open_dir(name: str, dir_fd: int | None, st: os.stat_result | None, writable: bool) -> int:
    """Open directory `name` (`st` its lstat; None for the root). Code in the sandbox runs as
    the caller's uid and may have taken the owner's permissions away: they are given back,
    read and search always (a walk must see everything, or a disk budget could be dodged),
    write too with `writable` (so that what it holds can be removed)."""
    # `name` was just lstat'ed as a directory, and nothing moves the tree: no link followed.
    if writable and st is not None and st.st_mode & 0o700 != 0o700:
        os.chmod(name, 0o700, dir_fd=dir_fd)
    # The root is the caller's path, which may lead through a symlink.
    flags = _DIR_FLAGS if st is not None else _DIR_FLAGS & ~os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        if st is None:
            raise
        os.chmod(name, stat.S_IMODE(st.st_mode) | 0o500, dir_fd=dir_fd)
        return os.open(name, flags, dir_fd=dir_fd)


def _traverse(
    root: Path, skip_dirs: Collection[str], max_rel: int, remove: bool, errors: list[OSError]
) -> Iterator[Entry]:
    """Pre-order walk below `root` (sorted by name), or with `remove` a post-order removal.

    In a walk, a directory that cannot be opened is not entered; in a removal each failure is
    appended to `errors` and the rest is still removed."""
    fd = _open_dir(os.fspath(root), None, None, remove)
    try:
        top = os.fstat(fd)
        stack = [_Level(_listing(fd), "", "", (top.st_dev, top.st_ino))]
        while stack:
            level = stack[-1]
            if not level.names:
                stack.pop()
                if not stack:
                    break
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                up = os.fstat(fd)
                if (up.st_dev, up.st_ino) != stack[-1].ident:
                    raise OSError(errno.ESTALE, f"{root}: the tree moved while it was walked")
                if remove:
                    try:
                        os.rmdir(level.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass  # already gone: what a removal wants
                    except OSError as exc:
                        errors.append(exc)
                continue
            name = level.names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = _join(level.rel, name, max_rel)
            if not remove:
                yield Entry(rel, name, st, fd)
            if not stat.S_ISDIR(st.st_mode):
                if remove:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        pass  # already gone: what a removal wants
                    except OSError as exc:
                        errors.append(exc)
                continue
            if name in skip_dirs or st.st_dev != top.st_dev:  # never into another filesystem
                continue
            try:
                child = _open_dir(name, fd, st, remove)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if remove:
                    errors.append(exc)
                continue
            try:
                found = os.fstat(child)
                same = (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino)
                names = _listing(child) if same else []
            except OSError as exc:
                os.close(child)
                if remove:
                    errors.append(exc)
                continue
            if not same:
                os.close(child)
                raise OSError(errno.ESTALE, f"{root}: the tree moved while it was walked")
            os.close(fd)
            fd = child
            stack.append(_Level(names, rel, name, (st.st_dev, st.st_ino)))
    finally:
        os.close(fd)


def walk(root: Path, skip_dirs: Collection[str] = (), max_rel: int = 4096) -> Iterator[Entry]:
    """Every entry below `root`, a directory before what it holds, names sorted; directories
    named in `skip_dirs` are reported but not entered, and so are those that cannot be opened
    even after giving their owner read permission back. Close the iterator (or exhaust it) to
    release its descriptor."""
    return _traverse(root, skip_dirs, max_rel, remove=False, errors=[])


def read_at(entry: Entry, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `entry`, read while the walk is on it."""
    fd = os.open(entry.name, FILE_FLAGS, dir_fd=entry.dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{entry.rel}: not a regular file")
        chunks = []
        left = limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete `path` and everything below it, however deep or odd; a symlink is unlinked, never
    followed; a missing path is fine. Raises the first OSError only when something could not
    be deleted (after deleting everything else it could)."""
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    if st.st_mode & 0o700 != 0o700:
        path.chmod(0o700)
    errors: list[OSError] = []
    for _ in _traverse(path, (), 0, remove=True, errors=errors):
        pass
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise (errors[0] if errors else exc) from None

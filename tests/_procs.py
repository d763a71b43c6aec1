"""Processes seen through /proc, for tests that check what a run started and stopped.

A process or thread may end between listing /proc and reading its files: every read here
treats a vanished entry as an ended process, never as an error."""

from __future__ import annotations

from pathlib import Path


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # it ended after /proc was listed
        return None


def children_of(pid: int, marker: bytes = b"", *, zombies: bool = False) -> list[int]:
    """Children of `pid` whose command line contains `marker`; exited but unreaped ones (zombies,
    whose command line is empty) only with `zombies=True`, as a leak check wants them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat, cmdline = _read(entry / "stat"), _read(entry / "cmdline")
        if stat is None or cmdline is None:
            continue
        state, ppid = stat.rsplit(b")", 1)[1].split()[:2]
        if int(ppid) == pid and (zombies or state != b"Z") and marker in cmdline:
            found.append(int(entry.name))
    return found


def processes_with(marker: bytes) -> list[int]:
    """Every live process (not a zombie) whose command line contains `marker`, whoever its
    parent: an orphan's parent is init (or a subreaper), not the process that started it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat, cmdline = _read(entry / "stat"), _read(entry / "cmdline")
        if stat is None or cmdline is None:
            continue
        if stat.rsplit(b")", 1)[1].split()[0] != b"Z" and marker in cmdline:
            found.append(int(entry.name))
    return found

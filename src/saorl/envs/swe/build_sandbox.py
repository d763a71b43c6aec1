"""Host-side settings of the sandbox a task environment is built in (`venv.py` runs the build
there, `venv_build.py` is what runs inside): the environment it gets, the host paths it sees,
whether it gets the network, and the check of what it reports.

The build's environment is pip's settings only (`PIP_*` variables, pip's config file, proxies,
CA bundles): tokens, keys and cloud credentials of the caller stay out. Network: none with
`--no-index` (or `PIP_NO_INDEX`); otherwise the host's, because bubblewrap cannot allow the
package index alone (docs/coding-agent.md says what that leaves open).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saorl.envs.swe.task import TaskEnv
from saorl.envs.swe.workspace import safe_relpath

PIP_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
PLUGIN_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
BUILD_MEMORY_BYTES = 8 << 30
BUILD_DISK_BYTES = 4 << 30  # each tmpfs of the build sandbox (pip's cache and temp files)


def _pip_config_file() -> str | None:
    """The user's pip configuration file, if any (the sandbox has no home directory)."""
    if os.environ.get("PIP_CONFIG_FILE"):
        return os.environ["PIP_CONFIG_FILE"]
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    for path in (f"{xdg}/pip/pip.conf", os.path.expanduser("~/.pip/pip.conf")):
        if os.path.isfile(path):
            return path
    return None


def build_env_vars() -> dict[str, str]:
    """The build's environment beyond the sandbox's own: pip's settings (`PIP_*`, its config
    file), proxies and CA bundles; nothing else of the caller's (tokens, keys, cloud
    credentials stay out)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in PIP_ENV}
    if (conf := _pip_config_file()) is not None:
        env["PIP_CONFIG_FILE"] = conf
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def needs_network(pip_args: Sequence[str], env: dict[str, str]) -> bool:
    """Whether pip needs an index: not with `--no-index` (local wheels, `--find-links`)."""
    no_index = env.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on")
    return "--no-index" not in pip_args and not no_index


def host_paths(values: Sequence[str]) -> list[str]:
    """Absolute host paths named in pip's arguments and settings (`--find-links DIR`,
    `file://` URLs, a config file): bound read-only into the build sandbox."""
    out = []
    for value in values:
        for word in value.replace("=", " ").split():
            path = word[7:] if word.startswith("file://") else word
            if os.path.isabs(path) and os.path.exists(path):
                out.append(os.path.realpath(path))
    return list(dict.fromkeys(out))


def objects_dirs(build: Path) -> list[str]:
    """The checkout's object store a `--shared` clone reads (bound read-only)."""
    alternates = build / ".git" / "objects" / "info" / "alternates"
    try:
        lines = alternates.read_text().splitlines()
    except OSError:
        return []
    return [os.path.realpath(line) for line in lines if os.path.isabs(line)]


def checked_env(data: Any, envdir: Path) -> TaskEnv | None:
    """The `TaskEnv` a record describes if it is one a build of `envdir` makes: its venv,
    import roots that are plain relative paths inside the repository, plugin names of
    plain characters; else None (a cache and a build's answer are data)."""
    try:
        venv = data["venv"]
        roots = data["roots"]
        plugins = data["plugins"]
        key = data["key"]
    except (KeyError, TypeError):
        return None
    ok = (
        venv == str(envdir / "venv")
        and key == envdir.name
        and isinstance(roots, list)
        and isinstance(plugins, list)
        and roots
        and all(isinstance(r, str) and (r == "." or safe_relpath(r) == r) for r in roots)
        and all(isinstance(p, str) and PLUGIN_NAME.fullmatch(p) for p in plugins)
    )
    return TaskEnv(venv, tuple(roots), tuple(plugins), key) if ok else None

"""Runs with a task venv's interpreter, in the build sandbox (`venv_build.py`), while `venv.py`
builds it (as `python -I -c <this source> CLONE JSON`): what the install left behind, as one
JSON line.

- `paths`, `mapped`: what points into the clone the repository was installed from: `sys.path`
  entries (an editable install's `.pth`) and the import-hook mappings of setuptools
  (`MAPPING`, `NAMESPACES`) and of `editables` (`_redirections`), as [name, path];
- `project`: the repository's own distribution (its `direct_url.json` names the clone);
- `plugins`: the pytest11 entry-point names a fresh environment of the repository would hold:
  those of the distributions installed into the venv, and of saorl's that the project's
  requirements name, transitively (JSON argument: the extras, requirement files and dependency
  group requirements installed); never the project's own.
It imports pytest first: a venv the test runner could not use fails its build here. Standard
library, `packaging` (or pip's copy of it) and pytest only.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import sys
import sysconfig
import urllib.parse
from typing import Any

try:
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]


def check_pytest() -> None:
    try:
        import pytest  # noqa: F401
    except Exception as e:  # a pin too old for this Python (py's apipkg on 3.11, ...)
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        why = f"{type(e).__name__}: {e}"
        sys.exit(
            f"pytest cannot be imported in this environment ({why}); the repository's "
            f"requirements may pin a pytest too old for Python {version}"
        )


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(text: str) -> Any:
    try:
        return Requirement(text)
    except Exception:  # a line pip reads but packaging does not (a URL, an option)
        return None


def main() -> None:
    check_pytest()
    build = os.path.realpath(sys.argv[1])
    extras, req_files, packages = json.loads(sys.argv[2])

    def under(path: str) -> bool:
        path = os.path.realpath(path)
        return path == build or path.startswith(build + os.sep)

    mapped: list[list[str]] = []
    for finder in sys.meta_path:
        mod = sys.modules.get(getattr(finder, "__module__", None) or "")
        for name, path in dict(getattr(mod, "MAPPING", None) or {}).items():
            mapped.append([name, path])
        for name, paths in dict(getattr(mod, "NAMESPACES", None) or {}).items():
            mapped += [[name, p] for p in paths]
        redirections = getattr(finder, "_redirections", None)
        if isinstance(redirections, dict):
            mapped += [[n, p] for n, p in redirections.items()]
    entries = [p for p in sys.path if isinstance(p, str) and p and os.path.isdir(p)]
    purelib = sysconfig.get_path("purelib")
    dists: dict[str, Any] = {}
    for dist in md.distributions(path=[p for p in entries if not under(p)]):
        dists.setdefault(norm(dist.metadata["Name"] or ""), dist)  # the first on the path wins

    project: list[str] = []
    wanted: list[tuple[str, tuple[str, ...]]] = []
    for key, dist in dists.items():
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        except ValueError:
            url = ""
        if url.startswith("file://") and under(urllib.parse.unquote(url[7:])):
            project.append(key)
            wanted.append((key, tuple(extras)))
    for name in req_files:
        try:
            with open(os.path.join(build, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            if not line.lstrip().startswith("-"):
                packages.append(line.split("#")[0].strip())
    for text in packages:
        if (req := _requirement(text)) is not None:
            wanted.append((norm(req.name), tuple(sorted(req.extras))))
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while wanted:  # the requirement closure, extras and markers evaluated
        key, want = wanted.pop()
        if (key, want) in seen or key not in dists:
            continue
        seen.add((key, want))
        for text in dists[key].requires or []:
            req = _requirement(text)
            if req is None:
                continue
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *want)):
                wanted.append((norm(req.name), tuple(sorted(req.extras))))
    needed = {key for key, _ in seen}
    plugins: set[str] = set()
    for key, dist in dists.items():
        local = os.path.realpath(str(dist.locate_file(""))) == os.path.realpath(purelib)
        if key not in project and (local or key in needed):
            plugins.update(ep.name for ep in dist.entry_points if ep.group == "pytest11")
    print(
        json.dumps(
            {
                "paths": [p for p in entries if under(p)],
                "mapped": [m for m in mapped if isinstance(m[1], str) and under(m[1])],
                "project": project,
                "plugins": sorted(plugins),
            }
        )
    )


if __name__ == "__main__":
    main()

"""Runs INSIDE the sandbox (as `python -I -c <this source>`, saorl's interpreter) while `venv.py`
builds a task's environment: every step that runs or reads what the repository's build code
made happens here, none on the host.

stdin: one JSON line `{"nonce": HEX, "venv": PATH, "build": PATH, "pip": [ARGS...],
"targets": [pip targets], "probe": SOURCE, "requirements": [extras, requirement files,
packages]}`. The venv and the
build clone are the only writable host paths (bound read-write at their own paths); the rest of
the host is what the sandbox shows (read-only /usr, saorl's interpreter), plus the network only
when the pip arguments need an index. Steps (see venv.py for why):
1. `pip install` the plan's targets in the clone (pip's output goes to stderr: the build log);
2. `venv_probe.py` with the venv's interpreter: what the install points at in the clone;
3. the import roots, relative to the clone; the editable install's hook files deleted;
4. the probe again (nothing may still point into the clone), and the plugin names;
5. `pytest` / `py.test` scripts in the venv's bin unless the repository installed pytest.
The result is one stdout line `NONCE {"roots": [...], "plugins": [...]}` or
`NONCE {"error": "..."}`; the host checks what it says (relative roots, plain names) before use.
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

SCRIPT = "#!{python}\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n"


class BuildError(Exception):
    pass


def run(what: str, argv: list[str], cwd: str, capture: bool = False) -> str:
    """Run a step; its output (or only its stderr, with `capture`) goes to our stderr."""
    print(f"$ {' '.join(argv)}", file=sys.stderr, flush=True)
    proc = subprocess.run(
        argv, cwd=cwd, stdout=subprocess.PIPE if capture else 2, stderr=subprocess.PIPE, text=True
    )
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        text = proc.stderr.strip()
        errors = [line.strip() for line in text.splitlines() if line.lstrip().startswith("ERROR")]
        # pip's last ERROR line is the most specific ("No matching distribution found for X"):
        # it goes first, so a one-line view of the message shows it
        lines = text.splitlines() or [""]
        head = errors[-1] if errors else lines[-1]
        detail = "\n".join(errors[:-1] if errors else lines[:-1])
        raise BuildError(f"`{what}` failed (exit {proc.returncode}): {head}\n{detail[-1500:]}")
    return proc.stdout or ""


def roots_of(info: dict, build: Path) -> list[str]:
    """Import roots relative to the repository: what the editable install put on the path,
    the parents of the packages its hook maps; else `src` (when it holds Python) and `.`."""
    roots: list[str] = []
    real = Path(os.path.realpath(build))
    for entry in info["paths"]:
        roots.append(Path(os.path.realpath(entry)).relative_to(real).as_posix())
    for name, path in info["mapped"]:
        p = Path(os.path.realpath(path))
        if p.name == "__init__.py":
            p = p.parent
        elif p.suffix:
            p = p.with_suffix("")
        parts = tuple(name.split("."))
        if p.parts[-len(parts) :] != parts:
            raise BuildError(
                f"package {name!r} is installed from {p.relative_to(real).as_posix()!r}, a "
                "directory of another name; saorl puts the repository's import roots on the "
                "path and cannot mirror such a mapping (package_dir)"
            )
        roots.append(p.parents[len(parts) - 1].relative_to(real).as_posix())
    if not roots:
        src = build / "src"
        has_src = src.is_dir() and (any(src.glob("*.py")) or any(src.glob("*/*.py")))
        roots = ["src", "."] if has_src else ["."]
    return list(dict.fromkeys(roots))


def detach(purelib: Path, build: str) -> None:
    """Delete the editable install's hook files (the top-level `.pth`, `.py` and `.egg-link`
    files of site-packages that name the build copy), and its lines of `easy-install.pth`."""
    needle = build.encode()
    for entry in sorted(purelib.iterdir()):
        if entry.is_symlink() or not entry.is_file():
            continue
        if entry.suffix not in (".pth", ".py", ".egg-link"):
            continue
        data = entry.read_bytes()
        if needle not in data:
            continue
        if entry.name == "easy-install.pth":
            kept = [line for line in data.splitlines(keepends=True) if needle not in line]
            entry.write_bytes(b"".join(kept))
            continue
        entry.unlink()
        for cached in (purelib / "__pycache__").glob(f"{entry.stem}.*.pyc"):
            cached.unlink()


def build(spec: dict[str, Any]) -> dict[str, Any]:
    venv = Path(spec["venv"])
    clone = Path(spec["build"])
    python = str(venv / "bin" / "python")
    if spec["targets"]:
        pip = [python, "-m", "pip", "install", *spec["pip"], *spec["targets"]]
        run(f"pip install {' '.join(spec['targets'])}", pip, str(clone))
    detect = [python, "-I", "-c", spec["probe"], str(clone), json.dumps(spec["requirements"])]
    info = json.loads(run("inspecting the environment", detect, str(venv), capture=True))
    roots = roots_of(info, clone)
    purelib = Path(sysconfig.get_path("purelib", "venv", {"base": venv, "platbase": venv}))
    detach(purelib, str(clone))
    after = json.loads(run("inspecting the environment", detect, str(venv), capture=True))
    if after["paths"] or after["mapped"]:
        raise BuildError(f"the install still points into the build copy: {after}")
    for name in ("pytest", "py.test"):
        script = venv / "bin" / name
        if not os.path.lexists(script):
            script.write_text(SCRIPT.format(python=python))
            script.chmod(0o755)
    return {"roots": roots, "plugins": after["plugins"]}


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    out = os.dup(1)  # the result channel; what the steps print goes to stderr
    os.dup2(2, 1)
    try:
        result = build(spec)
        code = 0
    except (BuildError, OSError, ValueError, KeyError) as e:
        result = {"error": str(e) or type(e).__name__}
        code = 1
    os.write(out, f"{spec['nonce']} {json.dumps(result)}\n".encode())
    return code


if __name__ == "__main__":
    sys.exit(main())

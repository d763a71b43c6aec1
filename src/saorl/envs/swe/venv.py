"""Per-task virtual environments: a SWE-bench task's repository installed as its own metadata
says, built once per (repository, environment commit, install inputs) and reused across episodes
and runs.

    env = ensure_env(task.source, cache_dir, pip_args=["--no-index", "--find-links", "wheels"])

Under `<env.swe_cache_dir>/envs/`:
- `<repo>-<commit12>-<hash16>/venv/`: the environment, bound read-only into the sandbox;
- `<repo>-<commit12>-<hash16>/build.log`: pip's output;
- `<repo>-<commit12>-<hash16>/ready.json`: written last, atomically; a directory without it is
  half-built and is removed and built again;
- `<repo>-<commit12>-<hash16>.lock`: an flock, so one process (or thread) builds a key while
  the others wait and then reuse it.
The hash covers everything the build reads: the install files at the commit (`pyproject.toml`,
`setup.py`, `setup.cfg`, the requirements files), the extras and files chosen from them,
`env.swe_pip_args`, saorl's interpreter and site-packages, and `BUILD_VERSION`.

How an environment is built: on the host, with pip's own configuration (its index, so with
network), before any episode; the repository's build code at the environment commit runs here,
as under any `pip install`, while code the agent writes never does.
1. `python -m venv --without-pip` with saorl's interpreter, plus `_saorl_base.pth` appending
   saorl's site-packages after the venv's own: pytest, pluggy and pip come from saorl's
   environment, and what the repository requires is installed into the venv and shadows them
   (pip leaves packages outside the venv alone, as with `--system-site-packages`).
2. A shared clone of the checkout at the commit, then one `pip install`: `-e .[extras]` when the
   repository has project metadata (`test`, `tests` or `testing` extras when declared), the
   requirements of the PEP 735 dependency groups of those names, the test requirement files
   (`requirements-test.txt`, `test-requirements.txt`, ...) and the plain `deps` of tox.ini's
   `[testenv]`; with none of these, the `dev` extra, group and `requirements-dev.txt`;
   `requirements.txt` when there is no project metadata.
3. The editable install is detached from the clone: its import roots (the directories its `.pth`
   adds, the parents of the packages its import hook maps) are recorded relative to the
   repository (`src`, `.`), its hook files are deleted, and so is the clone. At run time the
   roots of the repository copy go on the path instead: PYTHONPATH for the agent's tools; for
   grading, the runner's `sys.path` once plugins are loaded, so nothing of the repository runs
   at interpreter start-up (`pytest_runner.py`). A package mapped to a directory of another
   name (setuptools' `package_dir` remapping) cannot be mirrored so and is reported.
4. Grading loads, by name, the pytest11 plugins a fresh environment of the repository would
   hold (`venv_probe.py`): those of the packages installed into the venv and of saorl's that
   the project's requirements name, never the project's own (code the agent can edit).
   `pytest` and `py.test` scripts are written into the venv's bin unless the repository
   installed pytest itself.
Compiled extensions are not supported: they would be built into the clone, not the snapshot.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from saorl.envs.swe.task import EnvSource, TaskEnv

BUILD_VERSION = "1"  # bump when what a build produces changes: every key changes with it
TEST_EXTRAS = ("test", "tests", "testing")
TEST_REQUIREMENTS = (
    "requirements-test.txt", "requirements-tests.txt", "requirements-testing.txt",
    "requirements_test.txt", "requirements_tests.txt", "test-requirements.txt",
    "test_requirements.txt", "tests-requirements.txt", "requirements/test.txt",
    "requirements/tests.txt", "requirements/testing.txt",
)  # fmt: skip
DEV_REQUIREMENTS = ("requirements-dev.txt", "requirements_dev.txt", "dev-requirements.txt",
                    "requirements/dev.txt")  # fmt: skip
INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "requirements.txt",
          *TEST_REQUIREMENTS, *DEV_REQUIREMENTS)  # fmt: skip
READY = "ready.json"
PTH = "_saorl_base.pth"
_SCRIPT = "#!{python}\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n"


class EnvBuildError(RuntimeError):
    """A task's environment could not be built; the message holds pip's error."""


@dataclass(frozen=True)
class InstallPlan:
    """What `pip install` gets, read from the repository's files at the environment commit."""

    editable: bool  # `-e .` (the repository has project metadata)
    extras: tuple[str, ...]
    requirements: tuple[str, ...]  # `-r FILE`, relative to the repository root
    packages: tuple[str, ...] = ()  # requirement strings of PEP 735 dependency groups

    def pip_targets(self) -> list[str]:
        targets = []
        if self.editable:
            targets += ["-e", "." + (f"[{','.join(self.extras)}]" if self.extras else "")]
        for name in self.requirements:
            targets += ["-r", name]
        return targets + list(self.packages)


def read_inputs(checkout: str, commit: str) -> dict[str, bytes]:
    """The install files (`INPUTS`) present at `commit`: one `git cat-file --batch`."""
    spec = "".join(f"{commit}:{name}\n" for name in INPUTS).encode()
    proc = subprocess.run(["git", "-C", checkout, "cat-file", "--batch"], input=spec,
                          capture_output=True, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        raise EnvBuildError(f"git cat-file in {checkout} failed: {proc.stderr.decode()[-500:]}")
    out, pos, files = proc.stdout, 0, {}
    for name in INPUTS:
        end = out.index(b"\n", pos)
        header, pos = out[pos:end].decode(errors="replace").split(), end + 1
        if len(header) != 3:  # "<name> missing" (or ambiguous): the file is not there
            continue
        size = int(header[2])
        if header[1] == "blob":
            files[name] = out[pos : pos + size]
        pos += size + 1
    return files


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _group(groups: dict, name: str, seen: tuple[str, ...] = ()) -> list[str]:
    """The requirement strings of a PEP 735 dependency group, includes resolved."""
    out: list[str] = []
    for item in groups.get(name) or []:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(inc := item.get("include-group"), str):
            out += _group(groups, inc, (*seen, name)) if inc not in seen else []
    return out


def _metadata(files: dict[str, bytes]) -> tuple[bool, list[str], dict, list[str]]:
    """(whether `pip install -e .` applies, the extras the metadata declares, the PEP 735
    dependency groups of pyproject.toml, the `deps` of tox.ini's `[testenv]`)."""
    editable, declared, groups, tox_deps = "setup.py" in files, [], {}, []
    if "pyproject.toml" in files:
        try:
            data = tomllib.loads(files["pyproject.toml"].decode("utf-8", errors="replace"))
        except tomllib.TOMLDecodeError:
            data = {}
        project = data.get("project")
        editable = editable or isinstance(project, dict) or "build-system" in data
        if isinstance(project, dict) and isinstance(project.get("optional-dependencies"), dict):
            declared += list(project["optional-dependencies"])
        if isinstance(data.get("dependency-groups"), dict):
            groups = data["dependency-groups"]
    if "setup.cfg" in files:
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(files["setup.cfg"].decode("utf-8", errors="replace"))
            if cfg.has_section("options.extras_require"):
                declared += cfg.options("options.extras_require")
        except configparser.Error:
            pass
    if "tox.ini" in files:  # older projects list their test dependencies only there
        tox = configparser.ConfigParser(interpolation=None)
        try:
            tox.read_string(files["tox.ini"].decode("utf-8", errors="replace"))
            deps = tox.get("testenv", "deps", fallback="")
        except configparser.Error:
            deps = ""
        for line in (raw.split("#")[0].strip() for raw in deps.splitlines()):
            # no substitutions, factor-conditional lines (py27: mock) or options (-c, -e, -r)
            if line and line[0] != "-" and "{" not in line and not re.match(r"[\w.,!-]+:", line):
                tox_deps.append(line)
    if "setup.py" in files:  # not executed: extras named as dict keys are found by their text
        text = files["setup.py"].decode("utf-8", errors="replace")
        declared += re.findall(r"""['"](tests?|testing|dev)['"]\s*:""", text)
    return editable, list(dict.fromkeys(declared)), groups, tox_deps


def install_plan(files: dict[str, bytes]) -> InstallPlan:
    """`-e .` with the test extras, dependency groups and requirement files, else the dev
    ones (module docstring)."""
    editable, declared, groups, tox_deps = _metadata(files)

    def pick(names: tuple[str, ...], req_files: tuple[str, ...]) -> tuple[list, list, list]:
        extras = [e for e in declared if _norm(e) in names] if editable else []
        packages = [r for g in groups if _norm(g) in names for r in _group(groups, g)]
        packages += tox_deps if names == TEST_EXTRAS else []
        return extras, list(dict.fromkeys(packages)), [f for f in req_files if f in files]

    extras, packages, reqs = pick(TEST_EXTRAS, TEST_REQUIREMENTS)
    if not extras and not packages and not reqs:
        extras, packages, reqs = pick(("dev",), DEV_REQUIREMENTS)
    if not editable and "requirements.txt" in files:
        reqs.insert(0, "requirements.txt")
    return InstallPlan(editable, tuple(extras), tuple(reqs), tuple(packages))


def base_site_dirs() -> list[str]:
    """saorl's site-packages: what the task venvs see behind their own packages."""
    return [os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)]


def env_key(source: EnvSource, files: dict[str, bytes], plan: InstallPlan,
            pip_args: Sequence[str]) -> str:  # fmt: skip
    """The cache directory name of the environment these inputs build."""
    h = hashlib.sha256()
    ident = {"v": BUILD_VERSION, "repo": source.repo, "commit": source.commit,
             "plan": asdict(plan), "pip": list(pip_args), "python": sys.version,
             "exe": os.path.realpath(sys.executable), "site": base_site_dirs()}  # fmt: skip
    h.update(json.dumps(ident, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", source.repo.replace("/", "__"))
    return f"{safe}-{source.commit[:12]}-{h.hexdigest()[:16]}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:  # flock: per open file, so threads exclude each other too
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_memo: dict[str, TaskEnv] = {}
_memo_lock = threading.Lock()


def ensure_env(source: EnvSource, cache_dir: Path, pip_args: Sequence[str] = (),
               timeout_s: float = 1800.0) -> TaskEnv:  # fmt: skip
    """The environment of `source`: from the cache, or built now (raises EnvBuildError)."""
    files = read_inputs(source.checkout, source.commit)
    plan = install_plan(files)
    key = env_key(source, files, plan, pip_args)
    with _memo_lock:
        if key in _memo and Path(_memo[key].python).exists():
            return _memo[key]
    root = Path(cache_dir).resolve() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        env = _ready(root / key)
        if env is None:
            env = _build(source, plan, root / key, list(pip_args), timeout_s)
    with _memo_lock:
        _memo[key] = env
    return env


def _ready(envdir: Path) -> TaskEnv | None:
    try:
        data = json.loads((envdir / READY).read_text())
        env = TaskEnv(data["venv"], tuple(data["roots"]), tuple(data["plugins"]), data["key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return env if Path(env.python).exists() else None


def _host_env() -> dict[str, str]:
    """The build's environment: the caller's (pip's configuration, proxies), minus what would
    make the venv's interpreter look elsewhere."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
            "__PYVENV_LAUNCHER__")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def _run(what: str, argv: list[str], cwd: Path, timeout_s: float, log: list[str]) -> str:
    """Run the build step `what`; its output goes to the log; raises EnvBuildError on failure."""
    try:
        proc = subprocess.run(argv, cwd=cwd, env=_host_env(), capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise EnvBuildError(f"`{what}` ran past {timeout_s:g} s") from None
    log.append(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip()
        errors = [line.strip() for line in text.splitlines() if line.lstrip().startswith("ERROR")]
        # pip's last ERROR line is the most specific ("No matching distribution found for X"):
        # it goes first, so a one-line view of the message shows it
        lines = text.splitlines() or [""]
        head = errors[-1] if errors else lines[-1]
        detail = "\n".join(errors[:-1] if errors else lines[:-1])
        raise EnvBuildError(f"`{what}` failed (exit {proc.returncode}): {head}\n{detail[-1500:]}")
    return proc.stdout


def _build(source: EnvSource, plan: InstallPlan, envdir: Path, pip_args: list[str],
           timeout_s: float) -> TaskEnv:  # fmt: skip
    if envdir.exists():  # half-built (no ready marker): start over
        shutil.rmtree(envdir)
    envdir.mkdir(parents=True)
    log: list[str] = []
    start = time.monotonic()
    try:
        env = _build_steps(source, plan, envdir, pip_args, timeout_s, log)
    except EnvBuildError as e:
        shutil.rmtree(envdir / "venv", ignore_errors=True)
        raise EnvBuildError(f"{source.repo} at {source.commit[:12]}: {str(e).rstrip()}\n(log: "
                            f"{envdir / 'build.log'})") from None  # fmt: skip
    finally:
        shutil.rmtree(envdir / "build", ignore_errors=True)
        (envdir / "build.log").write_text("\n".join(log), encoding="utf-8")
    record = {**asdict(env), "repo": source.repo, "commit": source.commit,
              "plan": asdict(plan), "seconds": round(time.monotonic() - start, 2)}  # fmt: skip
    tmp = envdir / f".{READY}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, envdir / READY)
    return env


def _build_steps(source: EnvSource, plan: InstallPlan, envdir: Path, pip_args: list[str],
                 timeout_s: float, log: list[str]) -> TaskEnv:  # fmt: skip
    venv, build = envdir / "venv", envdir / "build"
    _run("python -m venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], envdir,
         300, log)  # fmt: skip
    python = str(venv / "bin" / "python")
    purelib = Path(sysconfig.get_path("purelib", "venv", {"base": venv, "platbase": venv}))
    (purelib / PTH).write_text("".join(f"{p}\n" for p in base_site_dirs()))
    _run("git clone", ["git", "clone", "--quiet", "--shared", "--no-checkout", source.checkout,
                       str(build)], envdir, 600, log)  # fmt: skip
    _run("git checkout", ["git", "-C", str(build), "checkout", "--quiet", "--detach",
                          source.commit], envdir, 600, log)  # fmt: skip
    if targets := plan.pip_targets():
        pip = [python, "-m", "pip", "install", *pip_args, *targets]
        _run(f"pip install {' '.join(targets)}", pip, build, timeout_s, log)
    probe = Path(__file__).with_name("venv_probe.py").read_text(encoding="utf-8")
    detect = [python, "-I", "-c", probe, str(build),
              json.dumps([plan.extras, plan.requirements, plan.packages])]  # fmt: skip
    info = json.loads(_run("inspecting the environment", detect, envdir, 120, log))
    roots = _roots(info, build)
    _detach(purelib, str(build))
    after = json.loads(_run("inspecting the environment", detect, envdir, 120, log))
    if after["paths"] or after["mapped"]:
        raise EnvBuildError(f"the install still points into the build copy: {after}")
    for name in ("pytest", "py.test"):
        script = venv / "bin" / name
        if not script.exists():
            script.write_text(_SCRIPT.format(python=python))
            script.chmod(0o755)
    return TaskEnv(str(venv), roots, tuple(after["plugins"]), envdir.name)


def _roots(info: dict, build: Path) -> tuple[str, ...]:
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
            raise EnvBuildError(
                f"package {name!r} is installed from {p.relative_to(real).as_posix()!r}, a "
                "directory of another name; saorl puts the repository's import roots on the "
                "path and cannot mirror such a mapping (package_dir)"
            )
        roots.append(p.parents[len(parts) - 1].relative_to(real).as_posix())
    if not roots:
        src = build / "src"
        has_src = src.is_dir() and (any(src.glob("*.py")) or any(src.glob("*/*.py")))
        roots = ["src", "."] if has_src else ["."]
    return tuple(dict.fromkeys(roots))


def _detach(purelib: Path, build: str) -> None:
    """Delete the editable install's hook files (the top-level `.pth`, `.py` and `.egg-link`
    files of site-packages that name the build copy), and its lines of `easy-install.pth`."""
    needle = build.encode()
    for entry in sorted(purelib.iterdir()):
        if not entry.is_file() or entry.suffix not in (".pth", ".py", ".egg-link"):
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


@dataclass(frozen=True)
class Failure:
    key: str
    reason: str


def attach_envs(tasks: list, cache_dir: Path, pip_args: Sequence[str] = (),
                timeout_s: float = 1800.0) -> tuple[list, list[Failure]]:  # fmt: skip
    """`tasks` with their environments (`SweTask.env`), and those whose environment could not
    be built, with pip's error. Each distinct source is built once."""
    import dataclasses

    built: dict[EnvSource, TaskEnv | str] = {}
    kept, failed = [], []
    for task in tasks:
        if task.source is None:
            kept.append(task)
            continue
        if task.source not in built:
            try:
                built[task.source] = ensure_env(task.source, cache_dir, pip_args, timeout_s)
            except EnvBuildError as e:
                built[task.source] = f"environment build failed: {e}"
        env = built[task.source]
        if isinstance(env, str):
            failed.append(Failure(task.key, env))
        else:
            kept.append(dataclasses.replace(task, env=env))
    return kept, failed

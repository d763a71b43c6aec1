"""Per-task virtual environments: a SWE-bench task's repository installed as its own metadata
says, built once per (repository, environment commit, install inputs) and reused across episodes
and runs.

    env = ensure_env(task.source, cache_dir, pip_args=["--no-index", "--find-links", "wheels"])

Under `<env.swe.cache_dir>/envs/`:
- `<repo>-<commit12>-<hash16>/venv/`: the environment, bound read-only into the sandbox;
- `<repo>-<commit12>-<hash16>/build.log`: pip's output;
- `<repo>-<commit12>-<hash16>/ready.json`: written last, atomically; a directory without it is
  half-built and is removed and built again;
- `<repo>-<commit12>-<hash16>.lock`: an flock, so one process (or thread) builds a key while
  the others wait and then reuse it.
The hash covers everything the build reads: the install files at the commit (`pyproject.toml`,
`setup.py`, `setup.cfg`, the requirements files), the extras and files chosen from them,
`env.swe.pip_args`, saorl's interpreter and site-packages, and `BUILD_VERSION`.

How an environment is built: the repository's build code (`setup.py`, an in-tree PEP 517
backend) is hostile input, so everything that runs or reads what it made runs in the sandbox
(`venv_build.py`): the environment scrubbed to pip's settings (`PIP_*`, pip's config file,
proxies, CA bundles: `build_env_vars`), the venv and the build clone the only writable host
paths, the paths pip's arguments name bound read-only, and the host's network only when pip
needs an index (no `--no-index`): bubblewrap cannot allow one host alone, so a build that
downloads can reach the network (never the caller's secrets or files). On the host: the venv's
creation and the hardened git clone (`git.py`); code the agent writes never runs at build time.
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
import secrets
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

from saorl.envs.swe.build_sandbox import (
    BUILD_DISK_BYTES,
    BUILD_MEMORY_BYTES,
    build_env_vars,
    checked_env,
    host_paths,
    needs_network,
    objects_dirs,
)
from saorl.envs.swe.git import git, git_argv, git_env
from saorl.envs.swe.task import EnvSource, TaskEnv
from saorl.envs.swe.workspace import remove_tree
from saorl.security.safe_io import open_write, write_atomic

BUILD_VERSION = "2"  # bump when what a build produces changes: every key changes with it
TEST_EXTRAS = ("test", "tests", "testing")
TEST_REQUIREMENTS = (
    "requirements-test.txt",
    "requirements-tests.txt",
    "requirements-testing.txt",
    "requirements_test.txt",
    "requirements_tests.txt",
    "test-requirements.txt",
    "test_requirements.txt",
    "tests-requirements.txt",
    "requirements/test.txt",
    "requirements/tests.txt",
    "requirements/testing.txt",
)
DEV_REQUIREMENTS = (
    "requirements-dev.txt",
    "requirements_dev.txt",
    "dev-requirements.txt",
    "requirements/dev.txt",
)
INPUTS = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "tox.ini",
    "requirements.txt",
    *TEST_REQUIREMENTS,
    *DEV_REQUIREMENTS,
)
READY = "ready.json"
PTH = "_saorl_base.pth"


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
    proc = git(checkout, "cat-file", "--batch", input=spec, timeout=120)
    if proc.returncode != 0:
        raise EnvBuildError(f"git cat-file in {checkout} failed: {proc.stderr.decode()[-500:]}")
    out = proc.stdout
    pos = 0
    files = {}
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
    editable = "setup.py" in files
    declared = []
    groups = {}
    tox_deps = []
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


def env_key(
    source: EnvSource, files: dict[str, bytes], plan: InstallPlan, pip_args: Sequence[str]
) -> str:
    """The cache directory name of the environment these inputs build."""
    h = hashlib.sha256()
    ident = {
        "v": BUILD_VERSION,
        "repo": source.repo,
        "commit": source.commit,
        "plan": asdict(plan),
        "pip": list(pip_args),
        "python": sys.version,
        "exe": os.path.realpath(sys.executable),
        "site": base_site_dirs(),
    }
    h.update(json.dumps(ident, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", source.repo.replace("/", "__"))
    return f"{safe}-{source.commit[:12]}-{h.hexdigest()[:16]}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open_write(path, "a") as f:  # flock: per open file, so threads exclude each other too
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_memo: dict[str, TaskEnv] = {}
_memo_lock = threading.Lock()


def ensure_env(
    source: EnvSource, cache_dir: Path, pip_args: Sequence[str] = (), timeout_s: float = 1800.0
) -> TaskEnv:
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
    except (OSError, ValueError):
        return None
    env = checked_env(data, envdir)
    return env if env is not None and Path(env.python).exists() else None


def _build(
    source: EnvSource, plan: InstallPlan, envdir: Path, pip_args: list[str], timeout_s: float
) -> TaskEnv:
    if os.path.lexists(envdir):  # half-built (no ready marker): start over
        remove_tree(envdir)
    envdir.mkdir(parents=True)
    log: list[str] = []
    start = time.monotonic()
    try:
        env = _build_steps(source, plan, envdir, pip_args, timeout_s, log)
    except EnvBuildError as e:
        remove_tree(envdir / "venv")
        raise EnvBuildError(
            f"{source.repo} at {source.commit[:12]}: {str(e).rstrip()}\n(log: "
            f"{envdir / 'build.log'})"
        ) from None
    finally:
        remove_tree(envdir / "build")
        write_atomic(envdir / "build.log", "\n".join(log))
    record = {
        **asdict(env),
        "repo": source.repo,
        "commit": source.commit,
        "plan": asdict(plan),
        "seconds": round(time.monotonic() - start, 2),
    }
    write_atomic(envdir / READY, json.dumps(record, indent=1))
    return env


def _host_step(what: str, argv: list[str], log: list[str]) -> None:
    """A step on the host that runs nothing of the repository (venv creation, hardened git)."""
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
        env={**git_env(), "PYTHONNOUSERSITE": "1"},
    )
    log.append(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        raise EnvBuildError(f"`{what}` failed (exit {proc.returncode}): {proc.stderr.strip()}")


def _build_steps(
    source: EnvSource,
    plan: InstallPlan,
    envdir: Path,
    pip_args: list[str],
    timeout_s: float,
    log: list[str],
) -> TaskEnv:
    from saorl.sandbox import Limits, run

    venv = envdir / "venv"
    build = envdir / "build"
    _host_step(
        "python -m venv", [sys.executable, "-I", "-m", "venv", "--without-pip", str(venv)], log
    )
    purelib = Path(sysconfig.get_path("purelib", "venv", {"base": venv, "platbase": venv}))
    (purelib / PTH).write_text("".join(f"{p}\n" for p in base_site_dirs()))
    _host_step(
        "git clone",
        git_argv(
            None, "clone", "--quiet", "--shared", "--no-checkout", source.checkout, str(build)
        ),
        log,
    )
    _host_step(
        "git checkout", git_argv(build, "checkout", "--quiet", "--detach", source.commit), log
    )
    # Everything that runs or reads the repository's build code happens in the sandbox.
    nonce = secrets.token_hex(16)
    spec = {
        "nonce": nonce,
        "venv": str(venv),
        "build": str(build),
        "pip": pip_args,
        "targets": plan.pip_targets(),
        "requirements": [plan.extras, plan.requirements, plan.packages],
        "probe": _source("venv_probe.py"),
    }
    env = build_env_vars()
    limits = Limits(
        wall_s=timeout_s,
        cpu_s=max(int(timeout_s), 1),
        max_processes=512,
        memory_bytes=BUILD_MEMORY_BYTES,
        file_size_bytes=BUILD_DISK_BYTES,
        open_files=4096,
        output_bytes=1 << 20,
    )
    result = run(
        [sys.executable, "-I", "-B", "-c", _source("venv_build.py")],
        limits=limits,
        stdin=json.dumps(spec).encode() + b"\n",
        env=env,
        rw_binds=(venv, build),
        ro_binds=(*objects_dirs(build), *host_paths([*pip_args, *env.values()])),
        network=needs_network(pip_args, env),
        cwd=build,
    )
    log.append(result.stderr)
    lines = [x for x in result.stdout.splitlines() if x.startswith(nonce + " ")]
    try:
        answer = json.loads(lines[-1][len(nonce) + 1 :])
    except (IndexError, ValueError):
        answer = {"error": f"the build ended without a result ({result.reason})"}
    if not isinstance(answer, dict) or "error" in answer:
        raise EnvBuildError(str(answer.get("error") if isinstance(answer, dict) else answer))
    env_record = {
        "venv": str(venv),
        "roots": answer.get("roots"),
        "plugins": answer.get("plugins"),
        "key": envdir.name,
    }
    task_env = checked_env(env_record, envdir)
    if task_env is None:
        raise EnvBuildError(f"the build reported an unusable result: {answer}"[:2000])
    return task_env


def _source(name: str) -> str:
    return Path(__file__).with_name(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Failure:
    key: str
    reason: str


def attach_envs(
    tasks: list, cache_dir: Path, pip_args: Sequence[str] = (), timeout_s: float = 1800.0
) -> tuple[list, list[Failure]]:
    """`tasks` with their environments (`SweTask.env`), and those whose environment could not
    be built, with pip's error. Each distinct source is built once."""
    import dataclasses

    built: dict[EnvSource, TaskEnv | str] = {}
    kept = []
    failed = []
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

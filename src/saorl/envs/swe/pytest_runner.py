"""Runs INSIDE the sandbox (as `python -I -B -c <this source>`): pytest on chosen test ids.

stdin: one JSON line, the spec `{"ids": [...], "nonce": HEX, "timeout_s": T, "plugins": [...],
"config": PATH or null, "max_lines": N, "paths": [...], "all": BOOL}`, then a tar stream of the
repository, extracted into the cwd (a sized tmpfs). Collects the files the ids live in, keeps
only the wanted items (every item of those files with `all`, task mining), runs them with a
per-test alarm of `timeout_s`, and reports each finished test as it goes (a run killed by the
outer wall-clock limit still reports every test that finished) as one stdout line
`NONCE {"id": ..., "status": "passed|failed|error|skipped|xfailed|xpassed|timeout",
"message": ...}`;
with `all`, a file that fails to collect is reported under its path. Everything else the
process prints goes to stderr. `paths` are the repository's import roots (relative: `src`,
`.`), which a per-task environment's editable install would have put on `sys.path`.

How the run stays what the grader asked for, whatever the repository holds:
- Config: `-c` names the one config file, the task's own (`config`, a path in the repository
  that the grader chose in the snapshot and restored) or an empty one of the runner's. pytest
  then reads no other `pytest.ini`, `.pytest.ini`, `pytest.toml`, `pyproject.toml`, `tox.ini`
  or `setup.cfg`; `--rootdir` and `--confcutdir` pin both to the repository root.
- Plugins: `PYTEST_*` variables are removed and auto-loading is off; the only third-party
  plugins are `plugins` (entry point or module names), loaded before the configuration is read,
  while `importlib.metadata` sees only the interpreter's own path: a `*.dist-info` anywhere in
  the repository cannot register or replace one. The repository root goes on `sys.path` only
  after plugins are loaded (`python -I` keeps it off until then, so a `pytest.py`,
  `sitecustomize.py` or `.pth` there is never run by start-up), and so do its import roots.
- Bytecode: `sys.pycache_prefix` is a fresh empty directory, so no `__pycache__` in the
  repository (pytest's rewritten test modules included) is ever read.
- Results: written to a duplicate of the original stdout pipe, each line prefixed with the
  nonce; fd 1 then points at stderr. A line the tested code prints, or writes to that pipe or
  to any file, is not a result unless it carries the nonce, which exists only in this process's
  memory. Code under test runs in this same process and can still reach it (see grading.py).

Other decisions:
- The alarm raises a BaseException subclass, so `except Exception` in a test cannot swallow it;
  pytest reports it as that test's failure and goes on to the next test.
- `--continue-on-collection-errors`: a file that fails to collect (a test of a function the fix
  adds) leaves the tests of the other files running, as their own results; otherwise pytest
  runs nothing and mining would count them as failing before the fix.
- `max_lines` (task generation) also stops a test after that many executed lines of Python,
  counted by a trace function: a budget that, unlike the clock, gives the same verdict on a
  loaded machine, so which mutants count as hanging never depends on the load.
- Only the standard library and pytest are used: this file runs with the sandbox's interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tarfile
import tempfile
from typing import Any


class TestTimeout(BaseException):
    """Raised by the per-test alarm."""


def _message(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
    return text[-500:]


def make_recorder(
    pytest: Any,
    emit: Any,
    wanted: set[str] | None,
    timeout_s: float,
    max_lines: int = 0,
    on_plugins_loaded: Any = None,
) -> Any:
    """The recording plugin; `wanted` None keeps every collected item."""

    class Recorder:
        def __init__(self) -> None:
            self.phases: dict[str, dict[str, Any]] = {}
            self.timed_out: set[str] = set()
            self.current = ""
            self.collect_errors: dict[str, str] = {}
            self.written: set[str] = set()

        @pytest.hookimpl(tryfirst=True)
        def pytest_load_initial_conftests(self) -> None:
            # Every plugin is loaded by now (conftests come next): see the module docstring.
            if on_plugins_loaded is not None:
                on_plugins_loaded()

        def _alarm(self, signum: int, frame: Any) -> None:
            self.timed_out.add(self.current)
            raise TestTimeout(f"test timed out after {timeout_s:g} s")

        def pytest_collection_modifyitems(self, session: Any, config: Any, items: list) -> None:
            keep = [i for i in items if wanted is None or i.nodeid in wanted]
            dropped = [i for i in items if wanted is not None and i.nodeid not in wanted]
            items[:] = keep
            if dropped:
                config.hook.pytest_deselected(items=dropped)

        def pytest_collectreport(self, report: Any) -> None:
            if report.failed:
                self.collect_errors[report.nodeid.split("::")[0]] = _message(report)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
            self.current = item.nodeid
            previous = signal.signal(signal.SIGALRM, self._alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item: Any) -> Any:
            if max_lines:
                sys.settrace(self._tracer(item.nodeid))
            try:
                yield
            finally:
                sys.settrace(None)

        def _tracer(self, nodeid: str) -> Any:
            count = 0

            def local(frame: Any, event: str, arg: Any) -> Any:
                nonlocal count
                if event == "line":
                    count += 1
                    if count > max_lines:
                        self.timed_out.add(nodeid)
                        raise TestTimeout(f"test ran more than {max_lines} lines")
                return local

            return lambda frame, event, arg: local

        def pytest_runtest_logreport(self, report: Any) -> None:
            rec = self.phases.setdefault(report.nodeid, {"status": "passed", "message": ""})
            if report.failed and rec["status"] not in ("failed", "error"):
                rec["status"] = "failed" if report.when == "call" else "error"
                rec["message"] = _message(report)
            elif report.skipped and rec["status"] == "passed":
                rec["status"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
                rec["message"] = _message(report)
            elif report.passed and hasattr(report, "wasxfail") and rec["status"] == "passed":
                rec["status"] = "xpassed"  # an xfail-marked test that passed (not strict)

        def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
            rec = self.phases.get(nodeid, {"status": "error", "message": "no report"})
            if nodeid in self.timed_out:
                rec = {"status": "timeout", "message": rec["message"]}
            self._write(nodeid, rec["status"], rec["message"])

        def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
            if wanted is None:
                for path, error in sorted(self.collect_errors.items()):
                    self._write(path, "error", f"collection failed: {error}")
                return
            for nodeid in sorted(wanted - self.written):
                error = self.collect_errors.get(nodeid.split("::")[0])
                if error is not None:
                    self._write(nodeid, "error", f"collection failed: {error}")

        def _write(self, nodeid: str, status: str, message: str) -> None:
            self.written.add(nodeid)
            emit({"id": nodeid, "status": status, "message": message})

    return Recorder()


def extract(stream: Any, dest: str) -> None:
    """Unpack the repository's tar stream into `dest` (the data is the grader's own copy)."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(dest, filter="tar")
        else:
            tar.extractall(dest)


def result_channel(nonce: str) -> Any:
    """A writer of nonce-tagged lines to the original stdout; fd 1 then points at stderr."""
    fd = os.dup(1)  # not inherited across exec
    os.dup2(2, 1)

    def emit(record: dict[str, Any]) -> None:
        data = (f"{nonce} {json.dumps(record)}\n").encode()
        while data:
            data = data[os.write(fd, data) :]

    return emit


def restrict_metadata(allowed: list[str]) -> Any:
    """Make `importlib.metadata` (where pytest and pluggy look up entry points) search only
    `allowed` by default; returns the function that undoes it."""
    import importlib.metadata as metadata

    original = metadata.distributions

    def distributions(**kwargs: Any) -> Any:
        kwargs.setdefault("path", allowed)
        return original(**kwargs)

    metadata.distributions = distributions  # type: ignore[assignment]

    def restore() -> None:
        metadata.distributions = original  # type: ignore[assignment]

    return restore


def _inside(path: str, root: str) -> bool:
    full = os.path.realpath(path or ".")
    return full == root or full.startswith(root + os.sep)


def main() -> int:
    stdin = sys.stdin.buffer
    spec = json.loads(stdin.readline())
    root = os.path.realpath(os.getcwd())
    extract(stdin, root)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    emit = result_channel(str(spec["nonce"]))
    for key in [k for k in os.environ if k.startswith("PYTEST_")]:
        del os.environ[key]
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.pycache_prefix = tempfile.mkdtemp(prefix="saorl-pyc-")
    env_path = [p for p in sys.path if p and not _inside(p, root)]
    restore = restrict_metadata(env_path)

    roots = [os.path.normpath(os.path.join(root, r)) for r in spec.get("paths", [])]

    def on_plugins_loaded() -> None:
        restore()
        # As `python -m pytest` with the repository installed editable: the repository and
        # its import roots (`src`) come first.
        for path in reversed(list(dict.fromkeys([root, *roots]))):
            if _inside(path, root) and path not in sys.path:
                sys.path.insert(0, path)

    import pytest

    ids = set(spec["ids"])
    wanted = None if spec.get("all") else ids
    files = sorted({i.split("::")[0] for i in ids if os.path.isfile(i.split("::")[0])})
    if not files:
        print("none of the test files exist", file=sys.stderr)
        return 4
    config = spec.get("config")
    if config:
        config = os.path.join(root, config)
    else:
        config = os.path.join(tempfile.mkdtemp(prefix="saorl-cfg-"), "pytest.ini")
        with open(config, "w", encoding="utf-8") as f:
            f.write("[pytest]\n")
    recorder = make_recorder(
        pytest,
        emit,
        wanted,
        float(spec["timeout_s"]),
        int(spec.get("max_lines", 0)),
        on_plugins_loaded,
    )
    args = [
        *files,
        "-c",
        config,
        "--rootdir",
        root,
        "--confcutdir",
        root,
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=short",
        "--continue-on-collection-errors",
    ]
    try:
        return int(pytest.main(args, plugins=[recorder, *map(str, spec.get("plugins", []))]))
    finally:
        restore()


if __name__ == "__main__":
    sys.exit(main())

"""Runs INSIDE the sandbox (as `python -I -B -c <this source>`): pytest on chosen test ids.

Reads a JSON spec on stdin: `{"ids": [...], "out": "FILE", "timeout_s": T, "autoload": bool,
"max_lines": N}`.
Collects the files those ids live in, keeps only the wanted items, runs them with a per-test
alarm of `timeout_s`, and appends one JSON line per finished test to `out` as it goes (so a run
killed by the outer wall-clock limit still reports every test that finished):
`{"id": ..., "status": "passed|failed|error|skipped|xfailed|timeout", "message": ...}`.

Decisions:
- `python -I` keeps the work dir off `sys.path` until pytest is imported: a `pytest.py` the agent
  wrote cannot stand in for pytest. The repository root is then put first on `sys.path`, as
  `python -m pytest` would.
- The alarm raises a BaseException subclass, so `except Exception` in a test cannot swallow it;
  pytest reports it as that test's failure and goes on to the next test.
- `max_lines` (task generation) also stops a test after that many executed lines of Python,
  counted by a trace function: a budget that, unlike the clock, gives the same verdict on a
  loaded machine, so which mutants count as hanging never depends on the load.
- Plugin auto-loading (the venv's entry points) is off unless asked: generated tasks need none,
  and loading them costs most of a run's start-up; SWE-bench repositories may rely on theirs.
- Only the standard library and pytest are used: this file runs with the sandbox's interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any


class TestTimeout(BaseException):
    """Raised by the per-test alarm."""


def _message(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
    return text[-500:]


def make_recorder(
    pytest: Any, out: Any, wanted: set[str], timeout_s: float, max_lines: int = 0
) -> Any:
    class Recorder:
        def __init__(self) -> None:
            self.phases: dict[str, dict[str, Any]] = {}
            self.timed_out: set[str] = set()
            self.current = ""
            self.collect_errors: dict[str, str] = {}
            self.written: set[str] = set()

        def _alarm(self, signum: int, frame: Any) -> None:
            self.timed_out.add(self.current)
            raise TestTimeout(f"test timed out after {timeout_s:g} s")

        def pytest_collection_modifyitems(self, session: Any, config: Any, items: list) -> None:
            keep = [i for i in items if i.nodeid in wanted]
            dropped = [i for i in items if i.nodeid not in wanted]
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

        def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
            rec = self.phases.get(nodeid, {"status": "error", "message": "no report"})
            if nodeid in self.timed_out:
                rec = {"status": "timeout", "message": rec["message"]}
            self._write(nodeid, rec["status"], rec["message"])

        def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
            for nodeid in sorted(wanted - self.written):
                error = self.collect_errors.get(nodeid.split("::")[0])
                if error is not None:
                    self._write(nodeid, "error", f"collection failed: {error}")

        def _write(self, nodeid: str, status: str, message: str) -> None:
            self.written.add(nodeid)
            out.write(json.dumps({"id": nodeid, "status": status, "message": message}) + "\n")
            out.flush()

    return Recorder()


def main() -> int:
    spec = json.loads(sys.stdin.read())
    if not spec.get("autoload", False):
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest

    root = os.getcwd()
    sys.path.insert(0, root)
    wanted = set(spec["ids"])
    files = sorted({i.split("::")[0] for i in wanted if os.path.isfile(i.split("::")[0])})
    with open(spec["out"], "w", encoding="utf-8") as out:
        if not files:
            print("none of the test files exist")
            return 4
        recorder = make_recorder(
            pytest, out, wanted, float(spec["timeout_s"]), int(spec.get("max_lines", 0))
        )
        args = [*files, "-p", "no:cacheprovider", "--rootdir", root, "-q", "--tb=short"]
        return int(pytest.main(args, plugins=[recorder]))


if __name__ == "__main__":
    sys.exit(main())

"""Run untrusted code (a model's tool calls) contained: no network, no host files, and bounded
wall time, CPU, memory, processes and output.

    result = run_python("print(2 + 2)")        # ExecResult(status="ok", stdout="4\\n", ...)
    text = result.to_observation(max_chars=2000)

Imports neither torch nor `saorl.envs`, so a process that only runs tools stays light.

Modules:
- `runner.py`: `run`, `run_python`, `arun`, `arun_python`; backend detection, concurrency;
- `process.py`: `Limits`, `ExecResult`; one process tree started, pumped, killed, classified;
- `bwrap.py`: the bubblewrap command line (namespaces, mounts, environment);
- `cgroup.py`: the per-call `pids` + `memory` cgroups;
- `output.py`: bounded capture of stdout/stderr (head and tail kept);
- `tree.py`: walking and removing directory trees that sandboxed code wrote.
"""

from saorl.sandbox.output import middle_truncate
from saorl.sandbox.process import ExecResult, Limits, SandboxError, Status
from saorl.sandbox.runner import (
    Backend,
    SandboxInfo,
    arun,
    arun_python,
    run,
    run_python,
    sandbox_info,
    set_max_concurrency,
)

__all__ = [
    "Backend",
    "ExecResult",
    "Limits",
    "SandboxError",
    "SandboxInfo",
    "Status",
    "arun",
    "arun_python",
    "middle_truncate",
    "run",
    "run_python",
    "sandbox_info",
    "set_max_concurrency",
]

"""The coding-agent environment (`env.name = "swe"`): repositories with failing tests.

Modules, in the order a task flows through them:
- `gen/`: generated tasks (template modules as package data, a bug injected by AST mutation,
  validated in the sandbox);
- `swebench.py`: SWE-bench-format JSON lines against local repository checkouts;
- `task.py`: `SweTask`, what both sources produce;
- `workspace.py`: snapshots, per-episode copies and the agent's diff;
- `tools.py`, `sandbox_tools.py`: the agent's tools (bash, view, str_replace, create, submit);
- `env.py`: `SweEnv`, one episode;
- `grading.py`, `pytest_runner.py`: FAIL_TO_PASS / PASS_TO_PASS grading in a fresh sandbox;
- `spec.py`: the `EnvSpec` (`saorl.envs.base`) that `saorl.envs.factory.build_env` returns
  for `env.name = "swe"`.
"""

"""mini-swe-agent, unmodified, as saorl's agent program on coding tasks (docs/mini-swe-agent.md).

A script for mini-swe-agent's own venv, never imported by saorl: it needs only the standard
library and mini-swe-agent (saorl, torch and their pins are not installed there). saorl gives
its path to every command agent on coding tasks as SAORL_MINISWE_RUNNER, so a config names it
without knowing where saorl is installed (examples/swe_mini_agent.toml):

    [env.agent]
    command = '.venv-miniswe/bin/python "$SAORL_MINISWE_RUNNER" swebench.yaml x.y=1'

Its arguments (`swebench.yaml x.y=1`, optional) are mini-swe-agent's config specs, as its `-c`
takes them (a YAML file, a built-in config's name, or `key.path=value`), merged in order; as
with `-c`, giving any replaces the default, its SWE-bench config `swebench.yaml`. Then saorl's
settings are merged over them:
- the model is saorl's training endpoint: litellm's `openai/<served name>` with the episode's
  base URL and key (from OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL); cost tracking and the
  cost limit are off (a local policy has no price) and litellm reads its bundled cost map;
- the environment is `SaorlShellEnvironment` below, whatever the configs name: every command
  goes to saorl, which runs it in its sandbox over the task's repository copy (SAORL_SHELL, a
  unix socket). No command of the model runs on this host;
- mini-swe-agent's global config dir is `mini-swe-agent/` in the run folder's agents/ folder
  (SAORL_AGENT_HOME; outside a training run, the episode's private folder SAORL_AGENT_DIR), so
  nothing is read from or written to the user's home.

The task comes as JSON on stdin (`problem_statement`). The last stdout line is
`{"exit_status": ..., "submitted": 0 or 1, "model_calls": n}`: saorl grades the repository copy
after this exits, and that grade is the reward. An error inside mini-swe-agent (the endpoint
refusing a prompt past the context, say) ends the run with that error's name as its
exit_status; the copy is graded all the same.
"""

import sys

# Run as a script, its folder comes first on the import path: saorl's modules there (venv.py,
# git.py, ...) would shadow packages mini-swe-agent and litellm import.
if __name__ == "__main__" and sys.path:
    import os.path

    if os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]

import json
import os
import socket
import tempfile


def configure() -> None:
    """The environment mini-swe-agent and litellm read when they are imported."""
    home = os.environ.get("SAORL_AGENT_HOME") or os.environ.get("SAORL_AGENT_DIR")
    home = home or tempfile.mkdtemp(prefix="saorl-mini-")
    os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = os.path.join(home, "mini-swe-agent")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the prices
    # A failed call is retried once, not 10 times over minutes: the endpoint is local.
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")


def ask_saorl(command: str) -> dict:
    """One command run by saorl in its sandbox: `{"output", "returncode", "exception_info"}`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ["SAORL_SHELL"])
        sock.sendall(json.dumps({"command": command}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("saorl closed the shell before answering")
            data += chunk
    return json.loads(data)


def shell_environment() -> type:
    """`SaorlShellEnvironment`: mini-swe-agent's local environment, except that each command
    runs in saorl's sandbox (the repository at /testbed, its own cwd); submission works as in
    every mini environment. Defined on first use: mini-swe-agent is imported only here."""
    from minisweagent.environments.local import LocalEnvironment

    class SaorlShellEnvironment(LocalEnvironment):
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
            output = ask_saorl(action.get("command", ""))
            self._check_finished(output)  # COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT ends the run
            return output

    return SaorlShellEnvironment


def saorl_settings() -> dict:
    key = os.environ["OPENAI_API_KEY"]
    base_url = os.environ["OPENAI_BASE_URL"]
    return {
        "model": {
            "model_name": "openai/" + os.environ.get("OPENAI_MODEL", "policy"),
            "model_kwargs": {"api_base": base_url, "api_key": key},
            "cost_tracking": "ignore_errors",
        },
        "agent": {"agent_class": "default", "cost_limit": 0},  # never asks a human to confirm
    }


def main(specs: list[str]) -> int:
    configure()  # before mini-swe-agent and litellm are imported: they read it at import
    import litellm
    from minisweagent.agents import get_agent
    from minisweagent.config import get_config_from_spec
    from minisweagent.models import get_model
    from minisweagent.utils.serialize import recursive_merge

    litellm.suppress_debug_info = True  # its provider banners on stdout, around the result line
    task = json.loads(sys.stdin.read())
    configs = [get_config_from_spec(spec) for spec in specs or ["swebench.yaml"]]
    config = recursive_merge(*configs, saorl_settings())
    model = get_model(config=config["model"])
    env_config = dict(config.get("environment") or {})
    env_config.pop("environment_class", None)  # saorl's shell, whatever a config names
    env = shell_environment()(**env_config)
    agent = get_agent(model, env, config["agent"])
    try:
        status = agent.run(task["problem_statement"]).get("exit_status", "")
    except Exception as e:  # mini re-raises what it cannot handle; the copy is graded anyway
        status = type(e).__name__
        print(f"mini-swe-agent stopped: {status}: {e}", file=sys.stderr)
    result = {"exit_status": status, "submitted": int(status == "Submitted")}
    print(json.dumps({**result, "model_calls": agent.n_calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

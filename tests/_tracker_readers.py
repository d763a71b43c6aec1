"""Read back what the trackers wrote, with each tool's own reader where it has one.

- TensorBoard: `EventAccumulator`, TensorBoard's reader (it applies `purge_step`).
- W&B offline runs: wandb ships no reader for its `.wandb` files, so `wandb_history` parses the
  container (a LevelDB-style log: 7-byte file header, 32 KiB blocks, records of a 7-byte header
  `crc32 | length | type` and their data, CRC-checked) and decodes each record with wandb's own
  protobuf (`wandb.proto.wandb_internal_pb2.Record`).
- MLflow: `MlflowClient` on the run's tracking URI.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def metric_series(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """`{key: {step: value}}` of the numeric, non-null values of metrics.jsonl rows."""
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float):
                out.setdefault(key, {})[row["step"]] = float(value)
    return out


def tb_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """`{tag: {step: value}}` of every scalar in a TensorBoard log directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tb_texts(log_dir: Path, tag: str) -> dict[int, str]:
    """`{step: text}` of a text summary (`add_text(tag, ...)`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode()
        for e in acc.Tensors(f"{tag}/text_summary")
    }


def _records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    out, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the writer pads the tail of a block that cannot hold a header
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, "bad CRC"
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def wandb_offline_runs(run_dir: Path) -> list[Path]:
    """The `.wandb` files of a run directory's offline W&B runs, oldest first."""
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)


def wandb_history(path: Path) -> tuple[str, dict[int, dict[str, Any]]]:
    """`(run id, {step: {key: value}})` of one `.wandb` file (values as W&B stored them)."""
    from wandb.proto import wandb_internal_pb2

    run_id, history = "", {}
    for data in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {
                (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                for i in record.history.item
            }
            history.setdefault(int(items.pop("_step")), {}).update(items)
    return run_id, history


def mlflow_series(run_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    """`[(step, value)]` of one MLflow metric of a run in the run directory's local store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlruns' / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))

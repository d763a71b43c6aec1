"""Experiment trackers named by `run.trackers`: TensorBoard, Weights & Biases, MLflow.

Each receives every numeric value of every `metrics.jsonl` row (same keys, the row's `step` as
the global step; null values are skipped), the config once, and the sample dumps of
`saorl.monitoring.samples` as a table. `run_dir/metrics.jsonl` stays the record of the run; trackers
are views of it.

- `tensorboard`: event files in `run_dir/tensorboard/`, tensorboardX's protobufs written
  synchronously (`TensorBoardTracker`); tensorboardX is a base dependency (~4 MB, where the
  `tensorboard` package, needed only to view them, is ~55 MB). The config is a text summary
  (`config`), samples a text summary per dump (`samples`).
- `wandb`: `wandb.init(project=run.project, name=run.name, dir=run_dir, config=...)`;
  `WANDB_MODE` (e.g. `offline`), `WANDB_ENTITY` and the login are wandb's own. Samples are a
  `wandb.Table` under `samples`.
- `mlflow`: the server in `MLFLOW_TRACKING_URI`, else a local store,
  `sqlite:///run_dir/mlruns/mlflow.db` with artifacts in `run_dir/mlruns/artifacts`; experiment
  `run.project`, run name `run.name`. The config is flattened into params (`section.field`) and
  stored as `config.toml`; each sample dump is an artifact `samples/step_NNNNNN.json`.

Resuming (`saorl train --resume`) continues the same tracker runs where it can; the ids are kept
in `run_dir/trackers.json`. The steps after the checkpoint were logged once already and are
logged again:

- TensorBoard: same log directory, a new event file that starts with a restart marker at
  `checkpoint + 1` (what tensorboardX's `purge_step` writes): TensorBoard drops the first
  copies of the redone steps and shows the new ones.
- W&B: same run (`id=`, `resume="allow"`). W&B steps only move forward: a value logged at a
  step below the run's current one is dropped with a warning, so W&B keeps the first values of
  the redone steps and records new ones from the step after the last one the interrupted run
  logged.
- MLflow: same run when its id is found at the tracking URI (else a new one). Metric history is
  append-only: the redone steps hold both values. Params are logged once, by the first run.

Every tracker package is imported only when named; `check_trackers` imports them before a run
starts, so a missing one is a config error (exit code 2) naming `pip install 'saorl[tracking]'`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from saorl.config import Config, ConfigError, config_to_toml
from saorl.config.base import leaf_values
from saorl.security.safe_io import make_dir, open_write, write_atomic

TRACKERS_FILE = "trackers.json"
INSTALL_HINT = "pip install 'saorl[tracking]'"
# Columns of the samples table (wandb.Table); samples.jsonl rows hold these and more.
SAMPLE_COLUMNS = (
    "step",
    "index",
    "reward",
    "staleness",
    "stop_reason",
    "advantage_mean",
    "transcript",
)


def mlflow_key(key: str) -> str:
    """`key` with every character MLflow refuses in a metric name (all but letters, digits,
    `_ - . : /` and spaces) replaced by `_`: a reward function's own metric names (a verl dict's
    keys) can hold any character, and one refused name fails the whole batch."""
    return re.sub(r"[^\w\-. :/]", "_", key, flags=re.ASCII)


_PACKAGES = {"tensorboard": ("tensorboardX",), "wandb": ("wandb",), "mlflow": ("mlflow",)}


class Tracker(Protocol):
    """One experiment tracker."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None: ...

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to continue the same tracker run (`trackers.json`)."""
        ...

    def close(self, ok: bool = True) -> None: ...


def _packages(name: str) -> tuple[str, ...]:
    if name == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        return ("mlflow", "sqlalchemy", "alembic")  # the local sqlite store needs both
    return _PACKAGES[name]


def check_trackers(names: Sequence[str]) -> None:
    """Import the packages of the named trackers; a missing one is a ConfigError with the hint."""
    for name in names:
        for package in _packages(name):
            try:
                importlib.import_module(package)
            except ImportError as exc:
                raise ConfigError(
                    f"run.trackers names {name!r}, which needs the {package!r} package "
                    f"({exc}): {INSTALL_HINT}, or remove {name!r} from run.trackers"
                ) from None


def open_trackers(cfg: Config, run_dir: Path, resume_step: int | None) -> list[Tracker]:
    """The trackers `cfg.run.trackers` names, opened for `run_dir`.

    `resume_step` is the step of the checkpoint a resumed run continues from (None: a new run).
    """
    check_trackers(cfg.run.trackers)
    run_dir = Path(run_dir)
    path = run_dir / TRACKERS_FILE
    stored: dict[str, Any] = {}
    if resume_step is not None and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = {}  # unreadable: the trackers start new runs rather than fail the resume
        stored = stored if isinstance(stored, dict) else {}
    opened: list[Tracker] = []
    try:
        for name in cfg.run.trackers:
            prior = stored.get(name) if isinstance(stored.get(name), dict) else None
            if name == "tensorboard":
                opened.append(TensorBoardTracker(run_dir, cfg, resume_step))
            elif name == "wandb":
                opened.append(WandbTracker(run_dir, cfg, prior))
            elif name == "mlflow":
                opened.append(MlflowTracker(run_dir, cfg, prior))
            else:
                raise ConfigError(f"run.trackers: unknown tracker {name!r}")
    except BaseException:
        for t in opened:
            t.close(ok=False)
        raise
    states = {name: t.state() for name, t in zip(cfg.run.trackers, opened, strict=True)}
    write_atomic(path, json.dumps({**stored, **states}, indent=2) + "\n")
    return opened


def flat_config(cfg: Config) -> dict[str, Any]:
    """`{"section.field": value}` with lists and tables as JSON text (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in leaf_values(cfg).items():
        plain = isinstance(value, str | int | float | bool) or value is None
        out[key] = value if plain else json.dumps(value)
    return out


def render_transcript(sample: Mapping[str, Any]) -> str:
    """The prompt and every turn of a sample as plain text, each under a `[role]` line."""
    parts = [f"[prompt]\n{sample['prompt']}"]
    parts += [f"[{turn['role']}]\n{turn['text']}" for turn in sample["turns"]]
    return "\n".join(parts)


def _table_row(sample: Mapping[str, Any]) -> list[Any]:
    adv = sample.get("batch_advantage", {}).get("mean")
    return [
        sample["step"],
        sample["index"],
        sample["reward"],
        sample["staleness"],
        sample["stop_reason"],
        adv,
        render_transcript(sample),
    ]


class TensorBoardTracker:
    """Event files in `run_dir/tensorboard/`: tensorboardX's summaries, written synchronously.

    tensorboardX's own SummaryWriter queues events for a background thread that writes them
    every two minutes, and its flush does not wait for that queue: a killed run would lose steps
    its checkpoint covers, which a resume does not redo. Each event here is written and flushed
    (not fsynced) before `log_metrics` returns, like a metrics.jsonl line.
    """

    def __init__(self, run_dir: Path, cfg: Config, resume_step: int | None) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import masked_crc32c
        from tensorboardX.summary import text

        self._event = Event
        self._summary = Summary
        self._crc = masked_crc32c
        self._text = text
        self.log_dir = Path(run_dir) / "tensorboard"
        make_dir(self.log_dir, "TensorBoard folder")
        # TensorBoard reads a directory's event files in name order: time, host, then the step
        # this writer starts after, so a resume in the same second still sorts after its run.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
        self._file = open_write(self.log_dir / f"{name}.{resume_step or 0:09d}", "ab")
        self._write(Event(file_version="brain.Event:2"))
        if resume_step is not None:
            # The steps after the checkpoint are logged again: a restart marker at the first of
            # them makes TensorBoard's reader drop the earlier events at steps >= it.
            start = SessionLog(status=SessionLog.START)
            self._write(Event(step=resume_step + 1, session_log=start))
        config = text("config", _indented(config_to_toml(cfg)))
        self._write(Event(step=resume_step or 0, summary=config))

    def _write(self, event: Any) -> None:
        """One TFRecord (length, its CRC, the event, its CRC), flushed."""
        event.wall_time = time.time()
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        crc = self._crc
        self._file.write(
            header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data))
        )
        self._file.flush()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # Tags exactly as the metrics.jsonl keys (tensorboardX's scalar() would rewrite some).
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        summary = self._summary(value=values)
        self._write(self._event(step=step, summary=summary))

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        blocks = []
        for s in samples:
            adv = s.get("batch_advantage", {}).get("mean")
            blocks.append(
                f"**sample {s['index']}**: reward {s['reward']}, staleness {s['staleness']}, "
                f"stop {s['stop_reason']}, batch advantage mean {adv}\n\n"
                + _indented(render_transcript(s))
            )
        self._write(self._event(step=step, summary=self._text("samples", "\n\n".join(blocks))))

    def state(self) -> dict[str, Any]:
        return {"log_dir": str(self.log_dir)}

    def close(self, ok: bool = True) -> None:
        self._file.close()


def _indented(text: str) -> str:
    """A Markdown code block by indentation: backticks in the text cannot end it early."""
    return "\n".join("    " + line for line in text.splitlines())


class WandbTracker:
    """A W&B run under `run_dir/wandb/`; WANDB_MODE=offline keeps it on disk."""

    def __init__(self, run_dir: Path, cfg: Config, prior: Mapping[str, Any] | None) -> None:
        import wandb

        self._wandb = wandb
        kwargs: dict[str, Any] = {
            "project": cfg.run.project,
            "name": cfg.run.name,
            "dir": str(run_dir),
            "config": cfg.model_dump(mode="json"),
        }
        if prior and prior.get("id"):
            # A resumed run's config may differ (e.g. more total_steps): allow the update.
            kwargs.update(id=prior["id"], resume="allow", allow_val_change=True)
        try:
            self.run = wandb.init(**kwargs)
        except wandb.errors.Error as exc:
            raise ConfigError(
                f"run.trackers 'wandb': W&B could not start a run ({exc}); log in (`wandb "
                "login` or WANDB_API_KEY) or set WANDB_MODE=offline"
            ) from exc

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        table = self._wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=[_table_row(s) for s in samples]
        )
        self.run.log({"samples": table}, step=step)

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id}

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class MlflowTracker:
    """An MLflow run through `MlflowClient` (no global active run: a caller's own stays put)."""

    def __init__(self, run_dir: Path, cfg: Config, prior: Mapping[str, Any] | None) -> None:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:
            store = Path(run_dir).resolve() / "mlruns"
            make_dir(store, "MLflow store")
            uri = f"sqlite:///{store / 'mlflow.db'}"
            # Otherwise artifacts land in ./mlruns of whatever the current directory is.
            artifacts = (store / "artifacts").as_uri()
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.run.project)
        exp_id = (
            exp.experiment_id
            if exp
            else self.client.create_experiment(cfg.run.project, artifact_location=artifacts)
        )
        self.run_id = None
        if prior and prior.get("run_id") and prior.get("tracking_uri") == uri:
            try:
                self.run_id = self.client.get_run(prior["run_id"]).info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            except MlflowException:
                self.run_id = None  # gone from this store: start a new run
        if self.run_id is None:
            self.run_id = self.client.create_run(exp_id, run_name=cfg.run.name).info.run_id
            self._log_config(cfg)

    def _log_config(self, cfg: Config) -> None:
        from mlflow.entities import Param

        # MLflow refuses values over 6000 characters (a long system prompt); config.toml,
        # logged just below, holds them whole.
        params = [Param(k, str(v)[:6000]) for k, v in flat_config(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, config_to_toml(cfg), "config.toml")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        # log_table needs pandas, which mlflow-skinny does not bring: a JSON artifact instead.
        self.client.log_dict(
            self.run_id, {"step": step, "samples": list(samples)}, f"samples/step_{step:06d}.json"
        )

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def close(self, ok: bool = True) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")

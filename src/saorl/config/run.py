"""The `[run]` section: steps, seeds, evaluation, checkpoints, logging and trackers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section


class RunConfig(_Section):
    """Run bookkeeping: where outputs go, how long, how often to evaluate and save."""

    name: str = Field("default", description="run directory name under output_dir")
    output_dir: str = Field("runs", description="directory holding run directories")
    seed: int = Field(0, description="global seed for torch, sampling and data order")
    total_steps: int = Field(
        1000, ge=1, description="policy optimizer steps, critic warm-up steps included"
    )
    eval_every: int = Field(
        100, ge=0, description="optimizer steps between evaluations; 0 = only at start and end"
    )
    eval_samples: int = Field(
        4,
        ge=1,
        description="samples per held-out problem for eval/accuracy (at rollout.temperature, "
        "like the paper's avg@k); eval/accuracy_greedy is logged too",
    )
    checkpoint_every: int = Field(
        200, ge=0, description="optimizer steps between checkpoints; 0 = only at the end"
    )
    keep_last_checkpoints: int = Field(
        3,
        ge=0,
        description="checkpoints kept in run_dir/checkpoints (the newest; each with its "
        "Hugging Face copy); 0 = keep every one",
    )
    save_hf: bool = Field(
        True,
        description="each checkpoint also writes the policy in Hugging Face format "
        "(safetensors, config, tokenizer, chat template) to checkpoints/step_N.hf/, loadable by "
        "transformers, vLLM and saorl eval; final/ is written either way",
    )
    stop_timeout_s: float = Field(
        300.0,
        ge=0,
        description="after SIGTERM or Ctrl-C the run finishes its step and saves a checkpoint; "
        "if that takes longer than this it exits without one (0 = no limit; a second signal "
        "always stops at once)",
    )
    concurrency: Literal["threads", "sync", "process"] = Field(
        "threads",
        description="threads = rollout workers and learner run concurrently; sync = generate "
        "then train; process = concurrently, each rollout worker in a child process of its "
        "own (no Ray; weights shared through memory), so its decoding does not hold the "
        "learner's interpreter lock (HF engine; docs/performance.md)",
    )
    deterministic: bool = Field(
        False,
        description="bit-exact reruns: rollouts and updates in a fixed order (concurrency "
        "'sync', set by this; staleness comes from learner.push_every, not from timing), "
        "deterministic torch algorithms; two runs of one config write the same metrics "
        "(timing columns aside) and weights (docs/algorithms.md)",
    )
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per thread of work")
    max_worker_restarts: int = Field(
        3,
        ge=0,
        description="times a crashed rollout worker (thread, child process or Ray actor) is "
        "rebuilt, its episodes re-issued, before the run fails",
    )
    progress: bool = Field(True, description="show a live progress display")
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="where metrics, the config and samples also go: 'tensorboard' "
        "(run_dir/tensorboard), 'wandb', 'mlflow' (pip install 'saorl[tracking]'); [] = "
        "metrics.jsonl only",
    )
    project: str = Field(
        "saorl",
        description="W&B project and MLflow experiment of the run; the tracker run is named "
        "run.name",
    )
    log_samples_every: int = Field(
        50,
        ge=0,
        description="optimizer steps between sample dumps to run_dir/samples.jsonl and the "
        "trackers (and one at the last step); 0 = never",
    )
    log_samples_count: int = Field(
        4, ge=1, description="trajectories per sample dump (the first ones of that step's batch)"
    )
    stop_on_collapse: bool = Field(
        False,
        description="end the run cleanly (checkpoint, summary.json, exit code 0) at the first "
        "step a [collapse] signal fires; false = log collapse/* and go on",
    )

    @model_validator(mode="before")
    @classmethod
    def _deterministic_is_sync(cls, data: Any) -> Any:
        # A fixed schedule is the synchronous one; threads interleave by timing.
        if isinstance(data, dict) and data.get("deterministic") in (True, "true"):
            if data.get("concurrency", "sync") != "sync":
                raise ValueError(
                    "run.deterministic = true runs rollouts and updates in a fixed order, which "
                    f"is run.concurrency = 'sync', not {data['concurrency']!r}: drop the "
                    "concurrency setting (deterministic sets it)"
                )
            data = {**data, "concurrency": "sync"}
        return data

    @field_validator("trackers")
    @classmethod
    def _check_trackers(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"names a tracker twice: {value}")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value or value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"must be a directory name without path separators, got {value!r}")
        return value

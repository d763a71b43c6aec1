"""A run folder is data: what its saved config names runs or is reached only when this command
trusts it.

`saorl eval RUN`, `saorl eval RUN/checkpoints/...` and `saorl train --resume RUN` (and
`saorl.evaluate`, `saorl.train(resume=)`) start from the run's `config.toml`. A run folder made
by someone else must not run their code although its checkpoint pickle is refused, so the
fields a saved config may set on its own are an allow-list (`ALLOWED`: numbers, switches,
names of built-in things, model folders, which are data: docs/security.md). Every other field
(`GATED`) names code, a command, an interpreter, a file or folder, an address or a package;
read from the saved file with a value other than its default (or a built-in name) it is
refused (a `ConfigError`, exit 2, naming the key, what it names and the flag), as transformers
does for `auto_map`, unless the command line passes `--trust-remote-code`
(`trust_remote_code=True` in the Python API) or sets that key itself. A config file given with
`--config`, overrides and the API's own arguments are the user's and are never refused.
`tests/unit/test_trust_fields.py` fails when a new config field is in neither list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import reduce
from pathlib import Path
from typing import Any

from saorl.config import Config, ConfigError, load_config, parse_override
from saorl.config.base import leaf_fields
from saorl.config.env import BUILTIN_ENVS, DATASET_PRESET_NAMES

FLAG = "--trust-remote-code"
# What `--trust-remote-code` adds to the command line's overrides: a model directory's code too.
TRUST_OVERRIDE = "model.trust_remote_code=true"

# Fields a saved config may set without trust: settings, data shapes and built-in names.
# model.name_or_path and critic.name_or_path name model folders: weights, config and tokenizer
# are data (a chat template is checked, a folder's own code needs model.trust_remote_code,
# which is gated). run.output_dir and run.name are unused on --resume and eval (the folder
# given is the one written). env.args reaches code only through a gated field (your own env,
# openenv, verifiers), else it is reasoning-gym's dataset settings.
_ALLOWED_BY_SECTION = {
    "model": "name_or_path hidden_size num_layers num_heads num_kv_heads intermediate_size arch "
    "num_experts num_experts_per_tok builtin_newlines max_seq_len dtype logprob_chunk_size "
    "lora_rank lora_alpha lora_dropout lora_target_modules lora_push device "
    "gradient_checkpointing attn_implementation",
    "rollout": "engine temperature top_p max_new_tokens score_truncated stop max_concurrent "
    "num_workers kv_cache forced_length forced_length_median forced_length_sigma "
    "vllm_gpu_memory_utilization vllm_kv_cache_gib vllm_enforce_eager "
    "vllm_recompute_kv_on_update vllm_tensor_parallel_size max_agent_processes",
    "algorithm": "name advantage policy_loss group_size group_sampling clip_eps_low clip_eps_high "
    "minibatches lm_loss_coef lm_loss_min_reward baseline_window baseline_scope "
    "baseline_global_window eps_low eps_high loss_agg gamma lambda_mode lambda_policy "
    "lambda_alpha lambda_critic skip_observations kl_coef kl_reference entropy_coef correction "
    "correction_low correction_high routing_replay group_std_norm",
    "critic": "lr name_or_path updates_per_step warmup_steps freeze value_clip grad_clip "
    "optimizer_offload weight_decay lora_rank lora_alpha concurrent device",
    "learner": "lr weight_decay grad_clip batch_size micro_batch_size micro_batch_tokens fsdp "
    "mixed_precision max_staleness push_every lr_warmup_steps max_nonfinite_in_a_row sft_steps "
    "sft_lr sft_batch_size",
    "env": "args num_digits eval_size seed max_turns max_tool_calls step_timeout_s "
    "reward_signature reward_weights reward_timeout_s use_tool tool_format tool_timeout_s "
    "problem_key answer_key answer_extractor reasoning_gym.datasets reasoning_gym.answer_format "
    "system_prompt instructions swe.source swe.num_tasks swe.command_timeout_s "
    "swe.test_timeout_s swe.grade_timeout_s swe.max_output_chars swe.task_envs "
    "swe.env_build_timeout_s swe.validate_tasks openenv.tool",
    "run": "name output_dir seed total_steps eval_every eval_samples checkpoint_every "
    "keep_last_checkpoints save_hf stop_timeout_s concurrency deterministic torch_threads "
    "max_worker_restarts progress project log_samples_every log_samples_count stop_on_collapse",
    "collapse": "window patience baseline_window reward_drop reward_noise eval_drop "
    "eval_min_best entropy_low entropy_high length_low length_high grad_norm_spike kl_spike "
    "kl_floor mismatch_floor spike_instant masked_frac_spike masked_frac_floor ess_low gap_rise "
    "critic_clip_x critic_ev_steps",
    "ray": "enabled num_cpus learner_ranks learner_num_cpus learner_num_gpus rollout_num_cpus "
    "rollout_num_gpus critic_actor critic_num_cpus critic_num_gpus critic_placement "
    "weight_sync start_timeout_s learner_resources rollout_resources critic_resources",
}
ALLOWED = frozenset(f"{s}.{n}" for s, names in _ALLOWED_BY_SECTION.items() for n in names.split())

# Fields refused from a saved config unless trusted, and what they name.
GATED = {
    "model.trust_remote_code": "the Python code of the model folder",
    "env.name": "Python code (your own environment)",
    "env.reward_fns": "Python code (reward functions)",
    "env.tools": "Python code (tool functions)",
    "env.agent.function": "Python code (an agent program)",
    "env.agent.command": "a shell command run every episode",
    "env.agent.tasks": "Python code (a task source)",
    "env.agent.env_passthrough": "variables of this host's environment an agent command gets",
    "env.agent.host": "the network address the agent endpoint listens on",
    "env.openenv.app": "Python code (an OpenEnv app)",
    "env.openenv.url": "a server saorl connects to",
    "env.verifiers.taskset": "Python code (a verifiers taskset)",
    "env.verifiers.python": "an interpreter run every episode",
    "env.swe.pip_args": "packages pip builds and installs",
    "env.swe.tasks": "a task file (repositories whose code runs when graded)",
    "env.swe.repos_root": "repositories whose code runs when graded",
    "env.swe.cache_dir": "a folder saorl writes",
    "env.dataset": "a data file",
    "env.eval_dataset": "a data file",
    "env.data_root": "a data folder",
    "critic.init_from": "a weights file",
    "learner.sft_cache": "a folder saorl reads weights from and writes",
    "run.trackers": "services the run's data is sent to",
    "ray.address": "a Ray cluster the run joins",
}


def _dataset_presets() -> tuple[str, ...]:
    return ("", *DATASET_PRESET_NAMES)


# Values of a gated field that name nothing outside saorl (besides its default).
_HARMLESS = {
    "env.name": lambda: BUILTIN_ENVS,
    "env.agent.tasks": lambda: BUILTIN_ENVS,
    "env.dataset": _dataset_presets,
    "env.eval_dataset": _dataset_presets,
    "run.trackers": lambda: ([], ["tensorboard"]),
}


def _default(key: str) -> Any:
    return leaf_fields(Config)[key].get_default(call_default_factory=True)


def code_references(cfg: Config) -> list[tuple[str, str, Any]]:
    """`(key, what, value)` for every gated field of `cfg` set to something it names."""
    refs = []
    for key, what in GATED.items():
        value = reduce(getattr, key.split("."), cfg)
        harmless = _HARMLESS.get(key, tuple)()
        if value != _default(key) and value not in harmless:
            refs.append((key, what, value))
    return refs


def check_saved_code(
    cfg: Config, saved: str | Path, given: Iterable[str], trust: bool, flag: str = FLAG
) -> None:
    """Raise `ConfigError` for a gated field `cfg` sets that came from the saved config `saved`
    and not from this command (`given`: the `section.field` keys it set); nothing when
    `trust`."""
    if trust:
        return
    given = set(given)
    for key, what, value in code_references(cfg):
        if key not in given:
            raise ConfigError(
                f"{key} = {value!r} comes from {saved}, a run folder's saved config, and names "
                f"{what}; a run folder's config names code, commands, files or addresses only "
                f"with {flag} (pass it if you trust the folder), or set {key} yourself"
            )


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The `section.field` keys of command-line overrides (`env.swe.tasks` for a nested one)."""
    return {".".join(parse_override(item)[:2]) for item in overrides}


def run_config(model: Path) -> str | None:
    """The config.toml of the run MODEL belongs to: RUN, RUN/final, RUN/checkpoints/X.pt or
    RUN/checkpoints/X.hf."""
    run = model
    if (model.suffix == ".pt" and model.is_file()) or (model.suffix == ".hf" and model.is_dir()):
        run = model.parent.parent
    elif model.name == "final" and not (model / "config.toml").is_file():
        run = model.parent
    saved = run / "config.toml"
    return str(saved) if saved.is_file() else None


def load_trusted(
    config_path: str | None, saved: str | None, overrides: Sequence[str], trust: bool
) -> Config:
    """The config of a command: `config_path` (the user's) if given, else the run's `saved`
    config.toml (checked by `check_saved_code`) or the defaults; `overrides` on top, and
    with `trust` `model.trust_remote_code=true`."""
    overrides = [*overrides, *([TRUST_OVERRIDE] if trust else [])]
    cfg = load_config(config_path or saved, overrides)
    if config_path is None and saved is not None:
        check_saved_code(cfg, saved, override_keys(overrides), trust)
    return cfg

"""The pure parts of benchmarks/bench_real_model.py: settings of each arm, the budget stop, the
figures and the report; the prompt TRL gets against the one saorl renders.

The benchmark itself trains a 135M-parameter model for minutes per arm; it is run by hand
(docs/performance.md). Checks that need TRL or the fetched model skip without them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_real_model as bench  # benchmarks/ is a folder of scripts, not a package

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "real_model.toml"


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "steps": 2000,
        "eval_every": 20,
        "eval_size": 100,
        "eval_samples": 4,
        "lora_rank": 0,
        "lora_lr_scale": 10.0,
        "set": [],
        "trl_minibatches": None,
        "trl_steps": None,
    }
    return argparse.Namespace(**{**base, **kw})


def _resolved(name: str, args: argparse.Namespace, tmp_path: Path) -> object:
    from saorl.api import make_config

    common = bench.saorl_overrides(args, tmp_path / "model", tmp_path / "runs", seed=3)
    base = make_config(CONFIG, common)
    return make_config(CONFIG, [*common, *bench.arm_overrides(name, args, base)])


def test_every_arm_resolves_from_the_shared_config(tmp_path: Path) -> None:
    args = _args(lora_rank=16)
    cfg = {name: _resolved(name, args, tmp_path) for name in bench.TRAINERS}
    assert cfg["sao"].algorithm.name == cfg["sao_lora"].algorithm.name == "sao"
    assert cfg["grpo"].algorithm.name == cfg["trl_grpo"].algorithm.name == "grpo"
    assert cfg["grpo_dis"].algorithm.name == "grpo_dis"
    for c in cfg.values():  # the shared model, held-out set and snapshots
        assert c.model.name_or_path == str(tmp_path / "model")
        assert (c.env.eval_size, c.run.eval_samples, c.run.seed) == (100, 4, 3)
        assert (c.run.checkpoint_every, c.run.keep_last_checkpoints) == (20, 0)
        assert c.run.eval_every == 0 and not c.run.save_hf
        assert c.env.reasoning_gym.datasets == ["chain_sum"] and c.rollout.temperature == 0.7
    # Only the LoRA arm has adapters, on the policy and the critic, at 10x the learning rates.
    assert cfg["sao"].model.lora_rank == cfg["sao"].critic.lora_rank == 0
    lora, sao = cfg["sao_lora"], cfg["sao"]
    assert lora.model.lora_rank == lora.critic.lora_rank == 16
    assert lora.learner.lr == pytest.approx(10 * sao.learner.lr)
    assert lora.critic.lr == pytest.approx(10 * sao.critic.lr)
    assert sao.learner.lr == cfg["grpo"].learner.lr == cfg["grpo_dis"].learner.lr


def test_the_lora_arm_needs_a_rank(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--lora-rank"):
        _resolved("sao_lora", _args(lora_rank=0), tmp_path)


def test_extra_overrides_reach_every_arm(tmp_path: Path) -> None:
    args = _args(set=["learner.lr=3e-6"])
    for name in ("sao", "grpo", "trl_grpo"):
        assert _resolved(name, args, tmp_path).learner.lr == 3e-6


def test_trl_settings_mirror_the_real_model_grpo_config(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    import bench_trl
    from trl import GRPOConfig

    cfg = _resolved("trl_grpo", _args(), tmp_path)
    settings = bench_trl.trl_settings(cfg, _args(), seed=3, out_dir=tmp_path)
    # Batches of 16 = 2 prompts x 8, in the grpo preset's 4 optimizer steps of 4 rows
    # (TRL needs whole groups per generated batch, not per optimizer step).
    assert settings["per_device_train_batch_size"] * settings["steps_per_generation"] == 16
    assert settings["steps_per_generation"] == cfg.algorithm.minibatches == 4
    assert settings["num_generations"] == 8
    assert settings["max_steps"] == 2000 * 4
    assert (settings["temperature"], settings["max_completion_length"]) == (0.7, 40)
    assert settings["learning_rate"] == cfg.learner.lr == 1e-5
    assert settings["warmup_steps"] == 0
    config = GRPOConfig(**settings)
    assert config.generation_batch_size == 16


def test_a_run_stops_when_its_next_step_would_end_past_the_budget() -> None:
    assert not bench.should_stop({}, 10.0)
    # Steps of 2 s: after step 4 (8 s) the next ends at ~10 s, the budget.
    assert not bench.should_stop({1: 2.0, 2: 4.0, 3: 6.0}, 10.0)
    assert bench.should_stop({1: 2.0, 2: 4.0, 3: 6.0, 4: 8.0}, 10.0)
    assert bench.should_stop({1: 12.0}, 10.0)  # past it already


def test_rows_of_a_growing_metrics_file_are_the_complete_lines() -> None:
    text = '{"step": 1, "time/wall_s": 2.0}\nnot json\n{"step": 2, "time/wa'
    assert bench.complete_rows(text) == [{"step": 1, "time/wall_s": 2.0}]
    assert bench.complete_rows("") == []


def test_the_budget_watcher_stops_the_run_it_watches(tmp_path: Path) -> None:
    # A real metrics file and a real signal, sent to this process: caught here as saorl's
    # StopSignals would catch it.
    import signal
    import threading

    run = tmp_path / "runs" / "sao"
    run.mkdir(parents=True)
    rows = [{"step": s, "time/wall_s": 3.0 * s, "perf/step_s": 3.0} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    try:
        done = threading.Event()
        watcher = threading.Thread(target=bench.watch_budget, args=(tmp_path / "runs", 5, 12, done))
        watcher.start()
        watcher.join(timeout=30)
        assert not watcher.is_alive()
    finally:
        signal.signal(signal.SIGTERM, old)
    assert got == [signal.SIGTERM]


CURVE = [
    {"step": 20, "train_s": 200.0, "accuracy": 0.22},
    {"step": 40, "train_s": 400.0, "accuracy": 0.31},
    {"step": 60, "train_s": 600.0, "accuracy": 0.28},
    {"step": 80, "train_s": 800.0, "accuracy": 0.34},
]
INITIAL = {"accuracy": 0.2}


def _run(curve: list[dict[str, float]], rss: float, steps: int) -> dict[str, object]:
    train_s = curve[-1]["train_s"]
    return {
        "curve": curve,
        "steps": steps,
        "train_s": train_s,
        "trajectories_per_s": 16 * steps / train_s,
        "peak_rss_mb": rss,
    }


def test_summary_adds_memory_and_step_time_to_the_times_to_target() -> None:
    runs = {
        "sao": [_run(CURVE, 4000.0, 80), _run(CURVE, 4200.0, 80), _run(CURVE, 3900.0, 80)],
        "trl_grpo": [_run(CURVE[:2], 2500.0, 40)],
    }
    out = bench.summarize(runs, INITIAL, target=0.3, budget_s=700.0)
    assert out["sao"]["peak_rss_mb"] == 4000.0  # median of the seeds
    assert out["sao"]["step_s"] == pytest.approx(10.0)
    assert out["sao"]["time_to_target_s"] == 400.0
    assert out["sao"]["time_to_sustained_target_s"] == 800.0  # 0.28 at 600 s dips below
    assert out["sao"]["accuracy_at_budget"] == 0.28
    assert out["trl_grpo"]["final_accuracy"] == 0.31
    assert not out["trl_grpo"]["covers_budget"]  # stopped at 400 s, before the 700 s budget
    met = bench.issue_targets(out)
    assert met["sao_final_accuracy_at_least_trl_grpo"] == [0.34, 0.31, True]
    assert met["sao_time_to_target_at_most_0.6x_trl_grpo"] == [1.0, False]


def test_the_target_is_the_start_plus_the_gain_unless_a_gain_is_zero() -> None:
    start = {"accuracy": 0.155}
    assert bench.resolve_target(argparse.Namespace(target=0.5, target_gain=0.1), start) == 0.255
    assert bench.resolve_target(argparse.Namespace(target=0.5, target_gain=0.0), start) == 0.5


def test_evaluation_noise_is_the_spread_of_repeats() -> None:
    assert bench.noise([0.2]) is None
    assert bench.noise([0.2, 0.2, 0.2]) == 0.0
    assert bench.noise([0.1, 0.3]) == pytest.approx(0.1414, abs=1e-4)


def _report(initial: float, trainers: dict[str, list[dict[str, object]]]) -> dict[str, object]:
    return {
        "benchmark": "real_model",
        "time": "t",
        "model": "smollm2-135m",
        "task": "chain_sum",
        "machine": {"load_average_at_start": 1.0},
        "workload": {
            "seeds": [0],
            "batch": 16,
            "eval_samples": 4,
            "eval_size": 100,
            "start_repeats": 1,
        },
        "initial": {"accuracy": initial},
        "start_noise": None,
        "runs": trainers,
    }


def test_finish_writes_the_table_json_and_plot(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    a = _report(0.2, {"sao": [_run(CURVE, 4000.0, 80)]})
    slower = [{**p, "train_s": 2 * p["train_s"]} for p in CURVE]  # 0.31 at 800 s
    b = _report(0.2, {"trl_grpo": [_run(slower, 2500.0, 80)]})
    import bench_trl

    merged = bench_trl.merge_reports([a, b], [Path("a.json"), Path("b.json")])
    out = tmp_path / "real_model.json"
    bench.finish(merged, target=0.3, budget_s=700.0, out=out)
    table = capsys.readouterr().out
    assert "peak RSS MB" in table and "sao" in table and "trl_grpo" in table
    saved = json.loads(out.read_text())
    assert saved["summary"]["trl_grpo"]["peak_rss_mb"] == 2500.0
    assert saved["targets"]["sao_reaches_target_before_trl_grpo"] == [400.0, 800.0, True]
    assert saved["targets"]["sao_time_to_target_at_most_0.6x_trl_grpo"] == [0.5, True]
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit, match="other weights"):
        bench_trl.merge_reports([a, _report(0.25, {})], [Path("a"), Path("c")])


def test_snapshots_of_trl_load_back_as_written(tmp_path: Path) -> None:
    import torch

    state = {"w": torch.arange(6.0).reshape(2, 3)}
    torch.save(state, tmp_path / "s.pt")
    got = bench.snapshot_state({"path": str(tmp_path / "s.pt"), "format": "trl"}, {})
    assert torch.equal(got["w"], state["w"])


class _Tasks:
    def score(self, problem: str, text: str) -> float:
        return float(text.strip().endswith(problem))


def test_trl_rewards_score_each_completion_on_its_own_problem() -> None:
    reward = bench.rg_reward(_Tasks(), ["12", "7"])
    completions = [
        [{"role": "assistant", "content": "The answer is 7"}],
        [{"role": "assistant", "content": "The answer is 12"}],
        "plain text 7",
    ]
    assert reward(completions, problem=[1, 0, 0], prompts=None) == [1.0, 1.0, 0.0]
    assert reward.__name__ == "rg_reward"


def _real_tokenizer() -> object:
    from saorl.models.fetch import cache_root
    from saorl.models.loading import _load_tokenizer

    folder = cache_root() / "smollm2-135m"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("smollm2-135m is not fetched (saorl model fetch smollm2-135m)")
    return _load_tokenizer(folder)


def test_trl_gets_the_prompt_ids_saorl_renders(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    from saorl.api import make_config
    from saorl.envs.factory import build_env
    from saorl.rollout.episode import ChatCodec

    tokenizer = _real_tokenizer()
    cfg = make_config(CONFIG, ["env.eval_size=4"])
    spec = build_env(cfg.env)
    problems, columns = bench.trl_dataset(spec.task, spec.make_env(), 6, seed=0)
    rng = random.Random(0)
    assert problems == [spec.task.sample(rng) for _ in range(6)]  # drawn as saorl draws them
    assert columns["problem"] == list(range(6))
    codec = ChatCodec(tokenizer)
    for problem, messages in zip(problems, columns["prompt"], strict=True):
        env = spec.make_env()
        assert messages == bench.opening_messages(env, problem)
        assert problem.prompt in messages[-1]["content"]
        saorl_ids = codec.prompt_ids(messages, None)  # what a rollout worker feeds the model
        # TRL 1.16's `GRPOTrainer._tokenize_prompts` for conversational prompts, no tools.
        trl_ids = tokenizer.apply_chat_template(
            conversation=[messages],
            tools=None,
            chat_template=None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"][0]
        assert list(trl_ids) == saorl_ids
        assert tokenizer.decode(saorl_ids).endswith("<|im_start|>assistant\n")


def _parse(monkeypatch: pytest.MonkeyPatch, *argv: str) -> argparse.Namespace:
    monkeypatch.setattr(sys, "argv", ["bench_real_model.py", *argv])
    return bench.parse_args()


def test_command_line_trainers_and_the_smoke_run(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _parse(monkeypatch)
    assert args.trainers == ["sao", "grpo", "grpo_dis", "trl_grpo"]
    assert (args.budget_s, args.eval_size, args.eval_samples) == (2700.0, 100, 4)
    assert _parse(monkeypatch, "--lora-rank", "8").trainers[-1] == "sao_lora"
    quick = _parse(monkeypatch, "--quick", "--steps", "6", "--set", "learner.lr=1e-6")
    assert (quick.steps, quick.eval_every, quick.eval_size, quick.eval_samples) == (6, 2, 8, 1)
    assert quick.set == ["rollout.max_new_tokens=8", "learner.lr=1e-6"]
    with pytest.raises(SystemExit):
        _parse(monkeypatch, "--trainers", "sao_lora")  # no --lora-rank
    with pytest.raises(SystemExit):
        _parse(monkeypatch, "--trainers", "sao,ppo")


def test_a_saorl_child_reports_the_start_instead_of_evaluating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from saorl.learner.learner import Learner

    monkeypatch.setattr(Learner, "evaluate", Learner.evaluate)  # restored after the test
    bench.skip_run_evaluations({"accuracy": 0.15})
    got = Learner.evaluate(object(), spec=None, tokenizer=None)
    assert got == {"eval/accuracy": 0.15, "eval/accuracy_greedy": 0.15}
    bench.skip_run_evaluations({"accuracy": 0.15, "accuracy_greedy": 0.2})
    assert Learner.evaluate(object(), None, None)["eval/accuracy_greedy"] == 0.2

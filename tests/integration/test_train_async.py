"""A few asynchronous SAO steps on a tiny model, end to end through `train_from_config`."""

from __future__ import annotations

import json
import math
import string

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, load_state_file
from saorl.corrections import lab_keys
from saorl.envs.arithmetic import ArithmeticTask
from saorl.loop import train_from_config
from tests.conftest import tiny_config

# A random-init model rarely emits EOS, and a turn cut off by its token budget gets reward 0
# without being graded. Stop strings covering most characters end turns early instead.
STOP_ON_MOST_CHARS = "rollout.stop=" + str(list(string.ascii_letters + string.digits))


@pytest.fixture
def varied_reward(monkeypatch):
    # A random-init model never solves addition, so all rewards would be 0 and every gradient
    # too. This reward depends on the sampled text, so advantages vary and every weight moves.
    monkeypatch.setattr(ArithmeticTask, "reward", staticmethod(lambda p, t: float(len(t) % 2)))


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("concurrency", ["threads", "sync"])
def test_async_steps_train_every_trainable_parameter(tmp_path, varied_reward, concurrency):
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "run.total_steps=4",
        "run.checkpoint_every=0",
        "learner.max_staleness=1",
        f"run.concurrency={concurrency}",
        STOP_ON_MOST_CHARS,
    )
    summary = train_from_config(cfg)
    run_dir = tmp_path / "default"
    ckpts = list_checkpoints(run_dir)
    first, last = load_state_file(ckpts[0]), load_state_file(ckpts[-1])
    assert first["step"] == 0 and last["step"] == 4
    # 1 critic warm-up step, then 3 policy updates.
    assert last["version"] == 3 == summary["policy_version"]

    for name, before in first["policy"].items():
        assert not torch.equal(before, last["policy"][name]), f"policy {name} did not change"
    frozen = [n for n in first["critic"] if ".self_attn." in n]
    assert frozen, "the tiny Qwen3 critic must have attention parameters"
    for name, before in first["critic"].items():
        after = last["critic"][name]
        if name in frozen:
            assert torch.equal(before, after), f"frozen critic {name} changed"
        else:
            assert not torch.equal(before, after), f"critic {name} did not change"

    rows = _metrics(run_dir)
    steps = [r for r in rows if "loss/value" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert "collapse" in summary  # the collapse detector's verdict (None: no collapse)
    for r in steps:
        assert r["async/staleness_max"] <= 1
        hist = [r[f"async/staleness_frac_{k}"] for k in (0, 1)]  # max_staleness = 1
        assert sum(hist) == pytest.approx(1.0)
        for k, v in r.items():
            # Only the critic warm-up step may leave the policy keys empty (null); the engine/
            # learner mismatch is null when no token of the batch came from the current version,
            # a gap bucket when no token fell in it.
            if v is None and not k.startswith(("mismatch/", "gap/k3_")):
                policy_keys = ("loss/policy", "dis/masked_frac", *lab_keys())
                assert r["learner/warmup"] == 1.0 and k in policy_keys, k
            elif v is not None:
                assert math.isfinite(v), k
    for key in ("loss/policy", "dis/masked_frac", "value/explained_variance"):
        assert key in steps[-1]
    assert (run_dir / "summary.json").exists()
    assert (run_dir / "report.png").stat().st_size > 0
    assert (run_dir / "final" / "config.json").exists()


def test_second_run_with_the_same_name_gets_its_own_directory(tmp_path, capsys):
    cfg = tiny_config(f"run.output_dir={tmp_path}", "run.total_steps=1", "run.eval_every=0")
    before = cfg.model_dump(), {s: getattr(cfg, s).model_fields_set for s in type(cfg).model_fields}
    first = train_from_config(cfg)
    second = train_from_config(cfg)
    # A run never writes to its config (docs/design.md section 4, rule 4).
    assert (cfg.model_dump(), {s: getattr(cfg, s).model_fields_set for s in before[1]}) == before
    assert first["run_dir"] == str(tmp_path / "default")
    assert second["run_dir"] == str(tmp_path / "default-1")
    assert "--resume" in capsys.readouterr().err
    for d in ("default", "default-1"):
        assert len(_metrics(tmp_path / d)) == 2  # the initial evaluation and one step


def test_tool_task_trains_through_the_agent_loop(tmp_path):
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "env.name=tool_arithmetic",
        "rollout.max_new_tokens=20",
        "model.max_seq_len=64",
        "learner.sft_steps=3",
        "run.total_steps=2",
        "run.eval_every=0",
    )
    summary = train_from_config(cfg)
    assert summary["steps"] == 2
    rows = [r for r in _metrics(tmp_path / "default") if "loss/value" in r]
    assert all("rollout/tool_calls_mean" in r for r in rows)
    assert "eval/tool_calls_mean" in _metrics(tmp_path / "default")[0]


def test_warmup_on_a_dataset_env_is_a_clear_error(tmp_path):
    from saorl.config import ConfigError

    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "env.name=math",
        f"env.dataset={data}",
        "env.eval_size=2",
        "learner.sft_steps=5",
    )
    cfg.model.max_seq_len = 256
    with pytest.raises(ConfigError, match=r"learner\.sft_steps"):  # the prompts fit: sft fails
        train_from_config(cfg)

"""`rollout.score_truncated`: a turn cut at its token budget goes to the reward functions as it
stands (as TRL scores truncated completions), or ends the episode unscored (the default)."""

from __future__ import annotations

import json
import queue
import random
import time
from pathlib import Path

import pytest
import torch

from saorl.config import load_config
from saorl.envs.factory import build_env
from saorl.evaluation.held_out import evaluate_policy, run_episodes
from saorl.models.loading import load_policy
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.pool import agent_limits
from saorl.rollout.worker import PromptFeed, RolloutWorker
from tests.conftest import tiny_config
from tests.integration.test_agent_loop import TEMPLATE, ScriptedEngine

REWARDS = """
def contains(completion, answer, **kwargs):
    return float(answer in completion)


def always(completions, **kwargs):  # TRL's batched form
    return [1.0 for _ in completions]
"""


def _task(tmp_path: Path, fn: str, *extra: str):
    (tmp_path / "rewards.py").write_text(REWARDS)
    rows = [{"prompt": f"q{i}", "answer": "42"} for i in range(20)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fn_ref = f"{tmp_path / 'rewards.py'}:{fn}"
    return [
        "env.name=math",
        "env.use_tool=false",
        "env.instructions=false",
        f"env.dataset={str(tmp_path / 'train.jsonl')!r}",
        f"env.reward_fns=[{fn_ref!r}]",
        "model.max_seq_len=64",
        *extra,
    ]


def _scored(score: bool) -> str:
    return f"rollout.score_truncated={str(score).lower()}"


@pytest.mark.parametrize("score", [False, True])
def test_a_cut_turn_is_scored_only_when_asked(tmp_path: Path, score: bool) -> None:
    cfg = load_config(None, _task(tmp_path, "contains", "rollout.max_new_tokens=6", _scored(score)))
    spec = build_env(cfg.env)
    limits = agent_limits(cfg, spec)
    assert limits.score_truncated is score
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    # The answer is right, but the turn runs past its 6 tokens: "42 and" is all there is.
    engine = ScriptedEngine(tok, ["42 and then some more"])
    out: queue.Queue = queue.Queue()
    feed = PromptFeed(spec.task, random.Random(0), 1, 1)
    worker = RolloutWorker(engine, feed, tok, out, spec.make_env, limits)
    worker.fill()
    deadline = time.monotonic() + 30
    while out.empty() and time.monotonic() < deadline:
        worker.step()
        time.sleep(0.005)
    traj = out.get_nowait()
    assert traj.stop_reason == "length" and tok.decode(traj.completion_ids) == "42 and"
    assert traj.reward == (1.0 if score else 0.0)
    assert ("reward/contains" in traj.info) is score


@pytest.mark.parametrize("score", [False, True])
def test_evaluation_scores_cut_answers_the_same_way(tmp_path: Path, score: bool) -> None:
    # A real model and engine: one token per turn, so every answer that is not EOS is cut.
    cfg = tiny_config(*_task(tmp_path, "always", "rollout.max_new_tokens=1", _scored(score)))
    torch.manual_seed(0)
    policy, tok = load_policy(cfg.model)
    spec = build_env(cfg.env)
    trajs = run_episodes(policy, tok, spec, list(spec.task.held_out) * 4, cfg, seed=0)
    cut = [t for t in trajs if t.stop_reason == "length"]
    assert cut and all(len(t.completion_ids) == 1 for t in cut)
    # `always` gives 1 to any text that reaches it; a cut answer reaches it only when scored.
    assert {t.reward for t in cut} == {1.0 if score else 0.0}
    if score:  # every episode reaches `always`, cut or not: avg@k and greedy are 1
        ev = evaluate_policy(policy, tok, spec, cfg, seed=0)
        assert ev["eval/accuracy"] == ev["eval/accuracy_greedy"] == 1.0

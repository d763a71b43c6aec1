"""env.name = "reasoning_gym": real reasoning-gym datasets (chain_sum, leg_counting), the
held-out set apart from training, scoring through each dataset's score_answer, the single-turn
and Python-tool episodes, the warm-up demonstrations and the config errors."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from saorl.config import ConfigError, EnvConfig, load_config
from saorl.envs.base import task_key
from saorl.envs.factory import build_env
from saorl.envs.reasoning_gym import RGEnv, RGTasks, opening_text, split_by_weight

rg = pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (the dev extra)")

# 1-digit chain sums of 2 terms: 200 possible questions, so the held-out set and the training
# items share questions unless they are kept apart.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _cfg(**fields: object) -> EnvConfig:
    base: dict[str, object] = {
        "name": "reasoning_gym",
        "reasoning_gym": {"datasets": ["chain_sum"]},
    }
    return EnvConfig(**{**base, **fields})


def test_held_out_is_disjoint_from_training_on_a_small_task_space() -> None:
    tasks = RGTasks({"chain_sum": {**SMALL, "size": 2000}}, eval_size=40, seed=7)
    held = {p.prompt for p in tasks.held_out}
    assert len(tasks.held_out) == 40 == len(held) == len({task_key(p) for p in tasks.held_out})
    # The training generator does produce held-out questions (a small space repeats them) ...
    ds = rg.create_dataset("chain_sum", **SMALL, size=2000, seed=7)
    raw = [ds[i]["question"] for i in range(2000)]
    assert held & set(raw)
    # ... but they are left out of the training items, which keep the rest.
    assert not held & {p.prompt for p in tasks.train}
    assert len(tasks.train) == sum(q not in held for q in raw)
    rng = random.Random(0)
    drawn = [tasks.sample(rng) for _ in range(3000)]
    assert not held & {p.prompt for p in drawn}
    assert len({p.prompt for p in drawn}) > 100  # the rest of the space is trained on
    assert all(p.dataset == "chain_sum" and p.prompt.endswith("=") for p in drawn)


def test_held_out_set_does_not_depend_on_training_or_its_size() -> None:
    a = RGTasks({"chain_sum": {"size": 50}}, eval_size=16, seed=3)
    b = RGTasks({"chain_sum": {"size": 5000}}, eval_size=16, seed=3, train=False)
    c = RGTasks({"chain_sum": {}}, eval_size=16, seed=4, train=False)
    assert [p.key for p in a.held_out] == [p.key for p in b.held_out]  # saorl eval == training
    assert [p.key for p in a.held_out] != [p.key for p in c.held_out]  # env.seed moves it
    with pytest.raises(ValueError, match="no training items"):
        b.sample(random.Random(0))


def test_training_items_follow_the_rng_and_the_dataset_settings() -> None:
    tasks = RGTasks({"chain_sum": {"min_terms": 3, "max_terms": 3}}, eval_size=8, seed=1)
    one = [tasks.sample(random.Random(5)).key for _ in range(3)]
    assert len(set(one)) == 1  # same rng state, same item
    p = tasks.sample(random.Random(6))
    assert p.row["metadata"]["num_terms"] == 3
    assert p.answer == str(eval(p.row["metadata"]["expression"]))


def test_scores_come_from_the_datasets_own_score_answer() -> None:
    tags = RGTasks({"chain_sum": SMALL, "leg_counting": {}}, eval_size=8, seed=0)
    plain = RGTasks({"chain_sum": SMALL}, eval_size=4, seed=0, answer_format="plain")
    chain = next(p for p in tags.held_out if p.dataset == "chain_sum")
    legs = next(p for p in tags.held_out if p.dataset == "leg_counting")
    reference = rg.get_score_answer_fn("chain_sum")
    cases = [
        (f"7 <answer>{chain.answer}</answer>", chain.answer),
        (f"<answer>{chain.answer}9</answer>", f"{chain.answer}9"),
        (f"<answer>0</answer> <answer>{chain.answer}</answer>", chain.answer),
        ("<answer> </answer>", ""),
    ]
    for text, answer in cases:
        assert tags.score(chain, text) == reference(answer, chain.row)
    assert tags.score(chain, f"<answer>{chain.answer}</answer>") == 1.0
    assert tags.score(chain, f"<answer>{chain.answer}9</answer>") == pytest.approx(
        len(chain.answer) / (len(chain.answer) + 1)
    )  # chain_sum's partial credit: the reference inside a longer answer
    assert tags.score(chain, chain.answer) == 0.0  # no <answer> tags: no answer
    assert tags.score(legs, f"<answer>{legs.answer}</answer>") == 1.0
    assert tags.score(legs, "<answer>-1</answer>") == 0.0
    p = plain.held_out[0]
    assert plain.score(p, f" {p.answer} ") == 1.0
    assert plain.score(p, f"<answer>{p.answer}</answer>") < 1.0


def test_last_number_takes_the_sentences_last_number() -> None:
    """env.reasoning_gym.answer_format = "last_number": how a small chat model answers ("The
    answer is 12.") is scored by the dataset's own scorer on the last number of the text."""
    tasks = RGTasks({"chain_sum": SMALL}, eval_size=8, seed=0, answer_format="last_number")
    p = next(q for q in tasks.held_out if not q.answer.startswith("-"))
    n = next(q for q in tasks.held_out if q.answer.startswith("-"))
    assert tasks.score(p, f"The final answer is {p.answer}.") == 1.0
    assert tasks.score(p, f"3 + 4 = 7, so it is {p.answer}") == 1.0
    assert tasks.score(p, f"It is {p.answer}, not 99.") == 0.0  # the last number counts
    assert tasks.score(n, f"That is {n.answer}.") == 1.0  # a minus sign belongs to it
    assert tasks.score(p, "I cannot tell.") == 0.0
    assert tasks.extract("1,234 and 5.5") == "5.5"
    assert tasks.extract("a total of 1,234") == "1234"
    assert tasks.answer_text(p) == p.answer  # demonstrations answer with the number alone


def test_two_datasets_split_the_held_out_set_and_training_by_weight() -> None:
    assert split_by_weight(10, [3, 1]) == [8, 2]
    assert split_by_weight(3, [100, 1, 1]) == [1, 1, 1]
    assert sum(split_by_weight(257, [1, 2, 3.5])) == 257
    tasks = RGTasks({"chain_sum": {"weight": 3}, "leg_counting": {}}, eval_size=20, seed=0)
    assert [p.dataset for p in tasks.held_out].count("leg_counting") == 5
    rng = random.Random(0)
    drawn = [tasks.sample(rng).dataset for _ in range(2000)]
    assert 0.7 < drawn.count("chain_sum") / len(drawn) < 0.8
    legs = next(p for p in tasks.held_out if p.dataset == "leg_counting")
    assert "legs" in legs.prompt and legs.as_dict()["question"] == legs.prompt


def test_single_turn_episode_and_its_warm_up_demonstration() -> None:
    spec = build_env(_cfg(use_tool=False, args={"chain_sum": SMALL}, eval_size=8))
    assert (spec.max_turns, spec.max_tool_calls, spec.stop) == (1, 0, ())
    problem = spec.task.held_out[0]
    env = spec.make_env()
    assert env.offload is False
    messages = asyncio.run(env.reset(problem))
    text = "".join(m["content"] for m in messages)
    assert "<answer>" in text and text.endswith(problem.prompt)
    demo = spec.demo(problem, random.Random(0))
    assert demo == [(text, False), (f"<answer>{problem.answer}</answer>", True)]
    result = asyncio.run(env.step(f"so <answer>{problem.answer}</answer>"))
    assert (result.reward, result.done) == (1.0, True)


def test_plain_format_without_instructions_is_the_bare_question() -> None:
    cfg = _cfg(
        use_tool=False,
        reasoning_gym={"datasets": ["chain_sum"], "answer_format": "plain"},
        instructions=False,
        eval_size=4,
    )
    spec = build_env(cfg)
    problem = spec.task.held_out[0]
    env = spec.make_env()
    assert asyncio.run(env.reset(problem)) == [{"role": "user", "content": problem.prompt}]
    assert spec.demo(problem, random.Random(0)) == [(problem.prompt, False), (problem.answer, True)]
    assert asyncio.run(env.step(problem.answer)).reward == 1.0
    assert asyncio.run(env.step("x")).reward == 0.0


def test_python_tool_episode_runs_code_in_the_sandbox() -> None:
    spec = build_env(_cfg(args={"chain_sum": SMALL}, eval_size=4, max_turns=3))
    assert (spec.max_turns, spec.stop) == (3, ("</python>",))
    problem = spec.task.held_out[0]
    env = spec.make_env()
    assert env.offload is True
    opening = asyncio.run(env.reset(problem))[-1]["content"]
    assert "<python>" in opening and "<answer>" in opening
    expression = problem.row["metadata"]["expression"]
    call = asyncio.run(env.step(f"<python>print({expression})</python>"))
    assert not call.done and call.info["tool_status"] == "ok"
    assert problem.answer in call.observations[0]["content"]
    final = asyncio.run(env.step(f"<answer>{problem.answer}</answer>"))
    assert (final.reward, final.done) == (1.0, True)


def test_hermes_tool_format_names_the_answer_tags() -> None:
    env = build_env(_cfg(tool_format="hermes", eval_size=2)).make_env()
    assert isinstance(env, RGEnv)
    text = opening_text(env)
    assert "<tool_call>" in text and "<answer> and </answer>" in text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"reasoning_gym": {"datasets": ["chain_summ"]}},
            "'chain_summ' is not a .*did you mean chain_sum",
        ),
        ({"args": {"chain_sum": {"min_term": 2}}}, "min_term.*chain_sum's settings: min_terms"),
        ({"args": {"chain_sum": {"min_terms": 3, "max_terms": 2}}}, "refused these settings"),
        ({"args": {"chain_sum": SMALL}, "eval_size": 400}, "only 200 distinct questions"),
    ],
)
def test_build_errors_name_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_env(_cfg(**fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reasoning_gym": {"datasets": []}}, "name at least one dataset"),
        (
            {"args": {"leg_counting": {}}},
            "env.args.leg_counting: not one of env.reasoning_gym.datasets",
        ),
        ({"args": {"chain_sum": {"weight": 0}}}, "weight must be a number > 0"),
        ({"args": {"chain_sum": {"seed": 1}}}, "set env.seed instead"),
        ({"args": {"chain_sum": 3}}, "must be a table"),
    ],
)
def test_config_errors(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _cfg(**fields)


def test_rg_fields_belong_to_the_reasoning_gym_env() -> None:
    with pytest.raises(
        ValueError, match=r"env\.reasoning_gym\.datasets is for env\.name = 'reasoning_gym'"
    ):
        EnvConfig(name="math", reasoning_gym={"datasets": ["chain_sum"]})
    with pytest.raises(ValueError, match=r"env\.args is for your own env\.name"):
        EnvConfig(name="math", args={"chain_sum": {}})


def test_example_config_fits_its_context() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "reasoning_gym.toml"
    cfg = load_config(path)
    spec = build_env(cfg.env, held_out_only=True)
    assert len(spec.task.held_out) == 128
    # The char tokenizer: one token per character; the answer and EOS must fit after the prompt.
    longest = max(len(p.prompt) + len(p.answer) + 1 for p in spec.task.held_out)
    assert longest <= cfg.model.max_seq_len
    assert max(len(p.answer) + 1 for p in spec.task.held_out) <= cfg.rollout.max_new_tokens

"""reasoning-gym's procedural tasks (`env.name = "reasoning_gym"`, the `reasoning-gym` extra).

    [env]
    name = "reasoning_gym"
    args = {chain_sum = {weight = 2, min_terms = 2, max_terms = 3}}

    [env.reasoning_gym]
    datasets = ["chain_sum", "leg_counting"]

`RGTasks` is the task source: `sample(rng)` (training), `held_out`, and `score(problem, text)`,
so any environment (an agent program's, your own) can use the same tasks. `RGEnv` is the
episode: single turn (`env.use_tool = false`) or with the sandboxed Python tool; it is
`MathToolEnv` with reasoning-gym's answer convention and each dataset's own scorer.

Decisions (docs/reasoning-gym.md):
- Items come from reasoning-gym's own generators (`reasoning_gym.create_dataset`), which seed
  item `i` with `seed + i`. Training items are items `0..size-1` of each dataset created with
  `env.seed` (`size`: `env.args.<name>.size`, else the dataset's own default), all generated
  when the tasks are built and drawn uniformly by the run's rng; held-out items come from the
  dataset created with `env.seed + HELD_OUT_SEED_OFFSET`, so the two never share a generator
  seed. Small task spaces repeat questions across seeds, so training items whose question is a
  held-out question are left out: no held-out question is ever trained on.
- The held-out set: `env.eval_size` items split over the datasets by weight (largest remainder,
  at least one each), each question once.
- The answer: `tags` (default) takes the last `<answer>...</answer>` of the final turn
  (`reasoning_gym.utils.extract_answer`, the convention of reasoning-gym's own evaluations), none
  without one; `plain` takes the final turn's whole text, stripped; `last_number` takes the
  last number in the final turn, thousands separators dropped (lm-evaluation-harness'
  "flexible-extract" for GSM8K), none without one: small chat models answer in a sentence
  ("The answer is 12.") and never learn tags from a zero reward.
- The reward is the dataset's `score_answer(answer, item)`, in [0, 1]; some datasets give partial
  credit (chain_sum: `len(reference) / len(answer)` when the answer contains the reference). A
  scorer that raises on a malformed answer scores 0: the policy's fault, not the run's.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import EnvSpec, Segments
from saorl.envs.math.tool import MathToolEnv

AnswerFormat = Literal["tags", "plain", "last_number"]
HELD_OUT_SEED_OFFSET = 2**31  # far past any training index: seeds seed + i never meet
INSTALL_HINT = "pip install 'saorl[reasoning-gym]' (or: pip install reasoning-gym)"
# How the instructions ask for the answer, per env.reasoning_gym.answer_format.
ANSWER_INSTRUCTIONS: dict[str, str] = {
    "tags": "Give the final answer between <answer> and </answer>.",
    "plain": "Reply with the final answer only.",
    "last_number": "Reply with the final answer only.",
}
# A number as a final answer states it: sign, digits, decimals (separators removed first).
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_HELD_OUT_TRIES = 4  # held-out items tried per item kept (repeated questions are skipped)


def import_reasoning_gym() -> Any:
    """The `reasoning_gym` package, or a ConfigError naming the extra to install."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigError(
            f"env.name = 'reasoning_gym' needs the reasoning-gym package ({exc}): {INSTALL_HINT}"
        ) from None
    return reasoning_gym


@dataclass(frozen=True)
class RGProblem:
    """One reasoning-gym item: the question (`prompt`), the dataset's reference answer, a key
    (the dataset and a hash of the question: equal questions share per-prompt baselines) and
    the whole item (`row`: question, answer, metadata), which `score_answer` reads."""

    dataset: str
    prompt: str
    answer: str
    key: str
    row: dict[str, Any] = field(repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The task as plain data (for agent programs): key, dataset, question, answer,
        metadata."""
        return {
            "key": self.key,
            "dataset": self.dataset,
            "question": self.prompt,
            "answer": self.answer,
            "metadata": self.row.get("metadata", {}),
        }


def _problem(name: str, item: Mapping[str, Any]) -> RGProblem:
    question = str(item["question"])
    digest = hashlib.sha1(question.encode()).hexdigest()[:12]
    answer = "" if item.get("answer") is None else str(item["answer"])
    return RGProblem(name, question, answer, f"{name}/{digest}", dict(item))


def split_by_weight(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainder), at least 1 each."""
    if total < len(weights):
        raise ConfigError(
            f"env.eval_size={total} is fewer than the {len(weights)} datasets of "
            "env.reasoning_gym.datasets; each needs at least one held-out item"
        )
    raw = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(r)) for r in raw]
    while sum(counts) < total:
        counts[max(range(len(raw)), key=lambda i: raw[i] - counts[i])] += 1
    while sum(counts) > total:
        over = [i for i in range(len(raw)) if counts[i] > 1]
        counts[max(over, key=lambda i: counts[i] - raw[i])] -= 1
    return counts


class RGTasks:
    """reasoning-gym datasets as a task source (the module docstring has the rules).

    `datasets`: name -> settings (the dataset's config fields, plus saorl's `weight`).
    `train=False`: the held-out items only (evaluation); no training dataset is made.
    """

    def __init__(
        self,
        datasets: Mapping[str, Mapping[str, Any]],
        eval_size: int = 256,
        seed: int = 1234,
        answer_format: AnswerFormat = "tags",
        train: bool = True,
    ) -> None:
        rg = import_reasoning_gym()
        from reasoning_gym.factory import DATASETS

        for name in datasets:
            if name not in DATASETS:
                close = difflib.get_close_matches(name, DATASETS, n=3, cutoff=0.6)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                raise ConfigError(
                    f"env.reasoning_gym.datasets: {name!r} is not a reasoning-gym dataset; {hint}"
                    f'({len(DATASETS)} datasets; list them with python -c "import '
                    'reasoning_gym.factory as f; print(sorted(f.DATASETS))")'
                )
        self.answer_format = answer_format
        self._extract = rg.utils.extract_answer
        self.names = list(datasets)
        self.weights = [float(datasets[n].get("weight", 1.0)) for n in self.names]
        settings = {n: {k: v for k, v in datasets[n].items() if k != "weight"} for n in datasets}
        counts = split_by_weight(eval_size, self.weights)
        self.held_out: list[RGProblem] = []
        self._scorers: dict[str, Any] = {}
        for name, count in zip(self.names, counts, strict=True):
            ds = _create(name, settings[name], seed + HELD_OUT_SEED_OFFSET, _HELD_OUT_TRIES * count)
            self._scorers[name] = ds.score_answer
            self.held_out += _distinct(name, ds, count)
        held = {p.prompt for p in self.held_out}
        # Every training item as a list: a checkpoint keeps in-flight tasks as their index in
        # it (saorl.rollout.resume), and the held-out questions are left out once, exactly.
        self.train: list[RGProblem] = []
        self._spans: list[tuple[int, int]] = []
        for name in self.names if train else ():
            ds = _create(name, settings[name], seed, settings[name].get("size"))
            start = len(self.train)
            items = (_problem(name, ds[i]) for i in range(len(ds)))
            self.train += [p for p in items if p.prompt not in held]
            if len(self.train) == start:
                raise ConfigError(
                    f"env.reasoning_gym.datasets: every one of the {len(ds)} training items of "
                    f"{name!r} is a held-out question; lower env.eval_size, raise its size or "
                    "widen its "
                    f"settings in env.args.{name}"
                )
            self._spans.append((start, len(self.train)))

    def sample(self, rng: random.Random) -> RGProblem:
        """A training item (never a held-out question): a dataset by weight, then an item."""
        if not self.train:
            raise ValueError("RGTasks(train=False) has no training items")
        start, stop = self._spans[rng.choices(range(len(self.names)), self.weights)[0]]
        return self.train[rng.randrange(start, stop)]

    def extract(self, text: str) -> str | None:
        """The answer in a final turn's text (None: it gives none)."""
        if self.answer_format == "plain":
            return text.strip()
        if self.answer_format == "last_number":
            numbers = _NUMBER.findall(text.replace(",", ""))
            return numbers[-1] if numbers else None
        return self._extract(text, tag_name="answer")

    def score(self, problem: RGProblem, text: str) -> float:
        """The dataset's own score of the answer in `text`, 0.0 if the scorer raises."""
        try:
            return float(self._scorers[problem.dataset](self.extract(text), problem.row))
        except Exception:  # a malformed answer a scorer did not expect
            return 0.0

    def answer_text(self, problem: RGProblem) -> str:
        """The reference answer as a correct final turn gives it (warm-up demonstrations)."""
        if self.answer_format != "tags":
            return problem.answer
        return f"<answer>{problem.answer}</answer>"


def _create(name: str, settings: Mapping[str, Any], seed: int, size: int | None) -> Any:
    """`reasoning_gym.create_dataset` with `settings`, its errors as ConfigErrors."""
    from reasoning_gym.factory import DATASETS, create_dataset

    fields = [f.name for f in dataclasses.fields(DATASETS[name][1])]
    extra = {"size": size} if size is not None and "size" in fields else {}
    try:
        return create_dataset(name, **{**settings, "seed": seed, **extra})
    except TypeError as exc:
        known = ", ".join(f for f in fields if f != "seed")
        raise ConfigError(f"env.args.{name}: {exc}; {name}'s settings: {known}") from None
    except (AssertionError, ValueError) as exc:
        raise ConfigError(f"env.args.{name}: {name} refused these settings: {exc}") from None


def _distinct(name: str, ds: Any, count: int) -> list[RGProblem]:
    """The first `count` items of `ds` with distinct questions."""
    out: dict[str, RGProblem] = {}
    for i in range(len(ds)):
        problem = _problem(name, ds[i])
        out.setdefault(problem.prompt, problem)
        if len(out) == count:
            return list(out.values())
    raise ConfigError(
        f"env.eval_size: {name!r} gave only {len(out)} distinct questions in {len(ds)} items, "
        f"{count} wanted; lower env.eval_size or widen env.args.{name}"
    )


class RGEnv(MathToolEnv):
    """An episode on an `RGTasks` item: `MathToolEnv` (single turn without the tool) asking
    for the answer in reasoning-gym's convention and scored by the item's dataset."""

    def __init__(self, tasks: RGTasks, **kwargs: Any) -> None:
        super().__init__(answer_instruction=ANSWER_INSTRUCTIONS[tasks.answer_format], **kwargs)
        self.tasks = tasks
        # Scoring alone is cheap: inline keeps single-turn runs deterministic.
        self.offload = self.use_tool

    def grade(self, action_text: str) -> float:
        return self.tasks.score(self.task, action_text)


def opening_text(env: MathToolEnv) -> str:
    """What `env.reset` puts before a task's question, as the char tokenizer reads messages
    (their contents joined). `reset` never awaits, so its coroutine is driven to the end here
    without an event loop (the warm-up may run where one is already running)."""
    coro = env.reset(RGProblem("", "", "", "", {}))
    try:
        coro.send(None)
    except StopIteration as done:
        return "".join(m["content"] for m in done.value)
    coro.close()
    raise RuntimeError("the environment's reset awaited something; cannot build demonstrations")


def build_rg_tasks(cfg: EnvConfig, held_out_only: bool = False) -> RGTasks:
    """The `RGTasks` of `env.reasoning_gym.datasets` and `env.args` (any env may use them)."""
    datasets = {name: dict(cfg.args.get(name, {})) for name in cfg.reasoning_gym.datasets}
    return RGTasks(
        datasets,
        cfg.held_out_count(),
        cfg.seed,
        cfg.reasoning_gym.answer_format,
        train=not held_out_only,
    )


def build_rg_spec(cfg: EnvConfig, held_out_only: bool) -> EnvSpec:
    """`env.name = "reasoning_gym"`: single turn, or with the Python tool (`env.use_tool`).
    Its warm-up demonstrations answer directly, in the answer format."""
    from saorl.toolcalls import stop_strings

    tasks = build_rg_tasks(cfg, held_out_only)

    def make_env() -> RGEnv:
        return RGEnv(
            tasks,
            fmt=cfg.tool_format,
            use_tool=cfg.use_tool,
            system_prompt=cfg.system_prompt,
            instructions=cfg.instructions,
        )

    prefix = opening_text(make_env())

    def demo(problem: RGProblem, rng: random.Random) -> Segments:
        return [(prefix + problem.prompt, False), (tasks.answer_text(problem), True)]

    tools_on = cfg.use_tool
    return EnvSpec(
        tasks,
        make_env,
        max_turns=cfg.max_turns if tools_on else 1,
        max_tool_calls=cfg.max_tool_calls if tools_on else 0,
        stop=tuple(stop_strings(cfg.tool_format)) if tools_on else (),
        demo=demo,
    )

"""Math problem sets in the layouts people already have, with a field mapping and named presets.

    problems = load_problems("gsm8k/test.jsonl", problem_key="question", answer_extractor="gsm8k")
    problems = load_problems("train.parquet")   # verl: prompt messages, reward_model.ground_truth
    problems = load_preset("math500", limit=50)  # packaged copy, or $SAORL_DATA

Files are read by `saorl.envs.data.files` (JSON lines, JSON arrays, gzip, Parquet, directories
saved by `datasets`). Each row becomes a `MathProblem`; a row that does not fit fails with the
file, the row and the key.

Layouts (detected per file from its first row; no layout option is needed):
- plain: a text prompt field (`problem_key`, e.g. `problem`, `question`) and an answer field.
- TRL standard: `prompt` is text. TRL conversational: `prompt` is a list of chat messages
  (`{"role", "content"}`, a system message allowed); the episode starts from those messages.
- verl: `prompt` messages, the reference in `reward_model.ground_truth`, plus `data_source`,
  `extra_info`, ... which are kept in `MathProblem.row` like every other column.

Decisions (the brief is silent on these):
- Defaults fall back, decided on the first row: `problem_key="problem"` takes `prompt` when the
  file has no `problem` field; `answer_key="answer"` takes `reward_model.ground_truth` when it
  has no `answer`. A key set to anything else is used as given. A row with both `problem` and
  `prompt` uses `problem` unless `problem_key="prompt"`.
- A key with dots (`reward_model.ground_truth`) names a nested field; a top-level column
  spelled with the dots wins over the nested one.
- A text prompt must be non-empty; a message list must be non-empty, every message an object
  with text `role` and `content`, the last one from the user (its content is
  `MathProblem.prompt`, the text shown in evaluation results).
- Integer/float answers (common in Parquet exports) become their `str()`; any other non-text
  answer, or an empty one after extraction, is an error rather than a silently unwinnable
  problem. `require_answer=False` (reward functions that need no reference) reads a missing or
  null answer as "". An empty file is an error too (`limit=0` is the way to ask for nothing).
- `key` is `"<parent dir>/<file name>:<id>"` (a `.gz` suffix dropped, so a compressed copy keys
  like the original), `<id>` being `row[id_key]` when `id_key` is set (presets use the dataset's
  own id column) or else the row number; duplicate ids are an error because per-prompt
  baselines key on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from saorl.envs.data.files import (
    DatasetError,
    DatasetNotFoundError,
    display_name,
    read_rows,
)

__all__ = [
    "DATASET_PRESETS",
    "PACKAGED_DATA",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetPreset",
    "MathProblem",
    "default_data_root",
    "gsm8k_final_answer",
    "load_preset",
    "load_problems",
]

AnswerExtractor = Literal["gsm8k"] | Callable[[str], str] | None

# A default key -> the field TRL and verl files use instead.
_FALLBACKS = {"problem": "prompt", "answer": "reward_model.ground_truth"}


@dataclass(frozen=True)
class MathProblem:
    """One problem: the prompt text, the reference answer, a stable key, every column of the
    source row (`row`, read-only; user reward functions get them as keyword arguments) and,
    for a conversational row, the chat messages the episode starts from (`messages`)."""

    prompt: str
    answer: str
    key: str
    row: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    messages: tuple[Mapping[str, Any], ...] = field(default=(), repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # Read-only views do not pickle; checkpoints keep in-flight problems.
        messages = [dict(m) for m in self.messages]
        return (_rebuild_problem, (self.prompt, self.answer, self.key, dict(self.row), messages))


def _rebuild_problem(
    prompt: str,
    answer: str,
    key: str,
    row: dict[str, Any],
    messages: list[dict[str, Any]] | None = None,
) -> MathProblem:
    views = tuple(MappingProxyType(m) for m in messages or ())
    return MathProblem(prompt, answer, key, MappingProxyType(row), views)


def gsm8k_final_answer(text: str) -> str:
    """GSM8K's final answer: the text after the last `####`, stripped, commas removed.

    `"... so 2,125 in total.\\n#### 2,125"` -> `"2125"`. Raises ValueError without a `####`.
    """
    if "####" not in text:
        raise ValueError("no '####' final-answer marker")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _resolve_extractor(extractor: AnswerExtractor) -> Callable[[str], str] | None:
    if extractor is None or callable(extractor):
        return extractor
    if extractor == "gsm8k":
        return gsm8k_final_answer
    raise ValueError(f"unknown answer_extractor {extractor!r}; use 'gsm8k', a callable or None")


# -- fields ----------------------------------------------------------------------------------
_MISSING = object()


def _get(row: Mapping[str, Any], key: str) -> Any:
    """`row[key]`, or the nested field a dotted key names; `_MISSING` when there is none."""
    if key in row:
        return row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _no_field(row: Mapping[str, Any], keys: list[str], where: str, option: str) -> DatasetError:
    fields = ", ".join(map(str, row)) or "none"
    named = " or ".join(repr(k) for k in keys)
    nested = ""
    head, _, rest = keys[-1].partition(".")
    if rest and isinstance(row.get(head), Mapping):
        inner = ", ".join(map(str, row[head])) or "none"
        nested = f"; {head!r} holds: {inner}"
    return DatasetError(f"{where}: no field {named} (fields: {fields}{nested}); set {option}")


def _layout(
    row: Mapping[str, Any], problem_key: str, answer_key: str, where: str, need_answer: bool
) -> tuple[str, str]:
    """The prompt and answer keys of a file, from its first row: each key, or its fallback when
    the key is a default the row lacks."""
    keys = []
    for key, option, required in (
        (problem_key, "problem_key", True),
        (answer_key, "answer_key", need_answer),
    ):
        candidates = [key, _FALLBACKS[key]] if key in _FALLBACKS else [key]
        found = next((k for k in candidates if _get(row, k) is not _MISSING), None)
        if found is None and required:
            raise _no_field(row, candidates, where, option)
        keys.append(found or key)
    return keys[0], keys[1]


def _field(row: Mapping[str, Any], key: str, where: str, option: str) -> Any:
    value = _get(row, key)
    if value is _MISSING:
        raise _no_field(row, [key], where, option)
    return value


def _messages(value: list[Any], key: str, where: str) -> tuple[Mapping[str, Any], ...]:
    if not value:
        raise DatasetError(f"{where}: field {key!r} is an empty list of messages")
    out = []
    for i, message in enumerate(value, start=1):
        at = f"{where}: field {key!r} message {i}"
        if not isinstance(message, Mapping):
            raise DatasetError(f"{at} is {type(message).__name__}, not an object")
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                got = type(message.get(part)).__name__ if part in message else "missing"
                raise DatasetError(f"{at}: {part!r} is {got}, not text")
        out.append(MappingProxyType(dict(message)))
    if out[-1]["role"] != "user":
        raise DatasetError(
            f"{where}: field {key!r}: the last message is from {out[-1]['role']!r}; a prompt "
            "ends with the user's message"
        )
    if not out[-1]["content"].strip():
        raise DatasetError(f"{where}: field {key!r}: the last message has no content")
    return tuple(out)


def _prompt(value: Any, key: str, where: str) -> tuple[str, tuple[Mapping[str, Any], ...]]:
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: field {key!r} is not non-empty text")
        return value, ()
    if isinstance(value, list):
        messages = _messages(value, key, where)
        return messages[-1]["content"], messages
    raise DatasetError(
        f"{where}: field {key!r} is {type(value).__name__}, not text or a list of chat messages"
    )


def _answer(
    value: Any, key: str, where: str, extract: Callable[[str], str] | None, required: bool
) -> str:
    if not required and (value is _MISSING or value is None):
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {key!r} is {type(value).__name__}, not text")
    if extract is not None:
        try:
            value = extract(value)
        except ValueError as exc:
            raise DatasetError(f"{where}: cannot extract the answer from {key!r}: {exc}") from exc
    value = value.strip()
    if not value and required:
        raise DatasetError(f"{where}: empty answer in field {key!r}")
    return value


def load_problems(
    path: str | os.PathLike[str],
    problem_key: str = "problem",
    answer_key: str = "answer",
    answer_extractor: AnswerExtractor = None,
    limit: int | None = None,
    id_key: str | None = None,
    require_answer: bool = True,
) -> list[MathProblem]:
    """Problems from a `.jsonl`/`.json` (JSON lines or one array; `.gz` too), a `.parquet` file
    or a directory saved by `datasets` (`Dataset.save_to_disk`).

    `problem_key` / `answer_key` name the prompt and answer fields (dots for nested fields; the
    defaults fall back to TRL's `prompt` and verl's `reward_model.ground_truth`, see the module
    docstring); `answer_extractor` maps the answer field to the reference answer (`"gsm8k"`:
    the number after `####`; or a callable raising ValueError when it cannot); `limit` keeps
    the first N problems (None: all); `id_key` names a unique id field used in
    `MathProblem.key`; `require_answer=False` allows rows without an answer. Raises
    DatasetError naming the file, row and key on any row that does not fit,
    DatasetNotFoundError (a FileNotFoundError) for a missing path.
    """
    path = Path(path)
    name = display_name(path)
    key_name = name.removesuffix(".gz")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    extract = _resolve_extractor(answer_extractor)
    rows = read_rows(path)

    problems: list[MathProblem] = []
    seen: dict[str, int] = {}
    keys: tuple[str, str] | None = None
    for number, row in rows:
        if limit is not None and len(problems) >= limit:
            break
        where = f"{name} row {number}"
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
        if keys is None:  # the first row decides the layout of the whole file
            keys = _layout(row, problem_key, answer_key, where, require_answer)
        prompt, messages = _prompt(_field(row, keys[0], where, "problem_key"), keys[0], where)
        raw_answer = _get(row, keys[1])
        if raw_answer is _MISSING and require_answer:
            raise _no_field(row, [keys[1]], where, "answer_key")
        answer = _answer(raw_answer, keys[1], where, extract, require_answer)
        ident = str(_field(row, id_key, where, "id_key")) if id_key else str(number)
        if ident in seen:
            raise DatasetError(f"{where}: duplicate {id_key} {ident!r} (also row {seen[ident]})")
        seen[ident] = number
        problems.append(
            MathProblem(prompt, answer, f"{key_name}:{ident}", MappingProxyType(row), messages)
        )
    if not problems and limit != 0:
        raise DatasetError(f"{name}: no rows")
    return problems


# -- presets ---------------------------------------------------------------------------------
class DatasetPreset(NamedTuple):
    """Where a known evaluation set lives under the data root and how its rows are laid out."""

    path: str  # relative to the data root; `PATH.gz` is read when `PATH` is not there
    problem_key: str
    answer_key: str
    answer_extractor: Literal["gsm8k"] | None
    id_key: str | None = None


# Field names as in src/saorl/data/README.md. All four are test splits; `gsm8k_test` says so
# because GSM8K, unlike the others, has a train split people train on.
DATASET_PRESETS: dict[str, DatasetPreset] = {
    "aime24": DatasetPreset("aime24/test.jsonl", "problem", "answer", None, id_key="id"),
    "aime25": DatasetPreset("aime25/test.jsonl", "problem", "answer", None),
    "math500": DatasetPreset("math500/test.jsonl", "problem", "answer", None, id_key="unique_id"),
    "gsm8k_test": DatasetPreset("gsm8k/test.jsonl", "question", "answer", "gsm8k", id_key="idx"),
}

# The copies shipped inside the package (package data), gzip-compressed.
PACKAGED_DATA = Path(__file__).resolve().parents[2] / "data"  # src/saorl/data


def default_data_root() -> Path:
    """`$SAORL_DATA` if set, else the packaged copies (`PACKAGED_DATA`)."""
    env = os.environ.get("SAORL_DATA")
    return Path(env) if env else PACKAGED_DATA


def load_preset(
    name: str, data_root: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[MathProblem]:
    """Problems of a preset in `DATASET_PRESETS` (`data_root` default: `default_data_root()`)."""
    if name not in DATASET_PRESETS:
        raise ValueError(
            f"unknown dataset preset {name!r}; choose one of {sorted(DATASET_PRESETS)}"
        )
    preset = DATASET_PRESETS[name]
    if data_root is not None:
        root = Path(data_root)
        source = "data_root"
    elif os.environ.get("SAORL_DATA"):
        root = Path(os.environ["SAORL_DATA"])
        source = "$SAORL_DATA"
    else:
        root = PACKAGED_DATA
        source = "the packaged copies"
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"data root {root} ({source}) is not a directory; pass data_root or set SAORL_DATA"
        )
    path = root / preset.path
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    return load_problems(
        path,
        problem_key=preset.problem_key,
        answer_key=preset.answer_key,
        answer_extractor=preset.answer_extractor,
        limit=limit,
        id_key=preset.id_key,
    )

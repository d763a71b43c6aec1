"""Math problem sets from JSON lines or Parquet, with a field mapping and named presets.

    problems = load_problems("gsm8k/test.jsonl", problem_key="question", answer_extractor="gsm8k")
    problems = load_preset("math500", limit=50)          # data root: $SAORL_DATA or ../shared/data

Real datasets name their fields differently (`problem` / `question`, `answer` holding a bare
answer or a whole rationale), so the loader takes the field names and an optional answer
extractor, and a row that does not fit fails with the file, the row and the fields it has.

Decisions (the brief is silent on these):
- Row numbers are 1-based: the line number in a JSON-lines file (blank lines are skipped but
  counted, so the number is where an editor shows it), the element index in a `.json` array,
  the row index in Parquet.
- A `.json` file whose first non-blank character is `[` is read as one JSON array of objects;
  any other `.json` file is read as JSON lines.
- Integer/float answers (common in Parquet exports) become their `str()`; any other non-text
  answer, or an empty one after extraction, is an error rather than a silently unwinnable
  problem. An empty file is an error too (`limit=0` is the way to ask for nothing).
- `key` is `"<parent dir>/<file name>:<id>"`, `<id>` being `row[id_key]` when `id_key` is set
  (presets use the dataset's own id column) or else the row number; duplicate ids are an error
  because per-prompt baselines key on them.
- Parquet is read with pyarrow, else pandas (which itself needs pyarrow or fastparquet); both
  are imported only when a Parquet file is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from saorl.config import ConfigError

AnswerExtractor = Literal["gsm8k"] | Callable[[str], str] | None


class DatasetError(ConfigError):
    """A dataset file that does not fit the requested field mapping or format.

    A `ConfigError`: the command line reports it as a bad input (exit code 2, no traceback)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file or data root that does not exist (a bad input, and a FileNotFoundError)."""


@dataclass(frozen=True)
class MathProblem:
    """One problem: the prompt text, the reference answer, a stable key and the source row."""

    prompt: str
    answer: str
    key: str
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only view of the row does not pickle; checkpoints keep in-flight problems.
        return (_rebuild_problem, (self.prompt, self.answer, self.key, dict(self.raw)))


def _rebuild_problem(prompt: str, answer: str, key: str, raw: dict[str, Any]) -> MathProblem:
    return MathProblem(prompt, answer, key, MappingProxyType(raw))


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


def _display_name(path: Path) -> str:
    """`gsm8k/test.jsonl`: enough of the path to tell datasets apart in messages and keys."""
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _iter_json(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    try:
        yield from _iter_json_text(path, name)
    except UnicodeDecodeError as exc:
        with path.open("rb") as f:
            bad = next((n for n, raw in enumerate(f, 1) if not _is_utf8(raw)), "?")
        raise DatasetError(
            f"{name} line {bad}: not UTF-8 text ({exc.reason}); re-encode the file as UTF-8"
        ) from exc


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _iter_json_text(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as f:
        is_array = path.suffix == ".json" and f.read(4096).lstrip().startswith("[")
        f.seek(0)
        if is_array:
            try:
                rows = json.load(f)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{name} line {exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})"
                ) from exc
            except UnicodeDecodeError:
                raise  # `_iter_json` finds the line
            except (ValueError, RecursionError) as exc:
                raise DatasetError(f"{name}: unreadable JSON ({_json_trouble(exc)})") from None
            yield from enumerate(rows, start=1)
            return
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{name} line {number}: invalid JSON ({exc.msg}, column {exc.colno})"
                ) from exc
            except (ValueError, RecursionError) as exc:
                raise DatasetError(
                    f"{name} line {number}: unreadable JSON ({_json_trouble(exc)})"
                ) from None
            yield number, row


def _json_trouble(exc: Exception) -> str:
    """Valid JSON that Python's parser still rejects: nesting past the recursion limit, or an
    integer longer than Python converts (4300 digits by default)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(";")[0]


def _iter_parquet(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    hint = f"reading {name} (Parquet) needs pyarrow: pip install pyarrow"
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    number = 0
    try:
        if pq is not None:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    number += 1
                    yield number, row
            return
        try:
            import pandas as pd
        except ImportError:
            raise DatasetError(hint) from None
        try:
            frame = pd.read_parquet(path)
        except ImportError:  # pandas without a Parquet engine
            raise DatasetError(hint) from None
        yield from enumerate(frame.to_dict("records"), start=1)
    except DatasetError:
        raise
    except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        where = f"row {number + 1}" if number else "file"
        raise DatasetError(f"{name} {where}: not readable as Parquet ({exc})") from None


def _field(row: Mapping[str, Any], key: str, name: str, number: int, option: str) -> Any:
    if key not in row:
        fields = ", ".join(map(str, row)) or "none"
        raise DatasetError(
            f"{name} row {number}: no field {key!r} (fields: {fields}); set {option}"
        )
    return row[key]


def load_problems(
    path: str | os.PathLike[str],
    problem_key: str = "problem",
    answer_key: str = "answer",
    answer_extractor: AnswerExtractor = None,
    limit: int | None = None,
    id_key: str | None = None,
) -> list[MathProblem]:
    """Problems from a `.jsonl`/`.json` (JSON lines or one array) or `.parquet` file.

    `problem_key` / `answer_key` name the prompt and answer fields; `answer_extractor` maps the
    answer field to the reference answer (`"gsm8k"`: the number after `####`; or a callable
    raising ValueError when it cannot); `limit` keeps the first N problems (None: all);
    `id_key` names a unique id field used in `MathProblem.key`. Raises DatasetError naming the
    file, row and fields on any row that does not fit, FileNotFoundError for a missing file.
    """
    path = Path(path)
    name = _display_name(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if not path.is_file():
        raise DatasetNotFoundError(f"dataset file not found: {path}")
    extract = _resolve_extractor(answer_extractor)
    if path.suffix in (".jsonl", ".json"):
        rows = _iter_json(path, name)
    elif path.suffix == ".parquet":
        rows = _iter_parquet(path, name)
    else:
        raise DatasetError(
            f"{name}: unsupported file type {path.suffix!r}; use .jsonl, .json, .parquet"
        )

    problems: list[MathProblem] = []
    seen: dict[str, int] = {}
    for number, row in rows:
        if limit is not None and len(problems) >= limit:
            break
        if not isinstance(row, dict):
            raise DatasetError(f"{name} row {number}: expected an object, got {type(row).__name__}")
        prompt = _field(row, problem_key, name, number, "problem_key")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f"{name} row {number}: field {problem_key!r} is not non-empty text")
        answer = _field(row, answer_key, name, number, "answer_key")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            raise DatasetError(
                f"{name} row {number}: field {answer_key!r} is {type(answer).__name__}, not text"
            )
        if extract is not None:
            try:
                answer = extract(answer)
            except ValueError as exc:
                raise DatasetError(
                    f"{name} row {number}: cannot extract the answer from {answer_key!r}: {exc}"
                ) from exc
        answer = answer.strip()
        if not answer:
            raise DatasetError(f"{name} row {number}: empty answer in field {answer_key!r}")
        ident = str(_field(row, id_key, name, number, "id_key")) if id_key else str(number)
        if ident in seen:
            raise DatasetError(
                f"{name} row {number}: duplicate {id_key} {ident!r} (also row {seen[ident]})"
            )
        seen[ident] = number
        problems.append(
            MathProblem(prompt, answer, key=f"{name}:{ident}", raw=MappingProxyType(dict(row)))
        )
    if not problems and limit != 0:
        raise DatasetError(f"{name}: no rows")
    return problems


class DatasetPreset(NamedTuple):
    """Where a known evaluation set lives under the data root and how its rows are laid out."""

    path: str  # relative to the data root
    problem_key: str
    answer_key: str
    answer_extractor: Literal["gsm8k"] | None
    id_key: str | None = None


# Field names as in ../shared/data/README.md.
DATASET_PRESETS: dict[str, DatasetPreset] = {
    "aime24": DatasetPreset("aime24/test.jsonl", "problem", "answer", None, id_key="id"),
    "aime25": DatasetPreset("aime25/test.jsonl", "problem", "answer", None),
    "math500": DatasetPreset("math500/test.jsonl", "problem", "answer", None, id_key="unique_id"),
    "gsm8k": DatasetPreset("gsm8k/test.jsonl", "question", "answer", "gsm8k", id_key="idx"),
}


def default_data_root() -> Path:
    """`$SAORL_DATA` if set, else `../shared/data` relative to the current directory."""
    env = os.environ.get("SAORL_DATA")
    return Path(env) if env else Path.cwd().parent / "shared" / "data"


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
        root, source = Path(data_root), "data_root"
    elif os.environ.get("SAORL_DATA"):
        root, source = Path(os.environ["SAORL_DATA"]), "$SAORL_DATA"
    else:
        root, source = default_data_root(), "default: ../shared/data from the current directory"
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"data root {root} ({source}) is not a directory; pass data_root or set SAORL_DATA"
        )
    return load_problems(
        root / preset.path,
        problem_key=preset.problem_key,
        answer_key=preset.answer_key,
        answer_extractor=preset.answer_extractor,
        limit=limit,
        id_key=preset.id_key,
    )

"""Rows of a dataset on disk: JSON lines or a JSON array (plain or gzip-compressed), Parquet,
or a directory written by the `datasets` library (`Dataset.save_to_disk`).

    for number, row in read_rows(Path("data/train.parquet")): ...

What a row means (which field is the prompt) is `saorl.envs.data.datasets`'s business; this module
only reads. Every failure is a `DatasetError` naming the file and, where there is one, the line
or row.

Decisions (the brief is silent on these):
- Row numbers are 1-based: the line number in a JSON-lines file (blank lines are skipped but
  counted, so the number is where an editor shows it), the element index in a `.json` array,
  the row index in Parquet and in a saved `datasets` directory.
- A `.json` file whose first non-blank character is `[` is read as one JSON array of objects;
  any other `.json` file is read as JSON lines. `.gz` after either suffix means gzip.
- Parquet is read with pyarrow, else pandas (which itself needs pyarrow or fastparquet); a saved
  `datasets` directory needs the `datasets` package. Each is imported only when such a dataset
  is read, and a missing one is an error naming the package to install.
- A directory holding a `DatasetDict` (several splits) is an error listing the splits: which
  one to train on is the user's choice.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from saorl.config import ConfigError, EnvConfig

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")


class DatasetError(ConfigError):
    """A dataset file that does not fit the requested field mapping or format.

    A `ConfigError`: the command line reports it as a bad input (exit code 2, no traceback)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file or data root that does not exist (a bad input, and a FileNotFoundError)."""


def display_name(path: Path) -> str:
    """`gsm8k/test.jsonl`: enough of the path to tell datasets apart in messages and keys."""
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _suffix(path: Path) -> str:
    """`.jsonl`, or `.jsonl.gz` for a compressed file."""
    if path.suffix == ".gz":
        return "".join(path.suffixes[-2:])
    return path.suffix


def read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """`(row number, row)` pairs of the dataset at `path` (a file or a saved `datasets`
    directory). The file type is checked now; rows are read as they are consumed."""
    name = display_name(path)
    if not path.exists():
        raise DatasetNotFoundError(f"dataset file not found: {path}")
    if path.is_dir():
        return _iter_saved(path, name)
    suffix = _suffix(path)
    if suffix == ".parquet":
        return _iter_parquet(path, name)
    if suffix in SUFFIXES:
        return _iter_json(path, name)
    raise DatasetError(
        f"{name}: unsupported file type {suffix!r}; use {', '.join(SUFFIXES)} or a directory "
        "written by Dataset.save_to_disk"
    )


# -- JSON ------------------------------------------------------------------------------------
def _open(path: Path, binary: bool = False) -> IO[Any]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb") if binary else gzip.open(path, "rt", encoding="utf-8")
    return path.open("rb") if binary else path.open(encoding="utf-8")


def _iter_json(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    try:
        yield from _iter_json_text(path, name)
    except UnicodeDecodeError as exc:
        with _open(path, binary=True) as f:
            bad = next((n for n, raw in enumerate(f, 1) if not _is_utf8(raw)), "?")
        raise DatasetError(
            f"{name} line {bad}: not UTF-8 text ({exc.reason}); re-encode the file as UTF-8"
        ) from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DatasetError(f"{name}: not readable as gzip ({exc or type(exc).__name__})") from None


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _iter_json_text(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    with _open(path) as f:
        is_array = _suffix(path) in (".json", ".json.gz")
        is_array = is_array and f.read(4096).lstrip().startswith("[")
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


# -- Parquet ---------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """pandas hands out numpy arrays and scalars; rows are plain Python like pyarrow's."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if not isinstance(value, (str, bytes)) and callable(getattr(value, "tolist", None)):
        return _plain(value.tolist())
    return value


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
        for number, row in enumerate(frame.to_dict("records"), start=1):
            yield number, _plain(row)
    except DatasetError:
        raise
    except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        where = f"row {number + 1}" if number else "file"
        raise DatasetError(f"{name} {where}: not readable as Parquet ({exc})") from None


# -- directories written by `datasets` -------------------------------------------------------
def _iter_saved(path: Path, name: str) -> Iterator[tuple[int, Any]]:
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        example = path / (splits[0] if splits else "train")
        raise DatasetError(
            f"{name}: a DatasetDict saved by save_to_disk (splits: {', '.join(splits) or 'none'}"
            f"); point at one split's directory, e.g. {example}"
        )
    if not (path / "state.json").is_file():
        raise DatasetError(
            f"{name}: a directory, but not one written by Dataset.save_to_disk (no state.json); "
            f"use a file ({', '.join(SUFFIXES)}) or such a directory"
        )
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"{name}: a directory written by Dataset.save_to_disk; reading it needs the "
            "`datasets` package: pip install datasets (or export it with ds.to_parquet(FILE))"
        ) from None
    try:
        data = datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{name}: not readable by datasets.load_from_disk ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(data, datasets.Dataset):
        raise DatasetError(f"{name}: holds a {type(data).__name__}, not one Dataset split")
    return enumerate(data, start=1)


def held_out_size(cfg: EnvConfig, rows: int, need_train: bool = True) -> int:
    """How many of `env.dataset`'s last rows are held out for evaluation (no `env.eval_dataset`):
    `cfg.held_out_count(rows)`, checked to leave rows to train on."""
    size = cfg.held_out_count(rows)
    if need_train and size >= rows:
        raise ConfigError(
            f"env.eval_size={size} holds out every one of env.dataset's {rows} rows, "
            "leaving none to train on; lower env.eval_size or give env.eval_dataset"
        )
    return size

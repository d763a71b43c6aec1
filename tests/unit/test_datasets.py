"""Dataset loading: the packaged evaluation sets (presets) and small files for errors.

Layouts (TRL, verl, dotted keys, saved `datasets` directories) are in test_dataset_layouts.py.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from saorl.config.env import DATASET_PRESET_NAMES
from saorl.envs.data.datasets import (
    DATASET_PRESETS,
    PACKAGED_DATA,
    DatasetError,
    MathProblem,
    gsm8k_final_answer,
    load_preset,
    load_problems,
)

# CI keeps a read-only copy of the evaluation sets beside the checkout; users do not have it.
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch) -> None:
    monkeypatch.delenv("SAORL_DATA", raising=False)


# ---------------------------------------------------------------------------------------------
# The packaged presets


@pytest.mark.parametrize(
    ("name", "rows", "first_answer"),
    [
        ("aime24", 30, "204"),
        ("aime25", 30, "70"),
        ("math500", 500, None),
        ("gsm8k_test", 1319, "18"),
    ],
)
def test_presets_load_from_the_package(name: str, rows: int, first_answer: str | None) -> None:
    problems = load_preset(name)  # no data_root, no $SAORL_DATA: the packaged copies
    assert len(problems) == rows
    assert len({p.key for p in problems}) == rows  # keys identify problems
    assert all(p.prompt.strip() and p.answer.strip() for p in problems)
    if first_answer is not None:
        assert problems[0].answer == first_answer
    folder = DATASET_PRESETS[name].path.split("/")[0]
    assert problems[0].key.startswith(f"{folder}/test.jsonl:")  # `.gz` is not part of keys


def test_preset_details() -> None:
    gsm = load_preset("gsm8k_test", limit=5)
    assert len(gsm) == 5 and gsm[0].key == "gsm8k/test.jsonl:0"
    assert gsm[0].prompt.startswith("Janet")
    assert "####" in gsm[0].row["answer"]  # the row is kept as it was
    assert set(gsm[0].row) == {"question", "answer", "idx"} and gsm[0].messages == ()
    # GSM8K answers with thousands separators lose the commas.
    big = [p for p in load_preset("gsm8k_test") if "," in p.row["answer"].split("####")[-1]]
    assert big and all(p.answer.isdigit() or p.answer.lstrip("-").isdigit() for p in big)
    math500 = load_preset("math500", limit=1)[0]
    assert math500.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math500.key == "math500/test.jsonl:test/precalculus/807.json"
    aime24 = load_preset("aime24", limit=1)[0]
    assert aime24.key == "aime24/test.jsonl:60"


def test_packaged_files_are_the_shared_ones_compressed() -> None:
    assert sorted(p.relative_to(PACKAGED_DATA).as_posix() for p in PACKAGED_DATA.rglob("*.gz")) == [
        "aime24/test.jsonl.gz",
        "aime25/test.jsonl.gz",
        "gsm8k/test.jsonl.gz",
        "math500/test.jsonl.gz",
    ]
    if not SHARED.is_dir():
        pytest.skip(f"no shared copy at {SHARED} to compare with")
    for name in ("aime24", "aime25", "gsm8k", "math500"):
        packaged = gzip.decompress((PACKAGED_DATA / name / "test.jsonl.gz").read_bytes())
        assert packaged == (SHARED / name / "test.jsonl").read_bytes(), name


def test_wrong_field_names_on_gsm8k() -> None:
    with pytest.raises(DatasetError) as info:
        load_problems(PACKAGED_DATA / "gsm8k" / "test.jsonl.gz")
    assert str(info.value) == (
        "gsm8k/test.jsonl.gz row 1: no field 'problem' or 'prompt' (fields: question, answer, "
        "idx); set problem_key"
    )


def test_load_preset_data_root_resolution(tmp_path: Path, monkeypatch) -> None:
    _write_jsonl(tmp_path / "aime25" / "test.jsonl", [{"problem": "1+1?", "answer": "2"}])
    monkeypatch.setenv("SAORL_DATA", str(tmp_path))
    assert load_preset("aime25")[0].answer == "2"
    assert len(load_preset("aime25", PACKAGED_DATA)) == 30  # data_root beats $SAORL_DATA
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        load_preset("math500")  # a root that lacks the file is not mixed with the package
    # A compressed copy under the data root is read when the plain file is not there.
    (tmp_path / "math500").mkdir()
    row = json.dumps({"problem": "2+2?", "answer": "4", "unique_id": "u"}) + "\n"
    (tmp_path / "math500" / "test.jsonl.gz").write_bytes(gzip.compress(row.encode()))
    assert [(p.answer, p.key) for p in load_preset("math500")] == [("4", "math500/test.jsonl:u")]
    monkeypatch.setenv("SAORL_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere \(\$SAORL_DATA\).*set SAORL_DATA"):
        load_preset("aime25")
    monkeypatch.delenv("SAORL_DATA")
    monkeypatch.chdir(tmp_path)  # the working directory plays no part any more
    assert len(load_preset("aime25")) == 30
    with pytest.raises(ValueError, match=r"unknown dataset preset 'aime26'.*aime24"):
        load_preset("aime26", tmp_path)
    with pytest.raises(ValueError, match=r"unknown dataset preset 'gsm8k'.*gsm8k_test"):
        load_preset("gsm8k")
    assert set(DATASET_PRESETS) == {"aime24", "aime25", "math500", "gsm8k_test"}
    # the names the config (and the trust gate) know without importing the environments
    assert tuple(DATASET_PRESETS) == DATASET_PRESET_NAMES


# ---------------------------------------------------------------------------------------------
# Field mapping, extraction and errors on small files


def test_field_mapping_extractors_and_limit(tmp_path: Path) -> None:
    rows = [{"q": f"question {i}", "a": f"work...\n#### {i},000", "uid": f"u{i}"} for i in range(5)]
    path = _write_jsonl(tmp_path / "set" / "train.jsonl", rows)
    problems = load_problems(path, "q", "a", answer_extractor="gsm8k", limit=3, id_key="uid")
    assert [p.answer for p in problems] == ["0000", "1000", "2000"]
    assert [p.key for p in problems] == [
        "set/train.jsonl:u0",
        "set/train.jsonl:u1",
        "set/train.jsonl:u2",
    ]
    last_word = load_problems(path, "q", "a", answer_extractor=lambda s: s.split()[-1])
    assert last_word[4].answer == "4,000" and last_word[4].key == "set/train.jsonl:5"
    assert load_problems(path, "q", "a", limit=0) == []
    p = problems[0]
    assert p == MathProblem("question 0", "0000", "set/train.jsonl:u0")  # row is not compared
    assert hash(p) == hash(MathProblem("question 0", "0000", "set/train.jsonl:u0"))
    with pytest.raises(AttributeError):
        p.answer = "1"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.row["q"] = "changed"  # type: ignore[index]


def test_gsm8k_extractor() -> None:
    assert gsm8k_final_answer("a #### b\n#### 2,125 ") == "2125"
    assert gsm8k_final_answer("#### -3") == "-3"
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("no marker")


def test_numeric_answers_become_text_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d" / "x.jsonl"
    path.parent.mkdir()
    path.write_text('{"problem": "p1", "answer": 7}\n\n{"problem": "p2", "answer": 2.5}\n')
    problems = load_problems(path)
    assert [(p.answer, p.key) for p in problems] == [("7", "d/x.jsonl:1"), ("2.5", "d/x.jsonl:3")]


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "d" / "x.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"problem": "p", "answer": "1"}, {"problem": "q", "answer": "2"}]))
    assert [p.answer for p in load_problems(path)] == ["1", "2"]
    (tmp_path / "d" / "bad.json").write_text('[{"problem": "p",\n "answer": }]')
    with pytest.raises(DatasetError, match=r"d/bad.json line 2: invalid JSON"):
        load_problems(tmp_path / "d" / "bad.json")


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        (
            [{"problem": "p", "answer": "1"}] * 2 + [{"question": "p", "answer": "1"}],
            {},
            "d/f.jsonl row 3: no field 'problem' (fields: question, answer); set problem_key",
        ),
        (
            [{"problem": "p", "solution": "s"}],
            {},
            "d/f.jsonl row 1: no field 'answer' or 'reward_model.ground_truth' (fields: problem, "
            "solution); set answer_key",
        ),
        ([["p", "1"]], {}, "d/f.jsonl row 1: expected an object, got list"),
        ([{"problem": "", "answer": "1"}], {}, "d/f.jsonl row 1: field 'problem' is not"),
        ([{"problem": 5, "answer": "1"}], {}, "d/f.jsonl row 1: field 'problem' is int, not text"),
        ([{"problem": "p", "answer": None}], {}, "d/f.jsonl row 1: field 'answer' is NoneType"),
        ([{"problem": "p", "answer": " "}], {}, "d/f.jsonl row 1: empty answer"),
        (
            [{"problem": "p", "answer": "42"}],
            {"answer_extractor": "gsm8k"},
            "d/f.jsonl row 1: cannot extract the answer from 'answer': no '####'",
        ),
        (
            [{"problem": "p", "answer": "1", "id": 5}, {"problem": "q", "answer": "2", "id": 5}],
            {"id_key": "id"},
            "d/f.jsonl row 2: duplicate id '5' (also row 1)",
        ),
        (
            [{"problem": "p", "answer": "1"}],
            {"id_key": "id"},
            "d/f.jsonl row 1: no field 'id' (fields: problem, answer); set id_key",
        ),
        ([], {}, "d/f.jsonl: no rows"),
    ],
)
def test_row_errors_name_file_row_and_fields(
    tmp_path: Path, rows: list[object], kwargs: dict, message: str
) -> None:
    path = _write_jsonl(tmp_path / "d" / "f.jsonl", rows)
    with pytest.raises(DatasetError) as info:
        load_problems(path, **kwargs)
    assert str(info.value).startswith(message)


def test_malformed_json_line(tmp_path: Path) -> None:
    path = tmp_path / "d" / "f.jsonl"
    path.parent.mkdir()
    path.write_text('{"problem": "p", "answer": "1"}\n\n{"problem": "p", "answer": \n')
    with pytest.raises(DatasetError, match=r"^d/f.jsonl line 3: invalid JSON \(Expecting value"):
        load_problems(path)


def test_bad_arguments(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d" / "f.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(ValueError, match="unknown answer_extractor 'gsm9k'"):
        load_problems(path, answer_extractor="gsm9k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load_problems(path, limit=-1)
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        load_problems(tmp_path / "missing.jsonl")
    csv = tmp_path / "d" / "f.csv"
    csv.write_text("problem,answer\n")
    with pytest.raises(DatasetError, match=r"d/f.csv: unsupported file type '.csv'; use .jsonl"):
        load_problems(csv)


# ---------------------------------------------------------------------------------------------
# Parquet


def test_parquet_round_trip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (in the dev extra)")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "question": ["2+2?", "3*3?", "1-1?"],
            "answer": ["#### 4", "#### 9", "#### 0"],
            "n": [1, 2, 3],
        }
    )
    path = tmp_path / "pq" / "test.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    problems = load_problems(path, "question", answer_extractor="gsm8k", id_key="n", limit=2)
    assert [(p.prompt, p.answer, p.key) for p in problems] == [
        ("2+2?", "4", "pq/test.parquet:1"),
        ("3*3?", "9", "pq/test.parquet:2"),
    ]
    assert dict(problems[0].row) == {"question": "2+2?", "answer": "#### 4", "n": 1}
    with pytest.raises(
        DatasetError,
        match=r"pq/test.parquet row 1: no field 'problem' or 'prompt' \(fields: question, answer",
    ):
        load_problems(path)


def test_parquet_without_pyarrow_names_the_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow...` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    path = tmp_path / "pq" / "test.parquet"
    path.parent.mkdir()
    path.write_bytes(b"PAR1")
    with pytest.raises(  # a bad input for the command line (exit code 2), not a traceback
        DatasetError, match=r"pq/test.parquet \(Parquet\) needs pyarrow: pip install pyarrow"
    ):
        load_problems(path)

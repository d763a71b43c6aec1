"""Datasets in the layouts people already have: TRL (standard and conversational), verl
Parquet, dotted keys, gzip, directories saved by `datasets`; the opening messages built from
them (`env.system_prompt`, `env.instructions`); every bad row named by file, row and key."""

from __future__ import annotations

import asyncio
import gzip
import json
import pickle
import sys
from pathlib import Path

import pytest

from saorl.config import EnvConfig
from saorl.envs.data.datasets import DatasetError, MathProblem, load_problems
from saorl.envs.factory import build_env
from saorl.envs.math.tool import NO_TOOL_INSTRUCTIONS, MathToolEnv
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.episode import ChatCodec

SYSTEM = {"role": "system", "content": "You are terse."}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _verl_rows(n: int) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [_user(f"What is {i} + {i}? Let's think step by step.")],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "answer": f"#### {2 * i}"},
        }
        for i in range(n)
    ]


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (in the dev extra)")
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _reset(problem: MathProblem, **kwargs) -> list[dict]:
    return asyncio.run(MathToolEnv(use_tool=False, **kwargs).reset(problem))


# ---------------------------------------------------------------------------------------------
# Layouts


def test_trl_standard_layout(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+1?", "answer": str(i + 1), "level": i} for i in range(3)]
    [p, *_] = load_problems(_write_jsonl(tmp_path / "d" / "trl.jsonl", rows))
    assert (p.prompt, p.answer, p.key, p.messages) == ("0+1?", "1", "d/trl.jsonl:1", ())
    assert dict(p.row) == rows[0]
    assert _reset(p) == [_user(NO_TOOL_INSTRUCTIONS + "0+1?")]


def test_trl_layout_without_an_answer_column(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d" / "p.jsonl", [{"prompt": "Say hi."}, {"prompt": "Bye."}])
    with pytest.raises(DatasetError) as info:  # the grader needs a reference answer
        load_problems(path)
    assert str(info.value) == (
        "d/p.jsonl row 1: no field 'answer' or 'reward_model.ground_truth' (fields: prompt); "
        "set answer_key"
    )
    # With user reward functions (env.reward_fns) no reference is needed.
    problems = load_problems(path, require_answer=False)
    assert [(p.prompt, p.answer) for p in problems] == [("Say hi.", ""), ("Bye.", "")]


def test_trl_conversational_layout(tmp_path: Path) -> None:
    rows = [
        {"prompt": [SYSTEM, _user("2+2?")], "answer": "4", "solution": "2+2=4"},
        {"prompt": [_user("3+3?")], "answer": "6", "solution": "3+3=6"},
    ]
    first, second = load_problems(_write_jsonl(tmp_path / "d" / "conv.jsonl", rows))
    assert (first.prompt, first.answer) == ("2+2?", "4")  # the last user message's text
    assert [dict(m) for m in first.messages] == [SYSTEM, _user("2+2?")]
    assert first.row["solution"] == "2+2=4" and first.row["prompt"] == rows[0]["prompt"]
    # The episode starts from the row's messages; the instructions go before the user's text.
    assert _reset(first) == [SYSTEM, _user(NO_TOOL_INSTRUCTIONS + "2+2?")]
    assert _reset(first, instructions=False) == [SYSTEM, _user("2+2?")]
    # env.system_prompt: the row's own system message wins; a row without one gets it.
    assert _reset(first, system_prompt="Be kind.")[0] == SYSTEM
    assert _reset(second, system_prompt="Be kind.", instructions=False) == [
        {"role": "system", "content": "Be kind."},
        _user("3+3?"),
    ]
    # reset hands out copies: an episode cannot change the problem it was given.
    _reset(second)[0]["content"] = "changed"
    assert second.messages[0]["content"] == "3+3?"


def test_system_prompt_on_a_text_prompt_and_through_a_chat_template() -> None:
    p = MathProblem("1+1?", "2", "k")
    messages = _reset(p, system_prompt="S.", instructions=False)
    assert messages == [{"role": "system", "content": "S."}, _user("1+1?")]
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    ids = ChatCodec(tok).prompt_ids(messages)
    assert tok.decode(ids) == "[system]S.[user]1+1?[assistant]"


def test_verl_parquet_layout(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "verl" / "train.parquet", _verl_rows(3))
    problems = load_problems(path, id_key="extra_info.index")
    p = problems[2]
    assert (p.prompt, p.answer, p.key) == (
        "What is 2 + 2? Let's think step by step.",
        "4",  # reward_model.ground_truth: answer_key at its default falls back to it
        "verl/train.parquet:2",
    )
    assert [dict(m) for m in p.messages] == [_user("What is 2 + 2? Let's think step by step.")]
    assert set(p.row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert p.row["data_source"] == "openai/gsm8k" and p.row["extra_info"]["split"] == "train"
    # Any nested field can be the answer, with an extractor.
    again = load_problems(path, answer_key="extra_info.answer", answer_extractor="gsm8k")
    assert [q.answer for q in again] == ["0", "2", "4"]


def test_pandas_rows_become_plain_python() -> None:
    # Without pyarrow, Parquet is read through pandas (with fastparquet), whose records hold
    # numpy arrays and scalars; rows must look the same as pyarrow's.
    np = pytest.importorskip("numpy")
    from saorl.envs.data.files import _plain

    record = {
        "prompt": np.array([{"role": "user", "content": "hi"}], dtype=object),
        "extra_info": {"index": np.int64(3), "tags": np.array(["a", "b"])},
        "score": np.float32(0.5),
    }
    plain = _plain(record)
    assert plain == {
        "prompt": [{"role": "user", "content": "hi"}],
        "extra_info": {"index": 3, "tags": ["a", "b"]},
        "score": 0.5,
    }
    assert type(plain["extra_info"]["index"]) is int and type(plain["prompt"]) is list


def test_dotted_keys(tmp_path: Path) -> None:
    rows = [
        {"meta": {"q": {"text": "deep?"}}, "meta.q.text": "flat?", "ans": {"value": 7}},
    ]
    path = _write_jsonl(tmp_path / "d" / "dots.jsonl", rows)
    [p] = load_problems(path, problem_key="meta.q.text", answer_key="ans.value")
    assert (p.prompt, p.answer) == ("flat?", "7")  # a column spelled with the dots wins
    nested = _write_jsonl(tmp_path / "d" / "nested.jsonl", [{"meta": {"q": {"text": "deep?"}}}])
    [p] = load_problems(nested, problem_key="meta.q.text", require_answer=False)
    assert p.prompt == "deep?"
    with pytest.raises(DatasetError) as info:
        load_problems(path, problem_key="meta.q.text", answer_key="ans.val")
    assert str(info.value) == (
        "d/dots.jsonl row 1: no field 'ans.val' (fields: meta, meta.q.text, ans; 'ans' holds: "
        "value); set answer_key"
    )


def test_problem_and_prompt_both_present_uses_problem(tmp_path: Path) -> None:
    rows = [{"problem": "text form", "prompt": [_user("chat form")], "answer": "1"}]
    path = _write_jsonl(tmp_path / "d" / "both.jsonl", rows)
    assert load_problems(path)[0].messages == ()
    assert load_problems(path, problem_key="prompt")[0].prompt == "chat form"


def test_the_first_row_decides_the_layout(tmp_path: Path) -> None:
    rows = [{"prompt": "a?", "answer": "1"}, {"problem": "b?", "answer": "2"}]
    with pytest.raises(DatasetError) as info:
        load_problems(_write_jsonl(tmp_path / "d" / "mixed.jsonl", rows))
    assert str(info.value) == (
        "d/mixed.jsonl row 2: no field 'prompt' (fields: problem, answer); set problem_key"
    )


def test_gzip_files(tmp_path: Path) -> None:
    lines = "".join(json.dumps({"prompt": f"{i}?", "answer": str(i)}) + "\n" for i in range(3))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    problems = load_problems(tmp_path / "d" / "x.jsonl.gz")
    assert [p.key for p in problems] == ["d/x.jsonl:1", "d/x.jsonl:2", "d/x.jsonl:3"]
    array = json.dumps([{"prompt": "p", "answer": "1"}]).encode()
    (tmp_path / "d" / "a.json.gz").write_bytes(gzip.compress(array))
    assert load_problems(tmp_path / "d" / "a.json.gz")[0].key == "d/a.json:1"
    (tmp_path / "d" / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DatasetError, match=r"^d/bad.jsonl.gz: not readable as gzip"):
        load_problems(tmp_path / "d" / "bad.jsonl.gz")
    (tmp_path / "d" / "cut.jsonl.gz").write_bytes(gzip.compress(lines.encode())[:-12])
    with pytest.raises(DatasetError, match=r"^d/cut.jsonl.gz: not readable as gzip"):
        load_problems(tmp_path / "d" / "cut.jsonl.gz")


def test_conversational_problem_pickles(tmp_path: Path) -> None:
    rows = [{"prompt": [SYSTEM, _user("2+2?")], "answer": "4", "tags": ["a"]}]
    [p] = load_problems(_write_jsonl(tmp_path / "d" / "c.jsonl", rows))
    q = pickle.loads(pickle.dumps(p))  # checkpoints keep in-flight problems
    assert q == p and [dict(m) for m in q.messages] == [SYSTEM, _user("2+2?")]
    assert dict(q.row) == rows[0]
    with pytest.raises(TypeError):
        q.messages[0]["content"] = "x"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------
# Bad rows: each names the file, the row and the key


@pytest.mark.parametrize(
    ("row", "kwargs", "message"),
    [
        ({"prompt": [], "answer": "1"}, {}, "field 'prompt' is an empty list of messages"),
        ({"prompt": ["hi"], "answer": "1"}, {}, "field 'prompt' message 1 is str, not an object"),
        (
            {"prompt": [SYSTEM, {"content": "hi"}], "answer": "1"},
            {},
            "field 'prompt' message 2: 'role' is missing, not text",
        ),
        (
            {"prompt": [{"role": "user", "content": None}], "answer": "1"},
            {},
            "field 'prompt' message 1: 'content' is NoneType, not text",
        ),
        (
            {
                "prompt": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "answer": "1",
            },
            {},
            "field 'prompt' message 1: 'content' is list, not text",
        ),
        (
            {"prompt": [_user("hi"), {"role": "assistant", "content": "ok"}], "answer": "1"},
            {},
            "field 'prompt': the last message is from 'assistant'; a prompt ends with the "
            "user's message",
        ),
        ({"prompt": [_user("  ")], "answer": "1"}, {}, "field 'prompt': the last message has no"),
        ({"prompt": {"text": "hi"}, "answer": "1"}, {}, "field 'prompt' is dict, not text or a"),
        (
            {"prompt": "hi", "reward_model": {"ground_truth": ["1", "one"]}},
            {},
            "field 'reward_model.ground_truth' is list, not text",
        ),
        (
            {"prompt": "hi", "reward_model": {"style": "rule"}},
            {},
            "no field 'reward_model.ground_truth' (fields: prompt, reward_model; "
            "'reward_model' holds: style); set answer_key",
        ),
        (
            {"prompt": "hi", "answer": "1"},
            {"id_key": "extra_info.index"},
            "no field 'extra_info.index' (fields: prompt, answer); set id_key",
        ),
    ],
)
def test_bad_rows_name_file_row_and_key(
    tmp_path: Path, row: dict, kwargs: dict, message: str
) -> None:
    good = {"prompt": [_user("fine")], "answer": "1", "reward_model": {"ground_truth": "1"}}
    good = {k: v for k, v in good.items() if k in row}  # the same layout as the bad row
    path = _write_jsonl(tmp_path / "d" / "bad.jsonl", [good, row])
    with pytest.raises(DatasetError) as info:
        load_problems(path, **kwargs)
    row_number = 1 if "id_key" in kwargs else 2  # the first row already lacks the id
    assert str(info.value).startswith(f"d/bad.jsonl row {row_number}: {message}")


def test_bad_parquet_row_names_its_row(tmp_path: Path) -> None:
    rows = _verl_rows(3)
    rows[2]["prompt"] = [{"role": "assistant", "content": "x"}]
    path = _write_parquet(tmp_path / "verl" / "bad.parquet", rows)
    with pytest.raises(DatasetError, match=r"^verl/bad.parquet row 3: field 'prompt': the last"):
        load_problems(path)


# ---------------------------------------------------------------------------------------------
# Directories saved by `datasets` (Dataset.save_to_disk)


def test_saved_dataset_directory_errors_without_the_package(tmp_path: Path, monkeypatch) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    (saved / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DatasetError) as info:
        load_problems(saved)
    assert str(info.value).startswith(
        f"{tmp_path.name}/saved: a directory written by Dataset.save_to_disk; reading it needs "
        "the `datasets` package: pip install datasets"
    )


def test_directories_that_are_not_one_saved_split(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(DatasetError, match=r"plain: a directory, but not one written by Dataset"):
        load_problems(plain)
    splits = tmp_path / "dd"
    for split in ("test", "train"):
        (splits / split).mkdir(parents=True)
        (splits / split / "state.json").write_text("{}")
    (splits / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(DatasetError) as info:
        load_problems(splits)
    assert str(info.value) == (
        f"{tmp_path.name}/dd: a DatasetDict saved by save_to_disk (splits: test, train); point "
        f"at one split's directory, e.g. {splits / 'test'}"
    )


def test_saved_dataset_directory_loads_with_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="datasets not installed (optional)")
    rows = _verl_rows(4)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "verl_saved"))
    problems = load_problems(tmp_path / "verl_saved", id_key="extra_info.index")
    assert [(p.answer, p.key) for p in problems] == [
        (str(2 * i), f"{tmp_path.name}/verl_saved:{i}") for i in range(4)
    ]
    assert [dict(m) for m in problems[1].messages] == rows[1]["prompt"]
    assert problems[1].row["extra_info"] == rows[1]["extra_info"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(DatasetError, match=r"splits: train\); point at one split"):
        load_problems(tmp_path / "dd")
    assert len(load_problems(tmp_path / "dd" / "train")) == 4


# ---------------------------------------------------------------------------------------------
# Through the config


def test_env_config_with_a_conversational_file(tmp_path: Path) -> None:
    rows = [{"prompt": [_user(f"{i}+{i}?")], "answer": str(2 * i)} for i in range(6)]
    path = _write_jsonl(tmp_path / "d" / "conv.jsonl", rows)
    cfg = EnvConfig(
        name="math", dataset=str(path), eval_size=2, use_tool=False, system_prompt="Answer briefly."
    )
    spec = build_env(cfg)
    assert len(spec.task.train) == 4 and [p.answer for p in spec.task.held_out] == ["8", "10"]
    opening = asyncio.run(spec.make_env().reset(spec.task.held_out[0]))
    assert opening == [
        {"role": "system", "content": "Answer briefly."},
        _user(NO_TOOL_INSTRUCTIONS + "4+4?"),
    ]

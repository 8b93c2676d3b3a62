"""Prompt loading: files, datasets, generated sets, and errors naming file and row."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl.config.data import DataConfig
from skyrl.config.environment import EnvironmentConfig
from skyrl.data import arithmetic_rows, load_hf_dataset, load_prompt_file, load_prompts
from skyrl.data.generated import ARITHMETIC_EXAMPLE, ARITHMETIC_SYSTEM_PROMPT
from skyrl.envs import make_env_factory


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_jsonl_and_parquet(tmp_path):
    recs = [
        {"prompt": "1+1?", "data_source": "gsm", "answer": "2"},
        {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "extra_info": {"k": 1}},
    ]
    write_jsonl(tmp_path / "a.jsonl", recs)
    rows = load_prompt_file(tmp_path / "a.jsonl")
    assert [r.data_source for r in rows] == ["gsm", "a"]
    assert rows[1].extras == {"answer": "4", "k": 1} and rows[0].uid == "a-0"
    # a uid column with a null (parquet: one type per column) is no uid, not the text "None"
    pq.write_table(pa.Table.from_pylist([{"prompt": "p", "uid": None}]), tmp_path / "n.parquet")
    assert load_prompt_file(tmp_path / "n.parquet")[0].uid == "n-0"
    recs[0]["prompt"] = [{"role": "user", "content": "1+1?"}]  # parquet columns have one type
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "b.parquet")
    rows = load_prompt_file(tmp_path / "b.parquet")
    assert rows[1].prompt == [{"role": "user", "content": "2+2?"}]
    assert [r.data_source for r in rows] == ["gsm", "b"] and rows[1].extras["answer"] == "4"
    cfg = DataConfig(source="files", train_files=[str(tmp_path / "a.jsonl")])
    assert len(load_prompts(cfg)) == 2


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"question": "x"}, "row 2: missing column 'prompt' (has ['question'])"),
        ({"prompt": 3}, "row 2: prompt must be a string or a non-empty list of messages, got int"),
        (
            {"prompt": [{"role": "user"}]},
            "row 2: message 0 has no string 'content' (has ['role'])",
        ),
        (
            {"prompt": "x", "data_source": 5},
            "row 2: 'data_source' must be a non-empty string, got 5",
        ),
        # a dict without 'role' (ShareGPT's) was "not a {'role', 'content'} dict"
        (
            {"prompt": [{"from": "human", "value": "x"}]},
            "row 2: message 0 has no string 'role' (has ['from', 'value'])",
        ),
        ({"prompt": [{"role": 1, "content": "x"}]}, "row 2: message 0 has no string 'role'"),
        ({"prompt": ["x"]}, "row 2: message 0 is a str, not a {'role', 'content'} dict"),
        ({"prompt": " \n"}, "row 2: empty prompt"),  # whitespace only was a prompt
    ],
)
def test_malformed_row_names_file_and_row(tmp_path, bad, message):
    write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, bad])
    with pytest.raises(ValueError) as err:
        load_prompt_file(tmp_path / "bad.jsonl")
    assert str(err.value) == f"{tmp_path / 'bad.jsonl'}: {message}"


def test_invalid_json_and_parquet_row(tmp_path):
    (tmp_path / "j.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"j.jsonl: row 2: invalid JSON"):
        load_prompt_file(tmp_path / "j.jsonl")
    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}, {"prompt": ""}]), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p.parquet: row 2: empty prompt"):
        load_prompt_file(tmp_path / "p.parquet")


def test_a_file_without_rows_is_refused(tmp_path):
    (tmp_path / "blank.jsonl").write_text("\n \n")
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "none.parquet")
    for name in ["blank.jsonl", "none.parquet"]:
        with pytest.raises(ValueError) as err:
            load_prompt_file(tmp_path / name)
        assert str(err.value) == f"{tmp_path / name}: no rows"


def test_local_hf_dataset(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list([{"prompt": "q", "answer": "1", "data_source": "d"}])
    ds.save_to_disk(str(tmp_path / "ds"))
    [row] = load_hf_dataset(tmp_path / "ds")
    assert row.prompt == "q" and row.extras == {"answer": "1"} and row.data_source == "d"
    # a DatasetDict iterates over its split names: each was "row 1: expected an object, got str"
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    splits = "a DatasetDict of the splits ['test', 'train'], not a Dataset: pass one split"
    for given, where in [
        (tmp_path / "dd", str(tmp_path / "dd")),
        (datasets.load_from_disk(str(tmp_path / "dd")), "dataset"),
    ]:
        with pytest.raises(ValueError) as err:
            load_hf_dataset(given)
        assert str(err.value) == f"{where}: {splits}"


def test_arithmetic_deterministic_and_graded_by_math_env():
    a = arithmetic_rows(20, seed=1)
    assert [r.prompt for r in a] == [r.prompt for r in arithmetic_rows(20, seed=1)]
    assert [r.prompt for r in a] != [r.prompt for r in arithmetic_rows(20, seed=1, split="eval")]
    assert len({r.uid for r in a}) == 20
    env = make_env_factory(EnvironmentConfig(name="math"))()
    env.init(a[0].prompt, a[0].extras)
    assert env.step(f"ok\n#### {a[0].extras['answer']}").reward == 1.0
    env.init(a[0].prompt, a[0].extras)
    assert env.step(a[0].extras["answer"]).reward == 0.0  # strict format


def test_arithmetic_prompt_is_system_example_question():
    [row] = arithmetic_rows(1, seed=3)
    system, example_q, example_a, question = row.prompt
    assert system == {"role": "system", "content": ARITHMETIC_SYSTEM_PROMPT}
    assert "'#### <number>'" in system["content"]
    assert [example_q, example_a] == ARITHMETIC_EXAMPLE
    assert example_a["content"].endswith("\n#### 7")  # the example obeys the format it teaches
    expr = question["content"].removeprefix("What is ").removesuffix("?")
    assert question["role"] == "user" and str(eval(expr)) == row.extras["answer"]


def test_arithmetic_train_and_eval_are_disjoint_and_cover_every_kind():
    def questions(split):
        rows = arithmetic_rows(300, seed=0, split=split)  # eval has 312 problems
        return {r.prompt[-1]["content"] for r in rows}

    train, held_out = questions("train"), questions("eval")
    assert train and held_out and not train & held_out
    assert "What is 4 + 3?" not in train | held_out  # the worked example is never asked
    ops = {q.split()[3] for q in train}
    assert ops == {"+", "-", "*"}
    with pytest.raises(ValueError, match="split"):
        arithmetic_rows(1, seed=0, split="test")


def test_arithmetic_defaults_draw_distinct_problems():
    """data defaults (512 train, 64 eval prompts, seed 1234): every question distinct, while
    each split holds far more distinct problems (the draw used to repeat: 333 and 49)."""
    cfg = DataConfig()
    assert (cfg.source, cfg.num_train_prompts, cfg.num_eval_prompts) == ("arithmetic", 512, 64)
    for split, n in [("train", 512), ("eval", 64)]:
        questions = [r.prompt[-1]["content"] for r in load_prompts(cfg, split=split)]
        assert len(questions) == len(set(questions)) == n


def test_arithmetic_repeats_only_once_a_split_is_used_up():
    """Problems per kind: add_1d 9 x 9 = 81, sub_1d 9 x 10 = 90, mul_1d 8 x 8 = 64,
    add_2d_1d 40 x 9 = 360, add_2d 40 x 40 = 1600, sub_2d_1d 40 x 9 = 360: 2555, less the
    worked example = 2554, split by hash into 2242 train + 312 eval. Asking 700 eval rows:
    the first 312 are every eval problem once, then every problem again (624), then 76 more;
    so 76 problems appear 3 times and 236 twice."""
    with pytest.warns(UserWarning, match="700 eval prompts but 312 distinct"):
        rows = arithmetic_rows(700, seed=0, split="eval")
    questions = [r.prompt[-1]["content"] for r in rows]
    assert len(set(questions[:312])) == 312 and set(questions[312:]) == set(questions[:312])
    counts = sorted(Counter(questions).values())
    assert counts == [2] * 236 + [3] * 76
    with pytest.warns(UserWarning, match="distinct"):
        train = {r.prompt[-1]["content"] for r in arithmetic_rows(2300, seed=0)}
    assert len(train) == 2242 and not train & set(questions)


def test_reasoning_gym_source():
    cfg = DataConfig(source="reasoning_gym", num_train_prompts=4, num_eval_prompts=2)
    env_cfg = EnvironmentConfig(name="reasoning_gym", dataset="basic_arithmetic")
    train, ev = load_prompts(cfg, env_cfg), load_prompts(cfg, env_cfg, "eval")
    assert len(train) == 4 and len(ev) == 2 and train[0].prompt != ev[0].prompt


def rg_questions(dataset: str, num_train: int, num_eval: int, split: str) -> list[str]:
    cfg = DataConfig(
        source="reasoning_gym", num_train_prompts=num_train, num_eval_prompts=num_eval, seed=1
    )
    env_cfg = EnvironmentConfig(name="reasoning_gym", dataset=dataset)
    return [r.extras["entry"]["question"] for r in load_prompts(cfg, env_cfg, split)]


def test_reasoning_gym_eval_questions_are_held_out():
    """coin_flip has few distinct questions (~260): eval drawn as the generator at
    seed + 1_000_003 repeated 5 of 16 train questions (and one of its own). Eval now skips
    those; train stays the generator's first 64 entries at the seed."""
    import reasoning_gym

    train = rg_questions("coin_flip", 64, 16, "train")
    expected = reasoning_gym.create_dataset("coin_flip", size=64, seed=1)
    assert train == [entry["question"] for entry in expected]
    held_out = rg_questions("coin_flip", 64, 16, "eval")
    assert len(held_out) == len(set(held_out)) == 16 and not set(held_out) & set(train)
    assert held_out == rg_questions("coin_flip", 64, 16, "eval")  # seeded


def test_reasoning_gym_eval_repeats_what_is_held_out_with_a_warning():
    """tower_of_hanoi: 512 train draws hold every question the generator makes (90 distinct
    ones), so 8 x 16 = 128 eval draws find none held out: a warning, no eval rows. coin_flip
    with 512 train draws: some of its ~260 questions are left, fewer than 64 in 64 x 16 = 1024
    draws; each is repeated, every one once before any twice."""
    with pytest.warns(UserWarning, match="tower_of_hanoi: 8 eval prompts but 0 distinct"):
        assert rg_questions("tower_of_hanoi", 512, 8, "eval") == []
    with pytest.warns(UserWarning, match="coin_flip: 64 eval prompts but") as record:
        held_out = rg_questions("coin_flip", 512, 64, "eval")
    assert len(record) == 1
    train = set(rg_questions("coin_flip", 512, 64, "train"))
    distinct = len(set(held_out))
    assert len(held_out) == 64 and 0 < distinct < 64 and not set(held_out) & train
    assert held_out == (held_out[:distinct] * 64)[:64]


def test_same_stem_files_get_distinct_default_uids(tmp_path):
    """Two files named data.jsonl in different folders: each row's default uid is distinct
    (the stem plus the file's place in the list where stems repeat), stable across loads."""
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    write_jsonl(tmp_path / "x" / "data.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    write_jsonl(tmp_path / "y" / "data.jsonl", [{"prompt": "c"}])
    write_jsonl(tmp_path / "other.jsonl", [{"prompt": "d"}])
    files = [str(tmp_path / "x" / "data.jsonl"), str(tmp_path / "y" / "data.jsonl")]
    cfg = DataConfig(source="files", train_files=[*files, str(tmp_path / "other.jsonl")])
    uids = [r.uid for r in load_prompts(cfg)]
    assert uids == ["data.0-0", "data.0-1", "data.1-0", "other-0"]
    assert [r.uid for r in load_prompts(cfg)] == uids


def test_non_mapping_extra_info_is_kept(tmp_path):
    """extras hold every other column: an ``extra_info`` that is not an object stays as is."""
    write_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "extra_info": "note"}])
    assert load_prompt_file(tmp_path / "e.jsonl")[0].extras == {"extra_info": "note"}


@pytest.mark.parametrize("split", ["Train", "test", "validation"])
def test_load_prompts_refuses_an_unknown_split(tmp_path, split):
    """Any split but ``train`` read the eval files: ``split="Train"`` gave the eval rows."""
    write_jsonl(tmp_path / "t.jsonl", [{"prompt": "train q"}])
    write_jsonl(tmp_path / "e.jsonl", [{"prompt": "eval q"}])
    cfg = DataConfig(
        source="files",
        train_files=[str(tmp_path / "t.jsonl")],
        eval_files=[str(tmp_path / "e.jsonl")],
    )
    with pytest.raises(ValueError) as err:
        load_prompts(cfg, split=split)
    assert str(err.value) == f"split must be 'train' or 'eval', got {split!r}"
    assert [r.prompt for r in load_prompts(cfg, split="eval")] == ["eval q"]

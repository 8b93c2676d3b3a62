"""``load_checked_prompts`` / ``check_prompts``: rows validated with the file and row named,
prompt length counted as the agent loop renders it, the over-long policy (error / drop)."""

from __future__ import annotations

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate
from skyrl.data import check_prompts, load_checked_prompts
from skyrl.data.prompts import PromptRow
from skyrl.envs import TextEnv, make_env_factory, register_env
from skyrl.envs.tool_env import SYSTEM_PROMPT
from skyrl.generators import AgentLoop, LoopSettings
from skyrl.generators.chat import ChatTokens
from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import LocalEngine, run_serving
from skyrl.models import build_tiny_model

PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A ChatML template without tool support."""

LONG = "word " * 200  # ~200 tokens with the tiny model's tokenizer: over a 64-token limit


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def cfg_for(*overrides: str):
    return validate(skyrl.compose(["experiment=smoke", *overrides]))


def files_cfg(train: list[str], evals: list[str] = (), *overrides: str):
    return cfg_for(
        "data.source=files",
        f"data.train_files=[{','.join(train)}]",
        f"data.eval_files=[{','.join(evals)}]",
        *overrides,
    )


def rows(*prompts: str) -> list[dict]:
    return [{"prompt": p, "answer": "1"} for p in prompts]


def test_rows_pass_through_in_order(tmp_path, tok):
    a = write_jsonl(tmp_path / "a.jsonl", rows("q1", "q2"))
    b = write_jsonl(tmp_path / "b.jsonl", rows("e1"))
    cfg = files_cfg([a], [b])
    train = load_checked_prompts(cfg, "train", tok)
    assert [r.prompt for r in train] == ["q1", "q2"] and [r.uid for r in train] == ["a-0", "a-1"]
    assert [r.prompt for r in load_checked_prompts(cfg, "eval", tok)] == ["e1"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"prompt": "ok", "answer": "1"}\n{"question": "x"}\n',
            "row 2: missing column 'prompt' (has ['question'])",
        ),
        (  # a blank line is skipped but keeps its number: rows are line numbers
            '{"prompt": "ok", "answer": "1"}\n\n{oops\n',
            "row 3: invalid JSON (Expecting property name enclosed in double quotes)",
        ),
        ('{"prompt": "ok", "answer": "1"}\n[1, 2]\n', "row 2: expected an object, got list"),
        ('{"prompt": "ok", "answer": "1"}\n{"prompt": ""}\n', "row 2: empty prompt"),
        (  # json.loads raised RecursionError: a traceback, not a line
            '{"prompt": "ok", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "row 1: invalid JSON (nested too deeply)",
        ),
        (  # json.dumps writes a float NaN (a missing value) as NaN: no answer to grade against
            '{"prompt": "ok", "answer": NaN}\n',
            "row 1: 'answer' is NaN (environment 'math' grades against it)",
        ),
    ],
)
def test_bad_row_names_key_file_and_row(tmp_path, tok, content, message):
    (tmp_path / "ok.jsonl").write_text('{"prompt": "fine", "answer": "1"}\n')
    (tmp_path / "bad.jsonl").write_text(content)
    cfg = files_cfg([str(tmp_path / "ok.jsonl"), str(tmp_path / "bad.jsonl")])
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(cfg, "train", tok)
    assert err.value.key == "data.train_files[1]"
    assert err.value.message == f"{tmp_path / 'bad.jsonl'}: {message}"
    assert err.value.__context__ is None  # known bad input: no exception context


def test_missing_file_and_eval_files(tmp_path, tok):
    ok = write_jsonl(tmp_path / "ok.jsonl", rows("q"))
    cfg = files_cfg([ok], [ok, "nope.jsonl"])
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(cfg, "eval", tok)
    assert (err.value.key, err.value.message) == (
        "data.eval_files[1]",
        "nope.jsonl: file not found",
    )


def test_parquet_is_streamed_and_checked(tmp_path, tok, monkeypatch):
    from skyrl.data import prompts

    monkeypatch.setattr(prompts, "PARQUET_BATCH_ROWS", 2)  # 5 rows: 3 record batches
    records = rows("a", "b", "c", "d", LONG)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet")
    cfg = files_cfg([str(tmp_path / "p.parquet")], [], "generator.max_prompt_length=64")
    with pytest.raises(ConfigError, match=r"p.parquet: row 5: prompt is \d+ tokens"):
        check_prompts(cfg, "train", tok)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"x.parquet: not a readable parquet file"):
        check_prompts(files_cfg([str(tmp_path / "x.parquet")]), "train", tok)


def test_overlong_error_names_first_row_its_length_and_the_count(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", rows("short", LONG, "short too", LONG + LONG))
    cfg = files_cfg([path], [], "generator.max_prompt_length=64")
    chat, env = ChatTokens(tok), make_env_factory(cfg.environment)()
    n = len(chat.prompt_ids(env.init(LONG, {})[0]))
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(cfg, "train", tok)
    assert err.value.key == "data.train_files[0]"
    assert err.value.message == (
        f"{path}: row 2: prompt is {n} tokens (after the chat template), over "
        "generator.max_prompt_length=64; 2 of 4 train prompts are too long (shorten them, "
        "raise generator.max_prompt_length or set data.overlong_prompts=drop)"
    )


def test_overlong_drop_keeps_the_rest_and_warns_once_with_the_count(tmp_path, tok, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", rows("short", LONG, "short too", LONG))
    cfg = files_cfg([path], [], "generator.max_prompt_length=64", "data.overlong_prompts=drop")
    kept = load_checked_prompts(cfg, "train", tok)
    assert [r.prompt for r in kept] == ["short", "short too"]
    assert [r.uid for r in kept] == ["d-0", "d-2"]  # uids are the rows' places in the file
    assert capsys.readouterr().err.splitlines() == [
        "warning: data.overlong_prompts=drop: dropped 2 of 4 train prompts longer than "
        "generator.max_prompt_length=64 tokens"
    ]
    report = check_prompts(cfg, "train", tok)  # counting only: no rows kept
    assert (report.num_prompts, report.num_dropped) == (2, 2)
    assert 0 < report.max_prompt_tokens <= 64


def test_the_limit_is_inclusive(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", rows("What is 2 + 2?"))
    cfg = files_cfg([path])
    n = check_prompts(cfg, "train", tok).max_prompt_tokens
    at_limit = files_cfg([path], [], f"generator.max_prompt_length={n}")
    assert len(load_checked_prompts(at_limit, "train", tok)) == 1
    with pytest.raises(ConfigError, match=f"prompt is {n} tokens"):
        check_prompts(files_cfg([path], [], f"generator.max_prompt_length={n - 1}"), "train", tok)


def test_generated_rows_are_checked_too(tok):
    cfg = cfg_for("generator.max_prompt_length=40")  # arithmetic chats are ~100 tokens
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(cfg, "eval", tok)
    assert err.value.key == "data.source"
    assert err.value.message.startswith("arithmetic eval prompt 1: prompt is ")
    assert "4 of 4 eval prompts are too long" in err.value.message
    drop = cfg_for("generator.max_prompt_length=40", "data.overlong_prompts=drop")
    assert check_prompts(drop, "train", tok).num_dropped == 8
    assert check_prompts(cfg_for("data=fake"), "train", tok).num_prompts == 0


def test_too_few_generated_problems_warn_in_one_line_naming_the_key(tok, capsys):
    """The eval split has 312 arithmetic problems: 400 repeat some. The warning was Python's
    two lines, pointing at skyrl/data/__init__.py and its source line, naming no key."""
    cfg = cfg_for("data.num_eval_prompts=400", "generator.max_prompt_length=256")
    assert check_prompts(cfg, "eval", tok).num_prompts == 400
    assert capsys.readouterr().err.splitlines() == [
        "warning: data.num_eval_prompts: arithmetic: 400 eval prompts but 312 distinct eval "
        "problems; each is repeated (every one once before any twice)"
    ]


def test_the_envs_system_prompt_counts(tmp_path, tok):
    """environment=tools puts its system prompt before the question: the check counts it."""
    path = write_jsonl(tmp_path / "d.jsonl", rows("What is 2 + 2?"))
    row = PromptRow("What is 2 + 2?", "d", {})
    math = files_cfg([path])
    tools = files_cfg([path], [], "environment=tools", "environment.tool_format=tags")
    plain = check_prompts(math, "train", tok).max_prompt_tokens
    with_system = check_prompts(tools, "train", tok).max_prompt_tokens
    assert with_system > plain + len(tok.encode(SYSTEM_PROMPT))
    # native tools (the tiny template renders them): the declared tools count too
    native = files_cfg(
        [path], [], "environment=tools", "environment.tool_format=native",
        "generator.max_prompt_length=2048",
    )  # fmt: skip
    with_tools = check_prompts(native, "train", tok).max_prompt_tokens
    assert with_tools > with_system
    # exactly the ids the agent loop sends as the first request, with each env
    assert plain == len(_first_request(tok, math, row))
    assert with_system == len(_first_request(tok, tools, row))
    assert with_tools == len(_first_request(tok, native, row))


def test_native_tools_on_a_template_without_them_name_the_key(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", rows("What is 2 + 2?"))
    plain_chatml = AutoTokenizer.from_pretrained(build_tiny_model())
    plain_chatml.chat_template = PLAIN_CHATML
    cfg = files_cfg([path], [], "environment=tools", "environment.tool_format=native")
    with pytest.raises(ConfigError) as err:
        check_prompts(cfg, "train", plain_chatml)
    assert err.value.key == "environment.tool_format"
    assert "the chat template does not render tools" in str(err.value)


class _Recording(LocalEngine):
    """Answers every request with EOS and remembers its prompt ids."""

    def __init__(self, eos_id: int):
        super().__init__()
        self.eos_id = eos_id
        self.prompts: list[list[int]] = []

    def _serve_until(self, done):
        while not done.done():
            for r in self.take(block=True):
                self.prompts.append(list(r.prompt_ids))
                r.resolve(Completion([self.eos_id], [0.0], "stop"))


def _first_request(tok, cfg, row: PromptRow) -> list[int]:
    """The prompt ids the agent loop really sends for ``row``'s first turn."""
    engine = _Recording(tok.eos_token_id)
    loop = AgentLoop(engine, tok, make_env_factory(cfg.environment), LoopSettings(4096, 8, 1, 10.0))
    run_serving(engine, loop.run([row], 1, SamplingParams(max_tokens=8)))
    return engine.prompts[0]


@register_env("test_checked_failing_init")
class FailingInit(TextEnv):
    def init(self, prompt, extras):
        if prompt == "boom":
            raise RuntimeError("no boom please")
        return super().init(prompt, extras)


def test_env_init_failure_names_the_row(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", rows("fine", "boom"))
    cfg = files_cfg([path], [], "environment.name=test_checked_failing_init")
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(cfg, "train", tok)
    assert err.value.key == "data.train_files[0]"
    assert err.value.message == f"{path}: row 2: env.init failed: RuntimeError: no boom please"


@register_env("test_checked_none_content")
class NoneContent(TextEnv):
    """Reads the question from a field the rows lack: its opening message has no content."""

    def init(self, prompt, extras):
        return [{"role": "user", "content": extras.get("question")}], {}


def test_env_init_messages_are_checked_as_the_loop_checks_them(tmp_path, tok):
    """The agent loop refuses an opening without string contents (``checked_opening``): every
    trajectory ended with reward 0 (env_error) while the check at load passed it whenever the
    chat template renders None (``~`` joins it as the text "None"), and under any other
    template it blamed the template."""
    lenient = AutoTokenizer.from_pretrained(build_tiny_model())
    lenient.chat_template = PLAIN_CHATML.replace(" + ", " ~ ")
    path = write_jsonl(tmp_path / "d.jsonl", rows("What is 2 + 2?"))
    cfg = files_cfg([path], [], "environment.name=test_checked_none_content")
    for tokenizer in [lenient, tok]:
        with pytest.raises(ConfigError) as err:
            check_prompts(cfg, "train", tokenizer)
        assert (err.value.key, err.value.message) == (
            "data.train_files[0]",
            f"{path}: row 1: env.init returned unusable messages: messages[0]['content'] is "
            "None, not a string",
        )


def test_reasoning_gym_needs_a_known_dataset(tok):
    with pytest.raises(ConfigError) as err:
        check_prompts(cfg_for("data.source=reasoning_gym"), "train", tok)
    assert err.value.key == "environment.dataset"
    cfg = cfg_for("data=reasoning_gym", "environment=reasoning_gym", "environment.dataset=nope_ds")
    with pytest.raises(ConfigError) as err:
        check_prompts(cfg, "train", tok)
    assert (err.value.key, err.value.message) == (
        "environment.dataset",
        "reasoning-gym: Dataset 'nope_ds' not registered",
    )


def test_reasoning_gym_dataset_refusing_its_default_config_names_the_key(tok):
    """``composite`` is registered but its default config lists no datasets: reasoning-gym
    refuses it with a bare ``assert``, which was an AssertionError traceback."""
    cfg = cfg_for(
        "data=reasoning_gym", "environment=reasoning_gym", "environment.dataset=composite"
    )
    with pytest.raises(ConfigError) as err:
        check_prompts(cfg, "train", tok)
    assert (err.value.key, err.value.message) == (
        "environment.dataset",
        "reasoning-gym: dataset 'composite' cannot be generated from its default config: "
        "Must specify at least one dataset",
    )


def test_reasoning_gym_file_rows_need_an_entry(tmp_path, tok):
    """The env scores against ``extras["entry"]``: a file row without one is refused at load
    (each step used to raise KeyError, an env error and reward 0); generated rows carry it."""
    path = write_jsonl(tmp_path / "rg.jsonl", rows("What is 3 + 4?"))
    rg = ("environment=reasoning_gym", "environment.dataset=basic_arithmetic")
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(files_cfg([path], [], *rg), "train", tok)
    assert (err.value.key, err.value.message) == (
        "data.train_files[0]",
        f"{path}: row 1: no 'entry' (environment 'reasoning_gym' grades against it)",
    )
    generated = cfg_for("data=reasoning_gym", *rg, "data.num_train_prompts=3")
    assert len(load_checked_prompts(generated, "train", tok)) == 3


@pytest.mark.parametrize("content", ["", "\n", "\n  \n"])
def test_a_file_without_rows_names_its_key(tmp_path, tok, content):
    """An empty eval file used to turn evaluation off unnoticed (and an empty train file
    among others went unnoticed)."""
    ok = write_jsonl(tmp_path / "ok.jsonl", rows("q"))
    (tmp_path / "empty.jsonl").write_text(content)
    empty = str(tmp_path / "empty.jsonl")
    for cfg, split, key in [
        (files_cfg([ok], [empty]), "eval", "data.eval_files[0]"),
        (files_cfg([ok, empty], [ok]), "train", "data.train_files[1]"),
    ]:
        with pytest.raises(ConfigError) as err:
            check_prompts(cfg, split, tok)
        assert (err.value.key, err.value.message) == (key, f"{empty}: no rows")


QWEN3_STYLE = (
    "{%- for m in messages %}{%- if m.role == 'assistant' and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Renders the last assistant message with an empty ``<think>`` block, earlier ones without:
a second turn does not extend the first's context token for token."""


def test_a_template_that_re_renders_earlier_turns_is_refused_for_multi_turn(tmp_path, tok):
    # The loop raised this at the first observation of step 1, after the engines had loaded
    qwen3 = copy.deepcopy(tok)
    qwen3.chat_template = QWEN3_STYLE
    path = write_jsonl(tmp_path / "d.jsonl", rows("What is 2 + 2?"))
    with pytest.raises(ConfigError) as err:
        check_prompts(files_cfg([path], [], "generator.max_turns=2"), "train", qwen3)
    assert err.value.key == "generator.max_turns"
    assert "re-renders earlier turns" in err.value.message
    # one turn never renders a reply into a later context: fine; so is ChatML at any max_turns
    assert (
        check_prompts(files_cfg([path], [], "generator.max_turns=1"), "train", qwen3).num_prompts
        == 1
    )
    assert (
        check_prompts(files_cfg([path], [], "generator.max_turns=2"), "train", tok).num_prompts == 1
    )


def test_same_stem_files_get_distinct_uids(tmp_path, tok):
    """data.train_files=[x/data.jsonl,y/data.jsonl]: the rows' default uids name the file's
    place in the list (data.0-*, data.1-*), not data-0 twice."""
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    a = write_jsonl(tmp_path / "x" / "data.jsonl", rows("q1"))
    b = write_jsonl(tmp_path / "y" / "data.jsonl", rows("q2", "q3"))
    train = load_checked_prompts(files_cfg([a, b]), "train", tok)
    assert [r.uid for r in train] == ["data.0-0", "data.1-0", "data.1-1"]

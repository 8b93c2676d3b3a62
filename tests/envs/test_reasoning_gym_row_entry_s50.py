"""A reasoning-gym prompt file row whose ``entry`` is not an entry its dataset's scorer can
read is refused at load, naming the file and row; it passed the dry run and every
trajectory of the row was an env error (``env/errors``, nothing printed)."""

from __future__ import annotations

import json

import pytest
from cli_runs import one_line, run

from skyrl.envs.reasoning_gym_env import ReasoningGymEnv

ENTRY = {"question": "1 + 5 =", "answer": "6", "metadata": {"source_dataset": "chain_sum"}}


def test_init_refuses_an_entry_that_is_not_a_dict():
    with pytest.raises(ValueError, match=r"extras\['entry'\] must be a reasoning-gym entry"):
        ReasoningGymEnv().init("1 + 5 =", {"entry": "6", "dataset": "chain_sum"})


def test_init_refuses_an_entry_whose_own_answer_its_scorer_cannot_score():
    # chain_sum's scorer reads entry["answer"]: an entry without one fails its own answer
    with pytest.raises(ValueError, match="score_answer fails on the entry's own answer"):
        ReasoningGymEnv().init(
            "1 + 5 =", {"entry": {"question": "1 + 5 ="}, "dataset": "chain_sum"}
        )


def test_a_good_entry_opens():
    messages, _ = ReasoningGymEnv().init("1 + 5 =", {"entry": ENTRY, "dataset": "chain_sum"})
    assert messages == [{"role": "user", "content": "1 + 5 ="}]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (
            {"dataset": "chain_summ"},
            "reasoning-gym: Dataset 'chain_summ' not registered (did you mean 'chain_sum'?)",
        ),
        ({"entry": "6"}, "extras['entry'] must be a reasoning-gym entry"),
    ],
)
def test_the_dry_run_names_the_file_and_row(tmp_path, bad, error):
    rows = tmp_path / "rg.jsonl"
    good = {"prompt": "1 + 5 =", "entry": ENTRY, "answer": "6", "dataset": "chain_sum"}
    rows.write_text("\n".join(json.dumps(r) for r in [good, {**good, **bad}]))
    line = one_line(
        run(
            tmp_path,
            "skyrl-train",
            "experiment=smoke",
            "environment=reasoning_gym",
            "data.source=files",
            f"data.train_files=[{rows}]",
            "data.eval_files=[]",
            "trainer.dry_run=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        )
    )
    assert line.startswith(
        f"error: data.train_files[0]: {rows}: row 2: env.init failed: ValueError: {error}"
    ), line

"""The README's asynchronous-training paragraph says which generated groups are thrown away.
It said "nothing is generated and then discarded"; an asynchronous run with dynamic sampling
drops the groups its filter rejects (``experiment=smoke trainer.max_staleness=1
algorithm.dynamic_sampling=filter``: ``async/filtered_groups`` 6 at each of its 2 steps) and
a repeat of a prompt that waits a batch can outlast the bound and be regenerated
(``async/stale_groups``, docs/async.md). The README now names both, by the metrics that count
them."""

from __future__ import annotations

import re
from pathlib import Path

from skyrl.tracking import metric_names

README = Path(__file__).resolve().parents[1] / "README.md"


def async_paragraph() -> str:
    """The README's paragraph after the asynchronous-training command, on one line."""
    text = README.read_text()
    section = text.split("## Asynchronous training", 1)[1].split("\n## ", 1)[0]
    paragraph = section.split("```", 2)[2].strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def test_the_readme_does_not_say_async_training_discards_nothing():
    paragraph = async_paragraph()
    assert "Staleness is bounded when a prompt group is admitted" in paragraph
    assert not re.search(r"nothing is generated and then (discarded|thrown away)", paragraph)


def test_the_readme_names_the_metrics_of_the_dropped_groups():
    named = set(re.findall(r"`(async/[a-z_]+)`", async_paragraph()))
    assert {metric_names.ASYNC_FILTERED_GROUPS, metric_names.ASYNC_STALE_GROUPS} <= named

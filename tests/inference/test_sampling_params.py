"""``SamplingParams``: a request's sampling is refused at construction, naming the field,
when an engine could not use it (the hf engine then failed the whole batch, or misread it)."""

import pytest

from skyrl.config.errors import ConfigError
from skyrl.inference.base import SamplingParams


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # a str is a list of its characters: "abc" read as the stops "a", "b", "c" (vLLM)
        # and, in the hf engine, as holding "" ("" in "abc"): "empty stop string"
        ("stop", "</answer>", "stop: must be a list of strings, got '</answer>'"),
        ("stop", ["</answer>", 7], "stop: must be a list of strings, got ['</answer>', 7]"),
        # the hf engine compared "x" with ints: a TypeError for every request of the batch
        ("stop_token_ids", ["x"], "stop_token_ids: must be a list of token ids (ints), got ['x']"),
        # '<=' between a str and an int, raised out of serve: serving stopped
        ("max_tokens", "8", "max_tokens: must be an int, got '8'"),
        # 2.5 tokens: the hf engine ran the row as long as its batch mates' max_tokens
        ("max_tokens", 2.5, "max_tokens: must be an int, got 2.5"),
        # torch.Generator.manual_seed refused it: every request of the batch failed
        ("seed", 1.5, "seed: must be an int or None, got 1.5"),
        ("n", 2.0, "n: must be an int, got 2.0"),
        # generate_batch gave no sample per prompt, without a word (vLLM refuses n < 1)
        ("n", 0, "n: must be >= 1, got 0"),
    ],
)
def test_a_field_an_engine_cannot_use_is_refused_by_name(field, value, message):
    with pytest.raises(ConfigError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == message


def test_usable_values_pass():
    sp = SamplingParams(n=3, max_tokens=0, seed=-1, stop=["a", "b"], stop_token_ids=[1, 2])
    assert (sp.n, sp.max_tokens, sp.seed) == (3, 0, -1)
    assert SamplingParams(stop=("</answer>",), seed=None).stop == ("</answer>",)

"""``SamplingParams``: a value of the wrong type or sign is one ``ConfigError`` naming the
field, not a ``TypeError`` from a comparison deep in the checks or the engine, nor a
silently different request."""

import pytest

from skyrl.config.errors import ConfigError
from skyrl.inference.base import SamplingParams


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # read by the hf engine as 0: an empty completion, finish_reason "length", no word
        # (vLLM refused it for that request: "max_tokens must be at least 1")
        ("max_tokens", -5, "max_tokens: must be >= 0, got -5"),
        # passed `top_k >= 1`; the hf engine's topk(2.5) then failed the whole batch with
        # "topk(): argument 'k' must be int, not float"
        ("top_k", 2.5, "top_k: must be an int, got 2.5"),
        # a bool is an int: max_tokens=True sampled one token
        ("max_tokens", True, "max_tokens: must be an int, got True"),
        ("seed", True, "seed: must be an int or None, got True"),
        # TypeError: '>=' not supported between instances of 'str' and 'float'
        ("temperature", "0.7", "temperature: must be a number, got '0.7'"),
        # TypeError: '<' not supported between instances of 'int' and 'str'
        ("top_p", "1", "top_p: must be a number, got '1'"),
        ("min_p", None, "min_p: must be a number, got None"),
    ],
)
def test_a_value_of_the_wrong_type_or_sign_is_refused_by_name(field, value, message):
    with pytest.raises(ConfigError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == message


def test_ints_stand_for_floats():
    sp = SamplingParams(temperature=1, top_p=1, min_p=0, top_k=5, max_tokens=0)
    assert (sp.temperature, sp.top_p, sp.min_p, sp.top_k, sp.max_tokens) == (1, 1, 0, 5, 0)

"""The generator tests' tokenizer: the tiny model's."""

import pytest
from transformers import AutoTokenizer

from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())

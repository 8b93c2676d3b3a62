"""``exception_line``: a library's (multi-line) error inside one line."""

from skyrl.config.errors import EXCEPTION_LINE_CHARS, exception_line


def test_a_first_line_that_ends_in_a_colon_is_joined_to_the_end_of_the_sentence():
    # transformers' message for a folder without a tokenizer (its first line said nothing)
    exc = ValueError(
        "Couldn't instantiate the backend tokenizer from one of: \n"
        "(1) a `tokenizers` library serialization file, \n"
        "(2) a slow tokenizer instance to convert or \n"
        "(3) an equivalent slow tokenizer class to instantiate and convert. \n"
        "You need to have sentencepiece or tiktoken installed to convert a slow tokenizer."
    )
    assert exception_line(exc) == (
        "ValueError: Couldn't instantiate the backend tokenizer from one of: (1) a `tokenizers` "
        "library serialization file, (2) a slow tokenizer instance to convert or (3) an "
        "equivalent slow tokenizer class to instantiate and convert."
    )


def test_any_other_first_line_stands_alone():
    exc = OSError("no weights in /m.\nTraceback-ish detail\nmore")
    assert exception_line(exc) == "OSError: no weights in /m."
    assert exception_line(OSError("cannot read GGUF\n  File x.py")) == "OSError: cannot read GGUF"
    assert exception_line(KeyError()) == "KeyError"  # no message: the type alone
    assert exception_line(RuntimeError("  \n\n")) == "RuntimeError"


def test_joined_lines_stop_at_the_cap_at_a_word():
    first = "x" * 10 + ":"
    words = " ".join(["word"] * 200)  # one 999-character line, no sentence end
    line = exception_line(ValueError(f"{first}\n{words}"))
    # "ValueError: " + at most EXCEPTION_LINE_CHARS of text, cut after a whole "word", + " ..."
    text = line.removeprefix("ValueError: ")
    assert text.endswith("word ...") and len(text) <= EXCEPTION_LINE_CHARS + len(" ...")
    assert text.startswith(first + " word word")


def test_a_long_first_line_is_kept_whole_as_before():
    long = "y " * 400 + "end"  # 803 characters on one line
    assert exception_line(ValueError(long + "\nnext")) == f"ValueError: {long}"

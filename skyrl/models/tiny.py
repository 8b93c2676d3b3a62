"""Tiny random causal LMs with a tokenizer trained locally, for tests and ``experiment=smoke``.

No model hub is needed: the tokenizer is a byte-level BPE trained with the
``tokenizers`` library on a small built-in corpus, wrapped in
``PreTrainedTokenizerFast`` with ChatML special tokens and a Jinja chat
template (system / user / assistant / tool roles, ``add_generation_prompt``).
The model is built from a config with a fixed seed and saved with
``save_pretrained``, so ``from_pretrained`` (transformers or vLLM) loads it.

Outputs are deterministic and cached under a content key: a second call with
the same arguments returns the cached directory without rebuilding.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call functions. Their signatures, within <tools></tools>:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each call, return a JSON object with the function name and "
    "arguments within <tool_call></tool_call> tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) }}"
    "{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' and tools %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
"""ChatML: every message is ``<|im_start|>role\\ncontent<|im_end|>\\n``. With ``tools``
(Qwen2.5's format): the signatures in a system message, an assistant's calls as
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, tool results as a user
message in ``<tool_response>`` tags (without ``tools``, a tool message is plain ChatML)."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 + 7? Think step by step, then answer. The answer is 19. #### 19",
    "Compute 3 * 4 - 5 = 7. Final answer: \\boxed{7}",
    "system user assistant tool calculator python result error answer question",
    "<tool>calculator</tool> <call>2 + 2</call> <result>4</result> <answer>4</answer>",
    "def add(a, b):\n    return a + b\nprint(add(1, 2))",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000 + - * / = ( )",
    "You are a helpful assistant. Please reason step by step.",
    "Let's solve this. First we add the numbers, then we multiply.",
]


def default_cache() -> Path:
    """``$SKYRL_TINY_CACHE`` (``~`` expanded, made absolute: a worker elsewhere loads the model
    by this path), else ``skyrl-tiny`` in the system temp dir."""
    folder = os.environ.get("SKYRL_TINY_CACHE") or Path(tempfile.gettempdir()) / "skyrl-tiny"
    return Path(folder).expanduser().absolute()


DEFAULT_CACHE: Path | None = None
"""A cache folder for this process that overrides ``default_cache()`` (tests set it); None:
``default_cache()``, read at each build, so ``SKYRL_TINY_CACHE`` set after import (a notebook
cell) is where the next build goes."""


def cache_dir() -> Path:
    """Where ``build_tiny_model`` caches its builds now: ``DEFAULT_CACHE`` if set, else
    ``default_cache()``."""
    return DEFAULT_CACHE if DEFAULT_CACHE is not None else default_cache()


def build_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _cache_key(arch: str, seed: int, config_kwargs: dict, vocab_size: int) -> str:
    blob = json.dumps(
        {
            "arch": arch,
            "seed": seed,
            "cfg": config_kwargs,
            "vocab": vocab_size,
            "v": 2,
            "template": hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:8],
        },  # fmt: skip
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _model_config(arch: str, vocab_size: int, tokenizer, **overrides):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    common.update(overrides)
    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, got {arch!r}")
    return classes[arch](**common)


def build_tiny_model(
    dir: str | os.PathLike | None = None,
    arch: str = "qwen2",
    seed: int = 0,
    vocab_size: int = 512,
    **config_overrides,
) -> str:
    """Write a tiny random fp32 causal LM plus tokenizer and return its directory.

    ``dir=None`` uses a cache folder keyed by the arguments, in ``cache_dir()``
    (``$SKYRL_TINY_CACHE`` as it is at this call, or the temp dir). An explicit ``dir`` is
    filled by copying the cached build. ``config_overrides`` go to the model config (e.g.
    ``num_hidden_layers=4``).
    """
    key = _cache_key(arch, seed, config_overrides, vocab_size)
    cached = cache_dir() / f"{arch}-{key}"
    if not (cached / "done").exists():
        _build_into(cached, arch, seed, vocab_size, config_overrides)
    if dir is None:
        return str(cached)
    dest = Path(dir)
    dest.mkdir(parents=True, exist_ok=True)
    for item in cached.iterdir():
        if item.name != "done":
            shutil.copy2(item, dest / item.name)
    return str(dest)


def _build_into(out: Path, arch: str, seed: int, vocab_size: int, overrides: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tiny_tokenizer(vocab_size)
    config = _model_config(arch, len(tokenizer), tokenizer, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # A wider init than 0.02 so the random model is not uniform. One generator draws
    # every matrix in turn, so no two are equal (k and v, gate and up, the layers, the
    # untied embedding and head): a test that swaps two of them sees it.
    draws = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2, generator=draws)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # Built beside ``out`` so the rename stays on one filesystem (from the system temp dir
    # to another mount it fails with EXDEV).
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "done").write_text("ok")
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still there only when another build won


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished build ``tmp`` to ``out``: atomic, so concurrent builders race
    benignly (a loser keeps the winner's build)."""
    try:
        os.replace(tmp, out)
        return
    except OSError:
        if (out / "done").exists():  # a lost race: keep theirs
            return
        if not out.is_dir():
            raise
    _replace_stale(tmp, out)


def _replace_stale(tmp: Path, out: Path) -> None:
    """Replace ``out``, a build without ``done``, by ``tmp``. A temp-dir cleaner ages ``done``
    out first (it is only stat'ed, never read, while a load reads the rest); the rename over
    the non-empty folder then failed on every later build. Under a file lock, and ``done``
    checked again there, so no complete build is moved away from under a reader."""
    from filelock import FileLock

    with FileLock(f"{out}.lock"):
        if (out / "done").exists():  # another builder replaced it while we waited
            return
        stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale-", dir=out.parent))
        try:
            os.replace(out, stale / out.name)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(stale, ignore_errors=True)

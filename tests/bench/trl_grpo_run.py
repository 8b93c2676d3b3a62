"""TRL's side of ``bench_trl.py``: GRPO steps with ``trl.GRPOTrainer``, timed per phase.

Runs inside the TRL venv (``.venv-trl``), never the project's: it imports nothing from
skyrl except ``skyrl/envs/grading.py``, loaded by file path (stdlib + math-verify), so the
reward is skyrl's math env's own grading code.

Run (``bench_trl.py`` does): ``.venv-trl/bin/python tests/bench/trl_grpo_run.py --model DIR
--prompts prompts.jsonl --steps 5 --out result.json [--gradient-checkpointing]``.
``prompts.jsonl`` holds the prompts in step order (``{"prompt": [messages], "answer": "7"}``);
the dataset is not shuffled, so step k trains on rows 4(k-1)..4k-1, each sampled
``--num-generations`` times.

Phases of a step (``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback``):
- generate: ``GRPOTrainer._generate`` (chat template, tokenize, ``model.generate``, decode);
- forward: logprob forwards outside backprop (``_get_per_token_logps_and_entropies`` with
  grad off; none here: on-policy, beta=0, no vLLM);
- train: from the end of ``_prepare_inputs`` (generation, rewards, advantages) to the step's
  end: loss forward, backward, gradient clipping, the AdamW step;
- the rest of the step (rewards, advantages, padding) is "other" in the bench's table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

THREADS = 2
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(THREADS))
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

GRADING = Path(__file__).resolve().parents[2] / "skyrl" / "envs" / "grading.py"
"""skyrl's answer extraction and math-verify grading (what its ``math`` env scores with)."""


def load_grade():
    """``grade(text, gold) -> float`` from skyrl's grading module, without importing skyrl."""
    spec = importlib.util.spec_from_file_location("skyrl_grading", GRADING)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grade


class PhaseClock:
    """Seconds of each phase of the current step, and one record per finished step."""

    def __init__(self) -> None:
        self.records: list[dict[str, float]] = []
        self._reset()

    def _reset(self) -> None:
        self.begin_t = self.prepared_t = 0.0
        self.phases = {"generate_s": 0.0, "forward_s": 0.0}
        self.tokens: dict[str, float] = {}

    def begin(self) -> None:
        self._reset()
        self.begin_t = time.perf_counter()

    def end(self, step: int) -> None:
        end_t = time.perf_counter()
        train_s = end_t - (self.prepared_t or self.begin_t)
        record = {"step": step, "step_s": end_t - self.begin_t, "train_s": train_s, "sync_s": 0.0}
        self.records.append(record | self.phases | self.tokens)


class TimedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with its generation, logprob forwards and input preparation timed."""

    clock: PhaseClock

    def _generate(self, prompts):
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        self.clock.phases["generate_s"] += time.perf_counter() - t0
        return out

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if torch.is_grad_enabled():  # the loss forward: part of train
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        t0 = time.perf_counter()
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.clock.phases["forward_s"] += time.perf_counter() - t0
        return out

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:
            self.clock.prepared_t = time.perf_counter()
            prompt_mask, completion_mask = inputs["prompt_mask"], inputs["completion_mask"]
            rows = prompt_mask.size(0)
            self.clock.tokens = {
                "tokens": float(prompt_mask.sum() + completion_mask.sum()),
                "loss_tokens": float(completion_mask.sum()),
                "padded_tokens": float(rows * (prompt_mask.size(1) + completion_mask.size(1))),
                "sequences": float(rows),
            }
        return inputs


class StepTimer(TrainerCallback):
    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.end(state.global_step)


def grpo_config(args: argparse.Namespace, output_dir: str) -> GRPOConfig:
    """The bench's GRPO step: one generation batch, one optimizer step, no KL, fp32 on CPU."""
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=args.seed,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=args.num_prompts * args.num_generations,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",  # token mean over the batch, like skyrl's loss_reduction=token_mean
        scale_rewards="group",  # std-normalised group advantages, like skyrl's grpo
        shuffle_dataset=False,
        use_vllm=False,
        gradient_checkpointing=args.gradient_checkpointing,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="local HF model directory (with tokenizer)")
    p.add_argument("--prompts", required=True, help="jsonl: prompt (chat messages), answer")
    p.add_argument("--out", required=True, help="where to write the per-step records (json)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--num-generations", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--gradient-checkpointing", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(THREADS)
    grade = load_grade()

    def arithmetic_reward(completions, answer, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [grade(text, gold) for text, gold in zip(texts, answer, strict=True)]

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line]
    needed = args.steps * args.num_prompts
    if len(rows) < needed:
        sys.exit(f"error: {args.prompts} has {len(rows)} prompts, {needed} needed")
    dataset = Dataset.from_list(rows[:needed])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    clock = PhaseClock()
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=arithmetic_reward,
            args=grpo_config(args, output_dir),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer(clock)],
        )
        trainer.clock = clock
        trainer.train()
    rewards = [r.get("reward") for r in trainer.state.log_history if "reward" in r]
    result = {
        "steps": clock.records,
        "rewards": rewards,
        "gradient_checkpointing": args.gradient_checkpointing,
        "threads": torch.get_num_threads(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""``GeneratorOutput``: rollouts as training sequences, its invariants, and the tensor batch.

One row per training sequence. Whole-trajectory mode: one row per trajectory
(prompt + every turn; observations and template tokens have loss mask 0), or
several when a trajectory FORKS: a turn whose prompt does not extend the
previous prompt + response (an external agent edited its history,
``skyrl.serve.reconcile``) starts a new row, and ``forks`` says why.
Step-wise mode: one row per LLM turn (prompt = the full context at that turn,
response = that turn's sampled tokens), ``is_last_step`` True exactly on each
trajectory's last turn, the reward on the last step (0 on the others).
Rows are grouped by prompt (``uids``), then by trajectory, in turn order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TurnVersions = tuple[int, int]
"""``(policy version when the turn's request was dispatched, when it finished)``."""


@dataclass
class GeneratorOutput:
    """Per-row token lists and metadata; ``B`` = number of rows."""

    prompt_token_ids: list[list[int]]
    """[B][P_i] prompt tokens of each row."""
    response_token_ids: list[list[int]]
    """[B][R_i] response tokens of each row (generated, plus observations in whole-trajectory mode)."""
    loss_masks: list[list[int]]
    """[B][R_i] 1 on tokens the model sampled, 0 on observations / template / appended tokens."""
    rollout_logprobs: list[list[float]]
    """[B][R_i] engine logprob of each sampled response token (0 where loss mask is 0)."""
    rewards: list[float]
    """[B] trajectory reward on its last row, 0 on earlier steps."""
    uids: list[str]
    """[B] prompt id (shared by all samples and turns of one prompt)."""
    trajectory_ids: list[str]
    """[B] ``<uid>/<sample index>``."""
    is_last_step: list[bool]
    """[B] True on the last row of each trajectory (every row in whole-trajectory mode)."""
    data_sources: list[str]
    """[B] the prompt's data source."""
    stop_reasons: list[str]
    """[B] ``stop``, ``length`` (turn hit max tokens), ``budget`` (trajectory token budget ran out),
    ``max_turns``, or ``env_error``."""
    policy_versions: list[list[TurnVersions]]
    """[B][turns of the row] ``(version at dispatch, version at finish)`` of each LLM turn the
    row holds: one per row in step-wise mode, every turn of the trajectory otherwise (none for
    a trajectory whose env failed before its first turn)."""
    forks: list[str] = field(default_factory=list)
    """[B] why the row does not extend the previous row of its trajectory (``""``: it does,
    or it is the trajectory's first row; else the reconciler's reason, e.g. ``edited``).
    Built without it (older callers), every row is ``""``; a list of another length is an
    error (``validate``)."""
    step_wise: bool = False
    """Whether rows are turns (True) or whole trajectories (False)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Rollout metrics (see ``skyrl.generators.metrics``)."""

    def __post_init__(self) -> None:
        if not self.forks:
            self.forks = [""] * len(self.uids)

    def __len__(self) -> int:
        return len(self.uids)

    @property
    def has_forks(self) -> bool:
        """Whether some trajectory has several rows although rows are whole trajectories."""
        return any(self.forks)

    @property
    def multi_row(self) -> bool:
        """Whether a trajectory may span several rows (step-wise, or forked): advantages then
        come from each trajectory's last row and prompts hold varying numbers of rows."""
        return self.step_wise or self.has_forks

    def select_rows(self, rows: list[int]) -> GeneratorOutput:
        """A new output holding ``rows`` (in that order); metrics are kept."""
        picked = {name: [getattr(self, name)[i] for i in rows] for name in ROW_FIELDS}
        return GeneratorOutput(**picked, step_wise=self.step_wise, metrics=dict(self.metrics))

    @staticmethod
    def concat(parts: list[GeneratorOutput]) -> GeneratorOutput:
        """Rows of every part in order; metrics of the first part."""
        joined = {name: [x for p in parts for x in getattr(p, name)] for name in ROW_FIELDS}
        return GeneratorOutput(
            **joined, step_wise=parts[0].step_wise, metrics=dict(parts[0].metrics)
        )

    def validate(self) -> None:
        """Raise ``ValueError`` naming the row / trajectory of the first broken invariant."""
        n = len(self.uids)
        for name in ROW_FIELDS:
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"GeneratorOutput.{name} has {len(getattr(self, name))} rows, uids has {n}"
                )
        for i in range(n):
            r = len(self.response_token_ids[i])
            if self.step_wise and len(self.policy_versions[i]) != 1 and r:
                raise ValueError(f"row {i}: a step-wise row holds one turn's policy versions")
            if len(self.loss_masks[i]) != r or len(self.rollout_logprobs[i]) != r:
                raise ValueError(
                    f"row {i}: loss mask / logprobs length differ from response length {r}"
                )
        seen: set[str] = set()
        prev_tid = None
        turn = 0  # rows of ``tid`` before row i (its rows are contiguous): linear, not quadratic
        for i, tid in enumerate(self.trajectory_ids):
            if tid != prev_tid:
                if tid in seen:
                    raise ValueError(f"row {i}: trajectory {tid!r} rows are not contiguous")
                seen.add(tid)
                prev_tid = tid
                turn = 0
            else:
                turn += 1
            last = i + 1 == n or self.trajectory_ids[i + 1] != tid
            if self.is_last_step[i] != last:
                raise ValueError(
                    f"row {i}: is_last_step={self.is_last_step[i]} but trajectory {tid!r} {'ends' if last else 'continues'} here"
                )
            if not last and self.rewards[i] != 0:
                raise ValueError(f"row {i}: reward {self.rewards[i]} on a non-last step of {tid!r}")
            continues = i > 0 and self.trajectory_ids[i - 1] == tid
            if not self.step_wise and continues and not self.forks[i]:
                raise ValueError(
                    f"row {i}: whole-trajectory mode has one row per trajectory unless it forks, "
                    f"{tid!r} has more"
                )
            if self.step_wise and continues and not self.forks[i]:
                check_prefix(
                    self.prompt_token_ids[i - 1] + self.response_token_ids[i - 1],
                    self.prompt_token_ids[i],
                    tid,
                    turn=turn,
                )
            if self.uids[i] != tid.rsplit("/", 1)[0]:
                raise ValueError(
                    f"row {i}: trajectory {tid!r} does not belong to uid {self.uids[i]!r}"
                )


ROW_FIELDS = (
    "prompt_token_ids", "response_token_ids", "loss_masks", "rollout_logprobs", "rewards",
    "uids", "trajectory_ids", "is_last_step", "data_sources", "stop_reasons", "policy_versions",
    "forks",
)  # fmt: skip
"""The per-row list fields, in constructor order."""


def check_prefix(previous: list[int], prompt: list[int], trajectory_id: str, turn: int) -> None:
    """Token-prefix invariant: turn ``turn``'s prompt extends the previous prompt + response."""
    if prompt[: len(previous)] != previous:
        at = next(
            (k for k, (a, b) in enumerate(zip(previous, prompt, strict=False)) if a != b),
            min(len(previous), len(prompt)),
        )
        raise ValueError(
            f"trajectory {trajectory_id!r}: turn {turn}'s prompt does not extend turn {turn - 1}'s "
            f"prompt + response (first difference at token {at})"
        )


def to_training_batch(output: GeneratorOutput, pad_token_id: int = 0):
    """``TrainingInputBatch`` with right-padded ``[B, S]`` tensors aligned with ``input_ids``.

    ``loss_mask`` and ``rollout_logprobs`` at position t refer to token t (0 on the
    prompt and padding); ``rewards`` is ``[B]``; the metadata (``RowMetadata``) carries
    ``uids``, ``trajectory_ids``, ``is_last_step``, ``data_sources``, ``stop_reasons``,
    ``policy_versions`` and ``forks``.
    """
    import torch

    from skyrl.batch import TrainingInputBatch
    from skyrl.batch.training_batch import RowMetadata

    output.validate()
    seqs = [p + r for p, r in zip(output.prompt_token_ids, output.response_token_ids, strict=True)]
    # at least one (padding) position: rows with no token (trajectories that failed before
    # their first turn) are zero-loss rows, and a batch of only such rows is still 2-D
    b, s = len(seqs), max((len(x) for x in seqs), default=1) or 1
    input_ids = torch.full((b, s), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, s), dtype=torch.long)
    loss_mask = torch.zeros((b, s), dtype=torch.float32)
    logprobs = torch.zeros((b, s), dtype=torch.float32)
    for i, seq in enumerate(seqs):
        p, n = len(output.prompt_token_ids[i]), len(seq)
        input_ids[i, :n] = torch.tensor(seq, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, p:n] = torch.tensor(output.loss_masks[i], dtype=torch.float32)
        logprobs[i, p:n] = torch.tensor(output.rollout_logprobs[i], dtype=torch.float32)
    return TrainingInputBatch(
        {
            "input_ids": input_ids,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "rollout_logprobs": logprobs,
            "rewards": torch.tensor(output.rewards, dtype=torch.float32),
        },
        RowMetadata(
            uids=list(output.uids),
            trajectory_ids=list(output.trajectory_ids),
            is_last_step=list(output.is_last_step),
            data_sources=list(output.data_sources),
            stop_reasons=list(output.stop_reasons),
            policy_versions=[list(v) for v in output.policy_versions],
            forks=list(output.forks),
        ),
    )

"""Pluggable dynamic-sampling group filters (``algorithm.dynamic_filter``): the registry, import
paths, the errors, and ``SyncRollouts``' selection under a filter (no engine: ``generate`` is
replaced by hand-built rounds)."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest

from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.data import DataConfig
from skyrl.config.environment import EnvironmentConfig
from skyrl.config.errors import ConfigError
from skyrl.config.generator import GeneratorConfig
from skyrl.config.root import SkyRLConfig
from skyrl.config.trainer import TrainerConfig
from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts import dynamic_sampling as ds
from skyrl.rollouts.sync import SyncRollouts
from skyrl.tracking import metric_names as names


@ds.GROUP_FILTERS.register("test_pass_band")
def pass_band(group: GeneratorOutput) -> bool:
    """Keep a group whose mean last-step reward is in [0.25, 0.75]."""
    rewards = [r for r, last in zip(group.rewards, group.is_last_step, strict=True) if last]
    return 0.25 <= statistics.fmean(rewards) <= 0.75


def _output(groups: dict[str, list[float]], turns: int = 1) -> GeneratorOutput:
    """``turns`` step-wise rows per sample (reward on the last, 0 before); ``turns=1``: one
    whole-trajectory row per sample."""
    rows = [
        (uid, k, t, r if t == turns - 1 else 0.0)
        for uid, rewards in groups.items()
        for k, r in enumerate(rewards)
        for t in range(turns)
    ]
    return GeneratorOutput(
        prompt_token_ids=[[1, 2] for _ in rows],
        response_token_ids=[[5, 6] for _ in rows],
        loss_masks=[[1, 1] for _ in rows],
        rollout_logprobs=[[0.0, 0.0] for _ in rows],
        rewards=[r for *_, r in rows],
        uids=[u for u, *_ in rows],
        trajectory_ids=[f"{u}/{k}" for u, k, *_ in rows],
        is_last_step=[t == turns - 1 for _, _, t, _ in rows],
        data_sources=["a"] * len(rows),
        stop_reasons=["stop"] * len(rows),
        policy_versions=[[(0, 0)] for _ in rows],
        step_wise=turns > 1,
    )


def _old_informative_uids(output: GeneratorOutput) -> list[str]:
    """``informative_uids`` before filters were pluggable, verbatim."""
    rewards: dict[str, set[float]] = defaultdict(set)
    for uid, reward, last in zip(output.uids, output.rewards, output.is_last_step, strict=True):
        if last:
            rewards[uid].add(reward)
    return [uid for uid in ds.group_rows(output) if len(rewards[uid]) > 1]


@pytest.mark.parametrize("turns", [1, 3])
def test_default_filter_is_the_zero_variance_test(turns):
    # step-wise (turns=3): the earlier turns' reward 0 must not make "b" (all 1) look informative
    out = _output({"a": [1, 0], "b": [1, 1], "c": [0, 0], "d": [0, 0.5], "e": [2, 2]}, turns)
    assert AlgorithmConfig().dynamic_filter == "reward_variance"
    default = ds.group_filter(AlgorithmConfig().dynamic_filter)
    assert default is ds.reward_variance
    assert ds.informative_uids(out) == ds.informative_uids(out, default) == ["a", "d"]
    assert _old_informative_uids(out) == ["a", "d"]
    assert ds.replace_flat_groups(out, 7) == ds.replace_flat_groups(out, 7, default)


# Two prompts per round, four samples each; "var" = the default keeps it, "band" = pass_band does.
ROUNDS = [
    {"a": [1, 1, 1, 0.5], "b": [1, 0, 0, 0]},  # a: mean 0.875 var; b: 0.25 var, band
    {"c": [0, 0, 0, 0], "d": [1, 1, 0, 0]},  # c: neither; d: 0.5 var, band
    {"e": [0.5, 0, 0, 0], "f": [1, 1, 1, 0]},  # e: 0.125 var; f: 0.75 var, band
]


def _source(
    dynamic_sampling: str, dynamic_filter: str, rounds=None, **algorithm
) -> tuple[SyncRollouts, list[int]]:
    """A ``SyncRollouts`` whose ``generate`` returns ``rounds`` (default ``ROUNDS``: dicts
    for ``_output``, or outputs) in turn (and records how many were drawn);
    train_batch_size 2, at most 3 rounds, max_generate_length 4; ``algorithm``: more
    ``AlgorithmConfig`` fields."""
    rounds = ROUNDS if rounds is None else rounds
    cfg = SkyRLConfig(
        trainer=TrainerConfig(train_batch_size=2, policy_mini_batch_size=2),
        generator=GeneratorConfig(n_samples_per_prompt=4, max_generate_length=4),
        algorithm=AlgorithmConfig(
            dynamic_sampling=dynamic_sampling,
            dynamic_filter=dynamic_filter,
            max_sample_batches=3,
            **algorithm,
        ),
        environment=EnvironmentConfig(),
        data=DataConfig(),
    )
    source = SyncRollouts.__new__(SyncRollouts)  # no engine, no prompts: only the selection
    drawn: list[int] = []

    def generate(rows, seed: int) -> GeneratorOutput:
        drawn.append(seed)
        r = rounds[len(drawn) - 1]
        return _output(r) if isinstance(r, dict) else r

    source.cfg = cfg
    source.loader = type("Loader", (), {"next_batch": lambda self, name, refill=False: [name]})()
    source.generate = generate  # type: ignore[method-assign]
    return source, drawn


@pytest.mark.filterwarnings("ignore:step 0. dynamic sampling dropped")
@pytest.mark.parametrize(
    "dynamic_filter, batch_uids, rounds, kept_frac",
    [
        # round 0 keeps a and b: 2 groups, done after one round
        ("reward_variance", ["a", "b"], 1, 1.0),
        # round 0 keeps b (a dropped), round 1 keeps d (c dropped): 2 of 4 groups kept
        ("test_pass_band", ["b", "d"], 2, 0.5),
    ],
)
def test_filter_mode_keeps_the_groups_the_filter_keeps(
    dynamic_filter, batch_uids, rounds, kept_frac
):
    source, drawn = _source("filter", dynamic_filter)
    out, metrics = source.collect(step=0)
    assert list(ds.group_rows(out)) == batch_uids and len(out) == 8
    assert len(drawn) == rounds == metrics["dynamic_sampling/rounds"]
    assert metrics[names.KEPT_GROUP_FRAC] == kept_frac


@pytest.mark.filterwarnings("ignore:step 0. dynamic sampling dropped")
@pytest.mark.parametrize(
    "dynamic_filter, batch_uids, kept_frac",
    [
        ("reward_variance", ["a", "b"], 1.0),  # both informative: nothing replaced
        ("test_pass_band", ["b", "a~b"], 0.5),  # a is outside the band: a copy of b instead
    ],
)
def test_replace_mode_replaces_the_groups_the_filter_rejects(dynamic_filter, batch_uids, kept_frac):
    source, drawn = _source("replace", dynamic_filter)
    out, metrics = source.collect(step=0)
    assert list(ds.group_rows(out)) == batch_uids and len(drawn) == 1
    assert metrics[names.KEPT_GROUP_FRAC] == kept_frac
    out.validate()


def test_replace_mode_with_no_informative_group_keeps_none_and_warns():
    """Nothing to copy from: the batch is the flat round unchanged, but the kept fraction is
    informative / generated = 0 / 2 = 0.0 (not 1 - 0 replaced / 2) and the warning fires."""
    source, _ = _source("replace", "reward_variance", [{"a": [0, 0, 0, 0], "b": [1, 1, 1, 1]}])
    with pytest.warns(
        UserWarning, match="^step 0: dynamic sampling replaced 100% of prompt groups"
    ):
        out, metrics = source.collect(step=0)
    assert list(ds.group_rows(out)) == ["a", "b"]
    assert metrics[names.KEPT_GROUP_FRAC] == 0.0


def _cut(out: GeneratorOutput, uid: str, tokens: int = 4) -> GeneratorOutput:
    """``out`` with every sample of ``uid`` truncated (``length``) after ``tokens`` tokens."""
    for i, u in enumerate(out.uids):
        if u == uid:
            out.response_token_ids[i] = [5] * tokens
            out.loss_masks[i], out.rollout_logprobs[i] = [1] * tokens, [0.0] * tokens
            out.stop_reasons[i] = "length"
    return out


@pytest.mark.filterwarnings("ignore:step 0. dynamic sampling dropped")
@pytest.mark.filterwarnings("ignore:dynamic sampling. .* informative groups")
@pytest.mark.parametrize(
    "mode, rounds, batch_uids, batch_rewards, masked, penalty_mean",
    [
        # filter: round 0 keeps a (its 4 samples cut at 4 tokens), drops b (cut too); round 1
        # keeps nothing; round 2 keeps e (2 tokens). Overlong: max 4, buffer 2 -> ramp from 2
        # tokens; 4 tokens -> -min((4 - 2) / 2, 1) * 1.0 = -1; 2 tokens -> 0.
        # Batch a + e: masked 4 (a's), penalty mean (4 x -1 + 4 x 0) / 8 = -0.5.
        # (The last round alone said 0 and 0.0; all rounds would say 8 and -8 / 24.)
        (
            "filter",
            [
                _cut(_cut(_output({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}), "a"), "b"),
                {"c": [0, 0, 0, 0], "d": [0, 0, 0, 0]},
                {"e": [1, 0, 1, 0], "f": [0, 0, 0, 0]},
            ],
            ["a", "e"],
            [1 - 1, -1, -1, -1, 1, 0, 1, 0],
            4.0,
            -0.5,
        ),
        # replace: b (flat, cut at 4 tokens) becomes a copy of a (2 tokens): the batch holds
        # no truncated trajectory: masked 0, penalty mean 0 / 8 (the round said 4, -0.5).
        (
            "replace",
            [_cut(_output({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}), "b")],
            ["a", "b~a"],
            [1, 0, 0, 0] * 2,
            0.0,
            0.0,
        ),
    ],
)
def test_shaping_metrics_describe_the_returned_batch(
    mode, rounds, batch_uids, batch_rewards, masked, penalty_mean
):
    source, _ = _source(
        mode, "reward_variance", rounds,
        overlong_filter=True, overlong_buffer_len=2, overlong_penalty_factor=1.0,
    )  # fmt: skip
    out, metrics = source.collect(step=0)
    assert list(ds.group_rows(out)) == batch_uids
    assert out.rewards == batch_rewards  # shaped exactly once
    assert sum(1 for m in out.loss_masks if sum(m) == 0) == masked
    assert metrics["reward/overlong_masked"] == masked
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(penalty_mean, abs=1e-12)
    out.validate()


def test_import_path_filter(tmp_path, monkeypatch):
    (tmp_path / "my_filters.py").write_text(
        "class Filters:\n"
        "    @staticmethod\n"
        "    def all_correct(group):\n"
        "        return all(r == 1 for r in group.rewards)\n"
        "\n"
        "def keep_all(group):\n"
        "    return True\n"
        "\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = _output({"a": [1, 0], "b": [1, 1], "c": [0, 0]})
    assert ds.informative_uids(out, ds.group_filter("my_filters.keep_all")) == ["a", "b", "c"]
    assert ds.informative_uids(out, ds.group_filter("my_filters.Filters.all_correct")) == ["b"]
    with pytest.raises(ConfigError, match="is not callable") as exc:
        ds.group_filter("my_filters.NOT_CALLABLE")
    assert exc.value.key == "algorithm.dynamic_filter"
    with pytest.raises(ConfigError, match="does not import"):
        ds.group_filter("my_filters.missing")


def test_unknown_name_raises_config_error_with_a_suggestion():
    with pytest.raises(ConfigError) as exc:
        ds.group_filter("reward_varience")
    assert exc.value.key == "algorithm.dynamic_filter"
    assert "did you mean 'reward_variance'?" in exc.value.message
    assert "registered: " in exc.value.message and "reward_variance" in exc.value.message


def test_check_dynamic_filter_checks_the_config():
    source, _ = _source("filter", "reward_variance")
    ds.check_dynamic_filter(source.cfg)  # a registered name: fine
    source.cfg.algorithm.dynamic_filter = "no_such_filter"
    with pytest.raises(ConfigError, match=r"^algorithm\.dynamic_filter: unknown group filter"):
        ds.check_dynamic_filter(source.cfg)


def test_rounds_merge_into_the_metrics_of_all_their_samples():
    """Two sampling rounds of one step: the speed is all tokens over all seconds, pass@n per
    source is weighted by the prompts each round drew of it, and a key only a later round
    has is kept."""
    from skyrl.rollouts.sync import merge_rollout_metrics

    first = _output({"u1": [1.0, 0.0], "u2": [0.0, 0.0]})  # 2 prompts of source a
    first.metrics = {
        "generate/tokens_per_s": 100.0,  # 100 tokens in 1 s
        names.GENERATE_SECONDS: 1.0,
        "generate/pass@2/a": 0.5,  # u1 passes, u2 does not
        names.REWARD: 0.25,
    }
    second = _output({"u3": [1.0, 1.0], "u4": [0.0, 1.0]})
    second.data_sources = ["a", "a", "b", "b"]  # u3 of source a, u4 of source b
    second.metrics = {
        "generate/tokens_per_s": 100.0 / 9.0,  # 100 tokens in 9 s
        names.GENERATE_SECONDS: 9.0,
        "generate/pass@2/a": 1.0,
        "generate/pass@2/b": 1.0,
        names.REWARD: 0.75,
    }
    merged = merge_rollout_metrics([first, second])
    assert merged["generate/tokens_per_s"] == pytest.approx(200 / 10)  # not (100 + 11.1) / 2
    assert merged[names.GENERATE_SECONDS] == 10.0
    # source a: 3 prompts (u1, u2, u3), 2 pass: 2/3, not the rounds' mean (0.5 + 1) / 2
    assert merged["generate/pass@2/a"] == pytest.approx(2 / 3)
    assert merged["generate/pass@2/b"] == 1.0  # only the second round drew b
    assert merged[names.REWARD] == 0.5  # rounds of equal samples: their mean


def test_pass_at_n_of_a_source_whose_name_has_a_slash_merges_over_rounds():
    """reasoning_gym rows are of source ``reasoning_gym/<dataset>``, files may name theirs
    ``openai/gsm8k``: the source is all that follows ``pass@<n>/`` (the last path part matched
    no row, and the merge divided by zero)."""
    from skyrl.rollouts.sync import merge_rollout_metrics

    source = "reasoning_gym/basic_arithmetic"
    first = _output({"u1": [1.0, 0.0], "u2": [0.0, 0.0]})
    first.data_sources = [source] * 4
    first.metrics = {f"generate/pass@2/{source}": 0.5}  # u1 of 2 prompts passes
    second = _output({"u3": [1.0, 1.0], "u4": [0.0, 1.0]})
    second.data_sources = [source] * 4
    second.metrics = {f"generate/pass@2/{source}": 1.0}  # both pass
    merged = merge_rollout_metrics([first, second])
    # 2 prompts a round: (0.5 x 2 + 1.0 x 2) / 4 = 0.75
    assert merged == {f"generate/pass@2/{source}": 0.75}

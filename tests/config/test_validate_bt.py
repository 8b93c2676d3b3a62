"""Settings accepted by validation that failed only after Ray started, or never acted: each is
now refused before anything starts, with one line naming the key to change."""

from __future__ import annotations

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate


def _validate(*overrides: str):
    return validate(skyrl.compose(["experiment=smoke", *overrides]))


def _refused(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        _validate(*overrides)
    return err.value


@pytest.mark.parametrize("key", ["num_cpus_per_engine", "num_gpus_per_engine"])
def test_an_infinite_engine_resource_is_refused(key):
    """Ray takes no inf resource request: ``generator.num_cpus_per_engine=inf`` passed, and the
    run ended after Ray started with ``OverflowError: cannot convert float infinity to integer``
    and a traceback (``math.ceil`` of the CPUs to reserve; ``ray.remote`` the same)."""
    error = _refused(f"generator.{key}=inf")
    assert (error.key, error.message) == (f"generator.{key}", "must be finite, got inf")


def test_uncorrected_off_policy_is_refused_in_synchronous_training():
    """The flag only opts out of the asynchronous correction (``algorithm.tis_cap`` defaulting
    to 2.0 at ``trainer.max_staleness > 0``); the synchronous loop never read it, so with
    ``tis_cap=2`` an "uncorrected" run was corrected, without a word."""
    for extra in ([], ["algorithm.tis_cap=2"]):
        error = _refused("algorithm.uncorrected_off_policy=true", *extra)
        assert error.key == "algorithm.uncorrected_off_policy"
        assert error.message == (
            "applies to asynchronous training only (trainer.max_staleness > 0): a synchronous "
            "step trains on rollouts of the current weights, with nothing stale to leave "
            "uncorrected; set it to false"
        )


def test_uncorrected_off_policy_still_opts_out_in_asynchronous_training():
    cfg = _validate(
        "trainer.max_staleness=1",
        "generator.num_cpus_per_engine=1",
        "algorithm.uncorrected_off_policy=true",
    )
    assert cfg.algorithm.tis_cap is None  # not ASYNC_TIS_CAP: the opt-out holds


def test_fake_data_with_fewer_prompts_than_a_step_is_refused():
    """``data=fake`` runs epochs x (num_train_prompts // train_batch_size) steps: with 1 prompt
    and the smoke experiment's batch of 2 that is 1 x (1 // 2) = 0 steps. It passed the dry
    run (plan: "total steps 0"); the run started Ray and then stopped with
    ``trainer.critic_only_steps: the policy would never train: 0 critic-only steps of 0``,
    a key the user never set, in a run with no critic."""
    error = _refused("data=fake", "data.num_train_prompts=1", "trainer.total_steps=null")
    assert (error.key, error.message) == (
        "data.num_train_prompts",
        "1 training prompts, fewer than trainer.train_batch_size=2: data=fake runs "
        "trainer.epochs x (1 // 2) = 0 steps; set data.num_train_prompts >= 2 or "
        "trainer.total_steps",
    )


def test_fake_data_with_set_total_steps_needs_no_prompts():
    """With ``trainer.total_steps`` the fake batches are drawn per step, not from prompts."""
    cfg = _validate("data=fake", "data.num_train_prompts=1", "trainer.total_steps=3")
    assert cfg.trainer.total_steps == 3


def test_too_few_generated_prompts_is_not_blamed_on_critic_only_steps():
    """A generated source with fewer prompts than a step has 1 x (1 // 2) = 0 steps: the
    critic-only rule said "1 critic-only steps of 0", which no critic-only setting fixes.
    Validation now leaves it to the pre-flight's prompt count (``data.num_train_prompts: 1
    training prompts, fewer than trainer.train_batch_size=2``), which a run always runs."""
    cfg = _validate(
        "algorithm=ppo",
        "data.num_train_prompts=1",
        "trainer.total_steps=null",
        "trainer.critic_only_steps=1",
    )
    assert cfg.trainer.critic_only_steps == 1
    # with the prompts for one step (4 // 2 = 2 steps), the critic rule still counts
    error = _refused(
        "algorithm=ppo",
        "data.num_train_prompts=4",
        "trainer.total_steps=null",
        "trainer.critic_only_steps=2",
    )
    assert (error.key, error.message) == (
        "trainer.critic_only_steps",
        "the policy would never train: 2 critic-only steps of 2",
    )


@pytest.mark.parametrize(
    ("sampling", "setting"),
    [
        ("generator.sampling.temperature=0", "temperature 0"),
        ("generator.sampling.top_k=1", "top_k 1"),
    ],
)
def test_dynamic_sampling_with_greedy_sampling_is_refused(sampling, setting):
    """``reward_variance`` keeps groups whose samples' rewards differ; greedy sampling gives a
    prompt's samples one reply, so every group was dropped in each of the
    ``max_sample_batches`` rounds and the step trained on the flat groups it was topped up
    with, at max_sample_batches x the generation cost. (Estimators that compare samples
    refuse greedy sampling already; reinforce_pp does not compare them.)"""
    error = _refused("algorithm=reinforce_pp", "algorithm.dynamic_sampling=filter", sampling)
    assert error.key == "algorithm.dynamic_sampling"
    assert error.message == (
        f"filter: the 'reward_variance' filter keeps groups whose samples' rewards differ, and "
        f"greedy sampling ({setting}) gives every sample of a prompt the same reply, so every "
        "group would be dropped; sample with generator.sampling.temperature > 0 and top_k -1 "
        "or >= 2, or use another algorithm.dynamic_filter"
    )


def test_dynamic_sampling_with_sampled_replies_is_accepted():
    cfg = _validate("algorithm=reinforce_pp", "algorithm.dynamic_sampling=filter")
    assert cfg.algorithm.dynamic_sampling == "filter"

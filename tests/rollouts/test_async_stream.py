"""``AsyncRollouts`` against an in-process engine (no actor): failed episodes, the dynamic
filter, background weight loads and their deadlines, reward shaping and the rollout metrics."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import Future

import pytest
from async_helpers import (
    EchoEngine,
    TimedEngine,
    async_cfg,
    next_batch_within,
    tokenizer_of,
    wait_until_line_done,
)

from skyrl.config.errors import ConfigError
from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts
from skyrl.tracking import metric_names as names


class FailingInit:
    """An environment whose episodes fail to start once ``failing`` is set (after the prompts'
    load-time check), as a sandbox that cannot start would."""

    failing = False

    def __new__(cls, **kwargs):
        from skyrl.envs.base import StepResult, TextEnv

        class Env(TextEnv):
            def init(self, prompt, extras):
                if FailingInit.failing:
                    raise RuntimeError("sandbox did not start")
                return super().init(prompt, extras)

            def step(self, action_text):
                return StepResult([], 1.0, True)

        return Env(**kwargs)


def test_groups_whose_episodes_fail_to_start_are_trained_masked_not_regenerated(tmp_path):
    # No turn, no policy version: such a group counted as dispatched at version 0, so from
    # step 3 (trained version 2, bound 1) it was "stale", regenerated, failed again: forever.
    cfg = async_cfg("trainer.max_staleness=1", f"environment._target_={__name__}.FailingInit")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    FailingInit.failing = True
    try:
        for step in (1, 2, 3, 4):
            batch, metrics = next_batch_within(source, step)
            assert len(set(batch.metadata["uids"])) == cfg.trainer.train_batch_size
            assert metrics[names.ASYNC_STALE_GROUPS] == 0
            assert float(batch.loss_mask.sum()) == 0  # env errors: nothing to train on
            with source.updating_weights(step, timeout_s=10):
                pass
    finally:
        FailingInit.failing = False
        source.close()


class AlwaysRight:
    """Every reply earns 1: every group is flat (zero reward variance)."""

    def __new__(cls, **kwargs):
        from skyrl.envs.base import StepResult, TextEnv

        class Env(TextEnv):
            def step(self, action_text):
                return StepResult([], 1.0, True)

        return Env(**kwargs)


def test_the_dynamic_filter_stops_dropping_after_the_synchronous_rounds(tmp_path):
    # Every group flat, max_sample_batches 3, batch 2: the synchronous source samples 3 rounds
    # of 2 and tops up with flat groups. The stream drops (3 - 1) x 2 = 4 groups per batch,
    # then keeps what the filter rejects; it never returned before.
    cfg = async_cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.AlwaysRight",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    engine = EchoEngine(tok)
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    try:
        with pytest.warns(UserWarning, match="algorithm.max_sample_batches"):
            batch, metrics = next_batch_within(source, 1)
        # the first 4 groups to finish were dropped (p0-p3 unless one finished late), the
        # next ones kept
        assert len(set(batch.metadata["uids"])) == 2
        assert metrics[names.ASYNC_FILTERED_GROUPS] == 4
        assert metrics[names.KEPT_GROUP_FRAC] == 0.0  # none of the 6 was informative
        with source.updating_weights(1, timeout_s=10):
            pass
        # every group of the next batch is flat too: kept past the drops, and counted with
        # this batch whenever it finished
        with pytest.warns(UserWarning, match="algorithm.max_sample_batches"):
            batch, metrics = next_batch_within(source, 2)
        assert len(set(batch.metadata["uids"])) == 2  # still batches, with every group flat
        assert metrics[names.KEPT_GROUP_FRAC] == 0.0
    finally:
        source.close()


def keep_pairs_0_1_4_5(group) -> bool:
    """A dynamic filter for the test: of the prompts p0, p1, p2, ... keep p0 p1, reject p2
    p3, keep p4 p5, ... (pairs alternate; a batch of 2 is one pair)."""
    return int(group.uids[0].rsplit("p", 1)[1]) // 2 % 2 == 0


def test_kept_group_frac_describes_the_groups_of_its_own_batch(tmp_path):
    # max_sample_batches 1: nothing is dropped, every rejected group is kept. Batches of 2
    # are p0 p1, p2 p3, p4 p5: kept_group_frac = (2 - rejected in the batch) / (2 + 0
    # dropped) = 2/2, 0/2, 2/2, and the "kept after dropping" warning comes with step 2
    # only. The groups of a batch finish before the batch is taken (here: before the
    # previous one is, since the stream waits for all of them), which the count must not
    # mix up.
    cfg = async_cfg(
        "trainer.max_staleness=1", "algorithm.dynamic_sampling=filter",
        f"algorithm.dynamic_filter={__name__}.keep_pairs_0_1_4_5",
        "algorithm.max_sample_batches=1",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        fracs, warned = [], []
        for step in (1, 2, 3):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batch, metrics = next_batch_within(source, step)
            assert sorted(set(batch.metadata["uids"])) == [
                f"s{step}r0p{2 * step - 2}", f"s{step}r0p{2 * step - 1}",
            ]  # fmt: skip
            fracs.append(metrics[names.KEPT_GROUP_FRAC])
            warned.append(any("max_sample_batches" in str(w.message) for w in caught))
            with source.updating_weights(step, timeout_s=10):
                pass
            wait_until_line_done(source)
    finally:
        source.close()
    assert fracs == [1.0, 0.0, 1.0]
    assert warned == [False, True, False]


def test_a_batch_awaited_during_a_background_load_outwaits_the_loads_deadline(tmp_path):
    # A background load (object store / shared memory): the trainer takes its next batch while
    # the engines load. Partial rollouts: step 2's requests (2 s each, sent at the stream's
    # start) go on through the sync. The load takes 0.3 s of its 1 s; the batch is done at
    # ~2 s, and no other group finishes before (all but step 1's take 2 s). The wait kept the
    # hold's deadline after the gate opened: WeightSyncTimeout at 1 s.
    cfg = async_cfg("trainer.max_staleness=1", "trainer.partial_rollouts=true")
    tok = tokenizer_of(cfg)
    engine = TimedEngine(tok, {"s1r0p0": 0.0, "s1r0p1": 0.0}, default_s=2.0)
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    loaded: Future = Future()

    def load(sync) -> None:
        with sync:
            time.sleep(0.3)  # engine.update_weights(...)
        loaded.set_result(time.monotonic() - started)

    try:
        next_batch_within(source, 1)
        started = time.monotonic()
        threading.Thread(target=load, args=(source.updating_weights(1, 1.0),)).start()
        time.sleep(0.05)  # the hold comes first, as the trainer orders it
        batch, metrics = next_batch_within(source, 2)
        waited = time.monotonic() - started
    finally:
        source.close()
    assert loaded.result(5) < 1.0  # the load itself kept its deadline
    assert waited > 1.0  # and the batch was waited for past it, not given up on
    assert sorted(set(batch.metadata["uids"])) == ["s2r0p2", "s2r0p3"]
    assert metrics[names.ASYNC_STALE_GROUPS] == 0


def test_an_admission_failure_ends_next_batch_with_its_error(tmp_path, monkeypatch):
    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)

    def broken_row(index, uid):
        raise RuntimeError("the prompt row cannot be read")

    monkeypatch.setattr(source.loader, "row", broken_row)
    try:
        # it went unnoticed ("Task exception was never retrieved") and next_batch waited forever
        with pytest.raises(RuntimeError, match="the prompt row cannot be read"):
            next_batch_within(source, 1, seconds=10)
    finally:
        source.close()


def test_a_checkpoint_whose_pending_prompts_the_training_set_lacks_is_refused(tmp_path):
    # The training set shrank to 4 prompts since the checkpoint (data.num_train_prompts 8 -> 4);
    # a prompt it holds to generate again is row 6: 7 rows needed, 4 there. Admission failed
    # on it (IndexError) and next_batch waited forever.
    cfg = async_cfg("trainer.max_staleness=1", "data.num_train_prompts=4")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    pending = [{"index": 3, "uid": "s3r0p4", "seed": 7}, {"index": 6, "uid": "s3r0p5", "seed": 7}]
    state = {"loader": source.loader.state_dict(), "chunks": 3, "pending": pending}
    try:
        with pytest.raises(ConfigError, match=r"^data: .*at least 7 training prompts.* has 4"):
            source.load_state_dict(state)
    finally:
        source.close()


class CutP0Engine(EchoEngine):
    """``EchoEngine``, but every sample of the prompts ``...p0`` runs to ``max_tokens``."""

    async def generate(self, prompt_ids, sampling, route_key=None):
        from skyrl.inference.base import Completion

        if route_key.endswith("p0"):
            self.calls += 1
            return Completion(
                [self.ids[0]] * sampling.max_tokens, [-0.1] * sampling.max_tokens, "length"
            )
        return await super().generate(prompt_ids, sampling, route_key)


def test_reward_shaping_metrics_describe_the_batch_as_in_synchronous_training(tmp_path):
    # Batch 1 = p0 p1, 2 samples each; p0's two samples are cut at max_generate_length = 8.
    # overlong_masked counts the batch's masked trajectories: 2 (the async source gave the
    # mean of the per-group counts (2 + 0) / 2 = 1). The penalty is a mean over trajectories:
    # buffer 4 starts at 8 - 4 = 4 tokens, p0's 8 tokens are 4 over: -min(4 / 4, 1) x 1.0 =
    # -1 each; p1's 2 tokens ("7" + EOS) none: (-1 - 1 + 0 + 0) / 4 = -0.5.
    shaping = ("algorithm.overlong_filter=true", "algorithm.overlong_buffer_len=4")
    cfg = async_cfg("trainer.max_staleness=1", *shaping)
    tok = tokenizer_of(cfg)
    _, sync_metrics = SyncRollouts(async_cfg(*shaping), CutP0Engine(tok), tok, tmp_path).next_batch(
        1
    )
    source = AsyncRollouts(cfg, CutP0Engine(tok), tok, tmp_path)
    try:
        batch, metrics = next_batch_within(source, 1)
    finally:
        source.close()
    assert batch.metadata["stop_reasons"] == ["length", "length", "stop", "stop"]
    for got in (sync_metrics, metrics):
        assert got["reward/overlong_masked"] == 2.0
        assert got["reward/overlong_penalty_mean"] == -0.5


def test_a_background_load_holds_new_requests_before_the_next_batch_is_taken(tmp_path):
    # RLTrainer.sync_weights with a background load (object store / shared memory). The load
    # thread is started late here: the trainer's next next_batch reaches the stream first.
    # When the hold came from that thread, next_batch lifted the admission bound while the
    # engines still held version 0: s3r0p4 and s3r0p5 went out at version 0, were 2 versions
    # old at step 3, dropped as stale and regenerated, and step 3 trained s4r0p6 s4r0p7.
    from skyrl.trainer.trainer import RLTrainer
    from skyrl.trainer.weight_sync import EngineSync

    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    engine = TimedEngine(tok, {"s2r0p2": 1.0, "s2r0p3": 1.0})  # step 2's prompts are slow
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg, tr.engine, tr.rollouts = cfg, engine, source
    tr.engine_sync = EngineSync(None, engine, source, cfg)
    tr.engine_sync._staged = list
    loads: list[tuple] = []

    def started_later(fn) -> Future:  # the load thread, run when the test says (load())
        loads.append((fn, Future()))
        return loads[-1][1]

    def load() -> None:
        fn, done = loads.pop(0)
        fn()
        done.set_result(None)

    tr.engine_sync.in_background = started_later
    try:
        next_batch_within(source, 1)
        tr.sync_weights(1)
        step_2: Future = Future()
        threading.Thread(target=lambda: step_2.set_result(source.next_batch(2))).start()
        time.sleep(0.2)  # next_batch(2) waits for s2r0p2 s2r0p3
        load()
        _, metrics_2 = step_2.result(20)
        tr.sync_weights(2)  # waits for load 1 (done), then starts load 2
        load()
        batch_3, metrics_3 = next_batch_within(source, 3)
    finally:
        source.close()
    assert metrics_2[names.ASYNC_STALE_GROUPS] == 0
    # admission order; admitted after the hold of sync 1: dispatched at version 1, 1 old
    assert sorted(set(batch_3.metadata["uids"])) == ["s3r0p4", "s3r0p5"]
    assert {v[0][0] for v in batch_3.metadata["policy_versions"]} == {1}
    assert metrics_3[names.ASYNC_STALE_GROUPS] == 0
    assert metrics_3[names.ASYNC_STALENESS_MAX] == 1


def test_a_background_load_whose_drain_timed_out_ends_the_next_batch(tmp_path):
    # A background load (the trainer goes on to its next batch) waits for step 2's requests,
    # in flight at the sync (1.5 s each), at most 0.5 s: WeightSyncTimeout, the weights never
    # load. The block's exit still moved the clock to version 1 and opened the gate, so
    # next_batch(2) returned step 2's rows as finished at version 1 (engines at 0) and the
    # failure surfaced a step later, or never when the trainer's wait lost the deadline race.
    from skyrl.rollouts import WeightSyncTimeout

    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    engine = TimedEngine(tok, {"s2r0p2": 1.5, "s2r0p3": 1.5})
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    failed: Future = Future()

    def load(sync) -> None:
        try:
            with sync:
                pass  # engine.update_weights(...): never reached
        except WeightSyncTimeout as exc:
            failed.set_result(str(exc))

    try:
        next_batch_within(source, 1)
        thread = threading.Thread(target=load, args=(source.updating_weights(1, 0.5),))
        thread.start()
        thread.join(5)
        assert "request(s) in flight" in failed.result(0)
        assert source.clock.current == 0  # the engines still hold version 0
        with pytest.raises(WeightSyncTimeout, match=r"request\(s\) in flight"):
            next_batch_within(source, 2, seconds=10)
    finally:
        source.close()


def test_a_batch_awaited_past_the_deadline_of_a_drain_names_the_requests_in_flight(tmp_path):
    # The hold of sync 1 is on (deadline 0.5 s) and step 2's requests (3 s each) are in flight:
    # the weights cannot load before they finish (2 prompts x 2 samples = 4 requests).
    # next_batch(2) gave up at the deadline naming "the inference engines to load the
    # weights", which were never what it waited for.
    from skyrl.rollouts import WeightSyncTimeout

    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, TimedEngine(tok, {"s2r0p2": 3.0, "s2r0p3": 3.0}), tok, tmp_path)
    try:
        next_batch_within(source, 1)
        source.updating_weights(1, 0.5)  # the load thread has not drained yet
        with pytest.raises(WeightSyncTimeout, match=r"^4 request\(s\) in flight on the inf"):
            next_batch_within(source, 2, seconds=10)
    finally:
        source.close()


class FailingStep:
    """An environment whose every step raises once ``failing`` is set (after the prompts'
    load-time check): each trajectory is an env error with reward 0, each group flat."""

    failing = False

    def __new__(cls, **kwargs):
        from skyrl.envs.base import TextEnv

        class Env(TextEnv):
            def step(self, action_text):
                if FailingStep.failing:
                    raise RuntimeError("the sandbox died")
                return super().step(action_text)

        return Env(**kwargs)


def test_rollout_metrics_count_the_groups_the_filter_dropped_as_synchronous_training_does():
    # Every step raises: every group is flat (rewards all 0) and the default filter
    # (reward_variance) rejects it. max_sample_batches 3, batch 2: the stream drops
    # (3 - 1) x 2 = 4 groups before the first batch, then keeps 2 flat ones. All 6 were
    # generated: env/errors = 6 groups x 2 samples = 12, as the synchronous source reports
    # over its 3 rounds of 2 prompts (3 x 2 x 2 = 12). Only the 2 kept groups were counted
    # (2 x 2 = 4): an env failing on every dropped group went unseen.
    cfg = async_cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.FailingStep",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    sync_cfg = async_cfg(
        f"environment._target_={__name__}.FailingStep",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    sync = SyncRollouts(sync_cfg, EchoEngine(tok), tok)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok)
    FailingStep.failing = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the flat top-up warnings
            _, sync_metrics = sync.next_batch(1)
            batch, metrics = next_batch_within(source, 1)
    finally:
        FailingStep.failing = False
        source.close()
    assert len(set(batch.metadata["uids"])) == 2
    assert metrics[names.ASYNC_FILTERED_GROUPS] == 4
    assert sync_metrics[names.ENV_ERRORS] == 12.0
    assert metrics[names.ENV_ERRORS] == 12.0
    # the staleness describes what is trained: the batch's 2 groups x 2 samples, at version 0
    assert metrics[names.ASYNC_STALENESS_MAX] == 0.0

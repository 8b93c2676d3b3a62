"""``AsyncRollouts``: the admission rule, the stream against a real engine actor (tiny model),
and its equality with the synchronous source at ``max_staleness=0``."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import Future

import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate
from skyrl.inference import make_engine
from skyrl.models.resolve import with_local_model_paths
from skyrl.rollouts import make_rollouts
from skyrl.rollouts.async_rollouts import Admission, AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts
from skyrl.tracking import metric_names as names

# -- the admission rule (no engine) ----------------------------------------------------


def test_admission_bound_matches_accepted_plus_running_formula():
    # k = 1, batch 4: the rule is accepted + running <= (k + version + 1) * batch.
    adm = Admission(max_staleness=1, batch_size=4)
    admitted = 0
    while adm.can_admit():  # a burst: everything that may start, starts
        adm.admit()
        admitted += 1
    assert admitted == 8  # (1 + 0 + 1) * 4 at version 0
    adm.take(4)  # step 1 takes 4 groups and trains: no more may start (they would be 2 old)
    assert not adm.can_admit()
    adm.release()  # synced: version 1 -> (1 + 1 + 1) * 4 = 12 accepted + running
    while adm.can_admit():
        adm.admit()
        admitted += 1
    assert admitted == 12


def test_a_slow_consumer_stops_admission_at_the_bound():
    # the trainer never takes a batch: at most (k + 1) * batch groups are ever admitted
    adm = Admission(max_staleness=2, batch_size=3)
    started = 0
    for _ in range(100):
        if adm.can_admit():
            adm.admit()
            started += 1
    assert started == 9


def test_dropped_groups_free_their_place_and_refused_steps_do_not_stall():
    adm = Admission(max_staleness=1, batch_size=2)
    for _ in range(4):
        adm.admit()
    assert not adm.can_admit()
    adm.drop()  # a group the dynamic filter rejected: another one may start
    assert adm.can_admit()
    adm.admit()
    # three refused steps in a row (no weight sync): each next batch still finds room
    for _ in range(3):
        adm.take(2)
        adm.release()  # the next next_batch call: the step is over
        assert adm.can_admit()
        adm.admit()
        adm.admit()


# -- against a real engine actor --------------------------------------------------------


def _cfg(*overrides: str):
    return with_local_model_paths(
        validate(
            skyrl.compose(
                [
                    "experiment=smoke", "generator.max_generate_length=8",
                    "generator.num_cpus_per_engine=1", "trainer.dp_size=1",
                    "generator.sampling.seed=3", *overrides,
                ]
            )
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
def actor_engine(ray_cluster):
    cfg = _cfg()
    engine = make_engine(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    yield engine
    engine.shutdown()


def _tokenizer(cfg):
    return AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)


def _rows(batch) -> list[tuple]:
    """What a batch trains on, row by row."""
    return list(
        zip(
            batch.metadata["uids"],
            batch.input_ids.tolist(),
            batch.loss_mask.tolist(),
            batch.require("rewards").tolist(),
            strict=True,
        )
    )


def test_at_staleness_0_the_async_source_gives_the_synchronous_batches(actor_engine, tmp_path):
    cfg = _cfg()
    tok = _tokenizer(cfg)
    sync = SyncRollouts(cfg, actor_engine, tok, tmp_path)
    stream = AsyncRollouts(cfg, actor_engine, tok, tmp_path, max_staleness=0)
    try:
        for step in (1, 2, 3):
            want, _ = sync.next_batch(step)
            got, metrics = stream.next_batch(step)
            assert _rows(got) == _rows(want)
            assert got.metadata["policy_versions"] == want.metadata["policy_versions"]
            assert metrics[names.ASYNC_STALENESS_MAX] == 0
            for source in (sync, stream):
                with source.updating_weights(step):
                    pass
    finally:
        stream.close()


def wait_for_next_batch(source, timeout_s: float = 60.0) -> None:
    """Stand-in for a step's training time: wait until the next batch's groups are generated
    (at the current version), so the staleness below does not depend on timing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ahead = list(source.line)[: source.batch_size]
        except RuntimeError:  # the source's loop changed the line meanwhile
            continue
        if len(ahead) == source.batch_size and all(g.done for g in ahead):
            return
        time.sleep(0.05)
    raise AssertionError("the next batch was not generated while the step trained")


def test_at_staleness_1_generation_runs_one_version_ahead(actor_engine, tmp_path):
    cfg = _cfg("trainer.max_staleness=1")
    source = make_rollouts(cfg, _tokenizer(cfg), tmp_path, actor_engine)
    assert isinstance(source, AsyncRollouts)
    try:
        staleness, uids = [], []
        for step in (1, 2, 3, 4):
            batch, metrics = source.next_batch(step)
            version = step - 1
            row_staleness = {version - v[0][0] for v in batch.metadata["policy_versions"]}
            assert max(row_staleness) <= 1  # the bound
            assert metrics[names.ASYNC_STALENESS_MAX] == max(row_staleness)
            assert metrics[names.ASYNC_MIXED_VERSION_TURNS] == 0  # in-flight ones drained
            staleness.append(max(row_staleness))
            uids += sorted(set(batch.metadata["uids"]))
            wait_for_next_batch(source)
            with source.updating_weights(step, timeout_s=60):
                pass
        # step 1 trains on version 0 rollouts; the batches after it were admitted while
        # the previous step trained, so they are exactly one version old
        assert staleness == [0, 1, 1, 1]
        # admission order = loader order: the synchronous source's prompts, none twice
        assert uids == [f"s{c}r0p{j}" for c in (1, 2, 3, 4) for j in (2 * c - 2, 2 * c - 1)]
        state = source.state_dict()
        # after the sync to version 4: (k + 1) x 2 groups in line, drawn and not trained on,
        # kept in the checkpoint to be generated again
        assert [p["uid"] for p in state["pending"]] == ["s5r0p8", "s5r0p9", "s6r0p10", "s6r0p11"]
    finally:
        source.close()


def test_a_resumed_stream_regenerates_what_was_in_flight(actor_engine, tmp_path):
    cfg = _cfg("trainer.max_staleness=2")
    tok = _tokenizer(cfg)
    first = AsyncRollouts(cfg, actor_engine, tok, tmp_path)
    try:
        consumed = [u for s in (1, 2) for u in first.next_batch(s)[0].metadata["uids"]]
        with first.updating_weights(1):
            pass
        state = first.state_dict()
    finally:
        first.close()
    resumed = AsyncRollouts(cfg, actor_engine, tok, tmp_path)
    try:
        resumed.load_state_dict(state)
        later = [u for s in (3, 4) for u in resumed.next_batch(s)[0].metadata["uids"]]
    finally:
        resumed.close()
    straight = AsyncRollouts(cfg, actor_engine, tok, tmp_path)
    try:
        want = [u for s in (1, 2, 3, 4) for u in straight.next_batch(s)[0].metadata["uids"]]
    finally:
        straight.close()
    assert consumed + later == want


def test_async_needs_engines_in_actors_and_a_correction():
    with pytest.raises(ConfigError, match="generator.num_cpus_per_engine=1"):
        validate(skyrl.compose(["experiment=smoke", "trainer.max_staleness=1"]))
    cfg = validate(
        skyrl.compose(
            ["experiment=smoke", "trainer.max_staleness=1", "generator.num_cpus_per_engine=1"]
        )
    )
    assert cfg.algorithm.tis_cap == 2.0  # the default correction
    with pytest.raises(ConfigError, match="algorithm.uncorrected_off_policy"):
        validate(
            skyrl.compose(
                [
                    "experiment=smoke", "trainer.max_staleness=1",
                    "generator.num_cpus_per_engine=1", "algorithm.uncorrected_off_policy=true",
                    "algorithm.tis_cap=3",
                ]
            )
        )  # fmt: skip
    with pytest.raises(ConfigError, match="trainer.partial_rollouts"):
        validate(skyrl.compose(["experiment=smoke", "trainer.partial_rollouts=true"]))


class DelayedEngine:
    """The engine, but the completions of ``slow`` prompt uids come back ``delay_s`` later:
    those requests are in flight that long (as a long response would be)."""

    def __init__(self, engine, slow: set[str], delay_s: float):
        self.engine, self.slow, self.delay_s = engine, slow, delay_s

    async def generate(self, prompt_ids, sampling, route_key=None):
        import asyncio

        out = await self.engine.generate(prompt_ids, sampling, route_key)
        if route_key in self.slow:
            await asyncio.sleep(self.delay_s)
        return out

    def serve(self, done) -> None:
        self.engine.serve(done)


@pytest.mark.parametrize("partial", [False, True])
def test_requests_in_flight_at_a_sync_drain_or_continue(actor_engine, tmp_path, partial):
    cfg = _cfg("trainer.max_staleness=1", f"trainer.partial_rollouts={partial}")
    # step 2's prompts (chunk 2: uids s2r0p2, s2r0p3) answer 1.5 s late: in flight at the sync
    engine = DelayedEngine(actor_engine, {"s2r0p2", "s2r0p3"}, delay_s=1.5)
    source = AsyncRollouts(cfg, engine, _tokenizer(cfg), tmp_path)
    try:
        source.next_batch(1)
        import time

        started = time.monotonic()
        with source.updating_weights(1, timeout_s=30):
            pass
        waited = time.monotonic() - started
        batch, metrics = source.next_batch(2)
    finally:
        source.close()
    versions = {tuple(v[0]) for v in batch.metadata["policy_versions"]}
    if partial:
        # the sync did not wait; the requests finished after it: dispatched at 0, finished at 1
        assert waited < 1.0
        assert versions == {(0, 1)}
        assert metrics[names.ASYNC_MIXED_VERSION_TURNS] == len(batch)  # one turn per row
    else:
        # the sync waited for them; they finished under the weights they started with
        assert waited >= 1.0
        assert versions == {(0, 0)}
        assert metrics[names.ASYNC_MIXED_VERSION_TURNS] == 0


def test_a_drain_past_the_timeout_names_what_it_waited_for(actor_engine, tmp_path):
    from skyrl.rollouts import WeightSyncTimeout

    cfg = _cfg("trainer.max_staleness=1")
    engine = DelayedEngine(actor_engine, {"s2r0p2", "s2r0p3"}, delay_s=5.0)
    source = AsyncRollouts(cfg, engine, _tokenizer(cfg), tmp_path)
    try:
        source.next_batch(1)
        with pytest.raises(WeightSyncTimeout, match=r"request\(s\) in flight on the inference"):
            with source.updating_weights(1, timeout_s=0.5):
                pass
    finally:
        source.close()


def keep_even_prompts(group) -> bool:
    """A dynamic filter for the test: keep prompts whose uid ends in an even number."""
    return int(group.uids[0].rsplit("p", 1)[1]) % 2 == 0


def test_the_dynamic_filter_drops_groups_from_the_stream_and_admits_others(actor_engine, tmp_path):
    cfg = _cfg(
        "trainer.max_staleness=1", "algorithm.dynamic_sampling=filter",
        f"algorithm.dynamic_filter={__name__}.keep_even_prompts",
    )  # fmt: skip
    source = AsyncRollouts(cfg, actor_engine, _tokenizer(cfg), tmp_path)
    try:
        seen, filtered = [], 0.0
        for step in (1, 2, 3):
            batch, metrics = source.next_batch(step)
            uids = sorted(set(batch.metadata["uids"]))
            seen += uids
            filtered += metrics[names.ASYNC_FILTERED_GROUPS]
            assert len(uids) == 2  # still train_batch_size groups
            with source.updating_weights(step):
                pass
    finally:
        source.close()
    # odd prompts were generated, dropped and replaced by the next ones in loader order
    assert seen == ["s1r0p0", "s2r0p2", "s3r0p4", "s4r0p6", "s5r0p8", "s6r0p10"]
    # p1, p3, p5, p7, p9 were dropped before the third batch (p9 stands in line before p10)
    assert filtered >= 5


# -- the stream against an in-process engine (no actor) ---------------------------------


class EchoEngine:
    """Answers every request with "7" and EOS at once, in-process."""

    def __init__(self, tok):
        self.ids = tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
        self.calls = 0

    async def generate(self, prompt_ids, sampling, route_key=None):
        from skyrl.inference.base import Completion

        self.calls += 1
        return Completion(list(self.ids), [-0.1] * len(self.ids), "stop")

    def serve(self, done) -> None:
        pass


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


def _next_batch_within(source, step: int, seconds: float = 20.0):
    """``source.next_batch(step)``, or fail when it does not return within ``seconds``."""
    result: dict = {}

    def take() -> None:
        try:
            result["out"] = source.next_batch(step)
        except BaseException as exc:  # re-raised here, on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"next_batch({step}) did not return in {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["out"]


def test_groups_whose_episodes_fail_to_start_are_trained_masked_not_regenerated(tmp_path):
    # No turn, no policy version: such a group counted as dispatched at version 0, so from
    # step 3 (trained version 2, bound 1) it was "stale", regenerated, failed again: forever.
    cfg = _cfg("trainer.max_staleness=1", f"environment._target_={__name__}.FailingInit")
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    FailingInit.failing = True
    try:
        for step in (1, 2, 3, 4):
            batch, metrics = _next_batch_within(source, step)
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
    cfg = _cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.AlwaysRight",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    tok = _tokenizer(cfg)
    engine = EchoEngine(tok)
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    try:
        with pytest.warns(UserWarning, match="algorithm.max_sample_batches"):
            batch, metrics = _next_batch_within(source, 1)
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
            batch, metrics = _next_batch_within(source, 2)
        assert len(set(batch.metadata["uids"])) == 2  # still batches, with every group flat
        assert metrics[names.KEPT_GROUP_FRAC] == 0.0
    finally:
        source.close()


def keep_pairs_0_1_4_5(group) -> bool:
    """A dynamic filter for the test: of the prompts p0, p1, p2, ... keep p0 p1, reject p2
    p3, keep p4 p5, ... (pairs alternate; a batch of 2 is one pair)."""
    return int(group.uids[0].rsplit("p", 1)[1]) // 2 % 2 == 0


def wait_until_line_done(source, timeout_s: float = 20.0) -> None:
    """Until every group admitted so far is generated (stand-in for a step's training)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(g.done for g in list(source.line)):
                return
        except RuntimeError:  # the source's loop changed the line meanwhile
            continue
        time.sleep(0.01)
    raise AssertionError("the groups in line were not generated")


def test_kept_group_frac_describes_the_groups_of_its_own_batch(tmp_path):
    # max_sample_batches 1: nothing is dropped, every rejected group is kept. Batches of 2
    # are p0 p1, p2 p3, p4 p5: kept_group_frac = (2 - rejected in the batch) / (2 + 0
    # dropped) = 2/2, 0/2, 2/2, and the "kept after dropping" warning comes with step 2
    # only. The groups of a batch finish before the batch is taken (here: before the
    # previous one is, since the stream waits for all of them), which the count must not
    # mix up.
    cfg = _cfg(
        "trainer.max_staleness=1", "algorithm.dynamic_sampling=filter",
        f"algorithm.dynamic_filter={__name__}.keep_pairs_0_1_4_5",
        "algorithm.max_sample_batches=1",
    )  # fmt: skip
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        fracs, warned = [], []
        for step in (1, 2, 3):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batch, metrics = _next_batch_within(source, step)
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


class TimedEngine(EchoEngine):
    """``EchoEngine`` whose answers to the prompt uids in ``delays_s`` come that many seconds
    late (the others ``default_s`` late), and with the weight-loading calls of a trainer's
    sync (which do nothing)."""

    def __init__(self, tok, delays_s: dict[str, float], default_s: float = 0.0):
        super().__init__(tok)
        self.delays_s, self.default_s = delays_s, default_s

    async def generate(self, prompt_ids, sampling, route_key=None):
        import asyncio

        await asyncio.sleep(self.delays_s.get(route_key, self.default_s))
        return await super().generate(prompt_ids, sampling, route_key)

    def update_weights(self, weights) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass


def test_a_batch_awaited_during_a_background_load_outwaits_the_loads_deadline(tmp_path):
    # A background load (object store / shared memory): the trainer takes its next batch while
    # the engines load. Partial rollouts: step 2's requests (2 s each, sent at the stream's
    # start) go on through the sync. The load takes 0.3 s of its 1 s; the batch is done at
    # ~2 s, and no other group finishes before (all but step 1's take 2 s). The wait kept the
    # hold's deadline after the gate opened: WeightSyncTimeout at 1 s.
    cfg = _cfg("trainer.max_staleness=1", "trainer.partial_rollouts=true")
    tok = _tokenizer(cfg)
    engine = TimedEngine(tok, {"s1r0p0": 0.0, "s1r0p1": 0.0}, default_s=2.0)
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    loaded: Future = Future()

    def load(sync) -> None:
        with sync:
            time.sleep(0.3)  # engine.update_weights(...)
        loaded.set_result(time.monotonic() - started)

    try:
        _next_batch_within(source, 1)
        started = time.monotonic()
        threading.Thread(target=load, args=(source.updating_weights(1, 1.0),)).start()
        time.sleep(0.05)  # the hold comes first, as the trainer orders it
        batch, metrics = _next_batch_within(source, 2)
        waited = time.monotonic() - started
    finally:
        source.close()
    assert loaded.result(5) < 1.0  # the load itself kept its deadline
    assert waited > 1.0  # and the batch was waited for past it, not given up on
    assert sorted(set(batch.metadata["uids"])) == ["s2r0p2", "s2r0p3"]
    assert metrics[names.ASYNC_STALE_GROUPS] == 0


def test_an_admission_failure_ends_next_batch_with_its_error(tmp_path, monkeypatch):
    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)

    def broken_row(index, uid):
        raise RuntimeError("the prompt row cannot be read")

    monkeypatch.setattr(source.loader, "row", broken_row)
    try:
        # it went unnoticed ("Task exception was never retrieved") and next_batch waited forever
        with pytest.raises(RuntimeError, match="the prompt row cannot be read"):
            _next_batch_within(source, 1, seconds=10)
    finally:
        source.close()


def test_a_checkpoint_whose_pending_prompts_the_training_set_lacks_is_refused(tmp_path):
    # The training set shrank to 4 prompts since the checkpoint (data.num_train_prompts 8 -> 4);
    # a prompt it holds to generate again is row 6: 7 rows needed, 4 there. Admission failed
    # on it (IndexError) and next_batch waited forever.
    cfg = _cfg("trainer.max_staleness=1", "data.num_train_prompts=4")
    tok = _tokenizer(cfg)
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
    cfg = _cfg("trainer.max_staleness=1", *shaping)
    tok = _tokenizer(cfg)
    _, sync_metrics = SyncRollouts(_cfg(*shaping), CutP0Engine(tok), tok, tmp_path).next_batch(1)
    source = AsyncRollouts(cfg, CutP0Engine(tok), tok, tmp_path)
    try:
        batch, metrics = _next_batch_within(source, 1)
    finally:
        source.close()
    assert batch.metadata["stop_reasons"] == ["length", "length", "stop", "stop"]
    for got in (sync_metrics, metrics):
        assert got["reward/overlong_masked"] == 2.0
        assert got["reward/overlong_penalty_mean"] == -0.5


def test_a_background_load_holds_new_requests_before_the_next_batch_is_taken(tmp_path, monkeypatch):
    # RLTrainer.sync_weights with a background load (object store / shared memory). The load
    # thread is started late here: the trainer's next next_batch reaches the stream first.
    # When the hold came from that thread, next_batch lifted the admission bound while the
    # engines still held version 0: s3r0p4 and s3r0p5 went out at version 0, were 2 versions
    # old at step 3, dropped as stale and regenerated, and step 3 trained s4r0p6 s4r0p7.
    from skyrl.trainer.trainer import RLTrainer

    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    engine = TimedEngine(tok, {"s2r0p2": 1.0, "s2r0p3": 1.0})  # step 2's prompts are slow
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg, tr.engine, tr.rollouts = cfg, engine, source
    tr.weight_sync, tr.shared_weights, tr._loading = None, None, None
    tr._staged_weights = list
    loads: list[tuple] = []

    def started_later(fn) -> Future:  # the load thread, run when the test says (load())
        loads.append((fn, Future()))
        return loads[-1][1]

    def load() -> None:
        fn, done = loads.pop(0)
        fn()
        done.set_result(None)

    monkeypatch.setattr("skyrl.trainer.trainer.in_thread", started_later)
    try:
        _next_batch_within(source, 1)
        tr.sync_weights(1)
        step_2: Future = Future()
        threading.Thread(target=lambda: step_2.set_result(source.next_batch(2))).start()
        time.sleep(0.2)  # next_batch(2) waits for s2r0p2 s2r0p3
        load()
        _, metrics_2 = step_2.result(20)
        tr.sync_weights(2)  # waits for load 1 (done), then starts load 2
        load()
        batch_3, metrics_3 = _next_batch_within(source, 3)
    finally:
        source.close()
    assert metrics_2[names.ASYNC_STALE_GROUPS] == 0
    # admission order; admitted after the hold of sync 1: dispatched at version 1, 1 old
    assert sorted(set(batch_3.metadata["uids"])) == ["s3r0p4", "s3r0p5"]
    assert {v[0][0] for v in batch_3.metadata["policy_versions"]} == {1}
    assert metrics_3[names.ASYNC_STALE_GROUPS] == 0
    assert metrics_3[names.ASYNC_STALENESS_MAX] == 1


# -- closing the stream ------------------------------------------------------------------


class ClosesSlowly:
    """Done after one step; once ``close_s`` is set, ``close`` on an env thread takes that long
    (a sandbox being stopped; the prompts' load-time check closes its envs on the caller's
    thread, at once). Counts the closes on env threads."""

    close_s = 0.0
    closed = 0
    lock = threading.Lock()

    def __new__(cls, **kwargs):
        from skyrl.envs.base import StepResult, TextEnv

        class Env(TextEnv):
            def step(self, action_text):
                return StepResult([], 1.0, True)

            def close(self):
                if threading.current_thread().name != "skyrl-env":
                    return
                time.sleep(ClosesSlowly.close_s)
                with ClosesSlowly.lock:
                    ClosesSlowly.closed += 1

        return Env(**kwargs)


class Stops:
    """A component of the trainer (worker group, engine, shared weights) recording its stop."""

    def __init__(self, name: str, stopped: list[str]):
        self.name, self.stopped = name, stopped

    def shutdown(self) -> None:
        self.stopped.append(self.name)

    close = shutdown


def test_shutdown_after_an_async_run_does_not_wait_for_envs_to_close(tmp_path):
    # The end of an async run: the next groups' 4 requests (2 prompts x 2 samples) are at a
    # slow engine; 1 env call at a time, each env close 1 s. Each cancelled trajectory awaited
    # its env's close, one after another in the one slot, until each group had one close
    # done: shutdown took 3 x 1 s here (with 12 in flight and closes of 8 s in 2 slots it ran
    # past close's 30 s and RLTrainer.shutdown raised TimeoutError, stopping nothing else), and
    # the closes still queued when the loop stopped never ran. Now the closes run on threads
    # of their own, not waited for.
    from skyrl.trainer.trainer import RLTrainer

    cfg = _cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.ClosesSlowly",
        "environment.max_concurrent_calls=1",
    )  # fmt: skip
    tok = _tokenizer(cfg)
    engine = TimedEngine(tok, {})
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    ClosesSlowly.close_s, ClosesSlowly.closed = 0.0, 0
    try:
        _next_batch_within(source, 1)
        wait_until_line_done(source)  # s1r0p2 s1r0p3 generated, their envs closed
        engine.default_s, ClosesSlowly.close_s, ClosesSlowly.closed = 1000.0, 1.0, 0
        with source.updating_weights(1, timeout_s=10):
            pass  # 2 more prompts admitted: their 4 requests hang at the engine
        deadline = time.monotonic() + 20
        while source.gated.in_flight < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.gated.in_flight == 4
        stopped: list[str] = []
        tr = RLTrainer.__new__(RLTrainer)
        tr.rollouts, tr.engine = source, Stops("engine", stopped)
        tr.policy, tr.reference = Stops("policy", stopped), Stops("reference", stopped)
        tr.critic, tr.shared_weights = Stops("critic", stopped), Stops("shared_weights", stopped)
        tr.shutdown()
        closed_by_then = ClosesSlowly.closed  # each close takes 1 s: none ended if none waited
    finally:
        source.close()
        ClosesSlowly.close_s = 0.0
    assert closed_by_then == 0
    assert stopped == ["critic", "reference", "policy", "engine", "shared_weights"]
    assert source.loop.is_closed() and not source.thread.is_alive()
    deadline = time.monotonic() + 10
    while ClosesSlowly.closed < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ClosesSlowly.closed == 4  # every env of the 4 cancelled trajectories, closed anyway


def test_close_gives_up_on_a_cancel_that_does_not_end_and_says_so(tmp_path, caplog):
    # A task on the stream's loop that goes on for 5 s once cancelled: close() waited its 30 s
    # for it and raised TimeoutError. Now it waits timeout_s, warns once and stops the loop.
    import asyncio
    import logging

    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)

    async def stubborn() -> None:
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            await asyncio.sleep(5)  # cleaning up, for longer than close waits

    async def spawn() -> None:
        source._spawn(stubborn())

    source._on_loop(spawn())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="skyrl.rollouts.async_rollouts"):
        source.close(timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "0.2 s" in warned[0]
    assert source.loop.is_closed() and not source.thread.is_alive()


def test_close_closes_the_event_loop(tmp_path):
    # The loop was stopped, never closed: ResourceWarning "unclosed event loop" at exit.
    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    _next_batch_within(source, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        source.close()
        source.close()  # twice: nothing more
    assert source.loop.is_closed() and not source.thread.is_alive()


def test_an_eval_pass_is_engine_time_not_idle_time(tmp_path):
    # Each eval request takes 1 s at the engine; the eval runs while a weight sync holds the
    # stream's requests (its requests are not held: it returns). The engine is busy for those
    # ~1 s: it counted as idle (async/engine_idle_s >= 1.0). Counted busy, step 2's idle time
    # is the little between the stream's requests: well under 0.5 s.
    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    engine = TimedEngine(tok, {f"eval{i}": 1.0 for i in range(4)})
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    evaluated: Future = Future()
    try:
        _next_batch_within(source, 1)
        wait_until_line_done(source)
        sync = source.updating_weights(1, timeout_s=10)  # holds new requests from here
        threading.Thread(
            target=lambda: evaluated.set_result(source.evaluate()), daemon=True
        ).start()
        metrics_eval = evaluated.result(20)  # not held by the sync's gate
        with sync:
            pass
        _, metrics = _next_batch_within(source, 2)
    finally:
        source.close()
    assert metrics_eval["eval/seconds"] >= 1.0
    assert metrics[names.ASYNC_ENGINE_IDLE_S] < 0.5


async def one_request(client, row) -> float:
    """An external agent: one request, reward 1."""
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return 1.0


def accepts_connections(server) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex((server.host, server.port)) == 0


@pytest.mark.parametrize("staleness", [0, 1])
def test_closing_the_source_stops_an_external_agents_endpoints(tmp_path, staleness):
    # generator.agent naming an async function: its driver serves an OpenAI endpoint on a
    # thread of its own (one for the stream, one for the eval pass of the async source).
    # Neither source stopped them: each run left its endpoints listening.
    cfg = _cfg(f"trainer.max_staleness={staleness}", f"generator.agent={__name__}.one_request")
    tok = _tokenizer(cfg)
    if staleness:
        source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    else:
        source = SyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        batch, _ = _next_batch_within(source, 1)
        assert batch.require("rewards").sum().item() == 4.0  # 2 prompts x 2 samples, reward 1
        source.evaluate()
        servers = [source.generator.driver.server]
        if staleness:
            servers.append(source.eval_generator.driver.server)
        assert len({id(s) for s in servers}) == len(servers)
        assert all(accepts_connections(s) for s in servers)
    finally:
        source.close()
    assert not any(accepts_connections(s) for s in servers)


def test_a_background_load_whose_drain_timed_out_ends_the_next_batch(tmp_path):
    # A background load (the trainer goes on to its next batch) waits for step 2's requests,
    # in flight at the sync (1.5 s each), at most 0.5 s: WeightSyncTimeout, the weights never
    # load. The block's exit still moved the clock to version 1 and opened the gate, so
    # next_batch(2) returned step 2's rows as finished at version 1 (engines at 0) and the
    # failure surfaced a step later, or never when the trainer's wait lost the deadline race.
    from skyrl.rollouts import WeightSyncTimeout

    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
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
        _next_batch_within(source, 1)
        thread = threading.Thread(target=load, args=(source.updating_weights(1, 0.5),))
        thread.start()
        thread.join(5)
        assert "request(s) in flight" in failed.result(0)
        assert source.clock.current == 0  # the engines still hold version 0
        with pytest.raises(WeightSyncTimeout, match=r"request\(s\) in flight"):
            _next_batch_within(source, 2, seconds=10)
    finally:
        source.close()


def test_a_batch_awaited_past_the_deadline_of_a_drain_names_the_requests_in_flight(tmp_path):
    # The hold of sync 1 is on (deadline 0.5 s) and step 2's requests (3 s each) are in flight:
    # the weights cannot load before they finish (2 prompts x 2 samples = 4 requests).
    # next_batch(2) gave up at the deadline naming "the inference engines to load the
    # weights", which were never what it waited for.
    from skyrl.rollouts import WeightSyncTimeout

    cfg = _cfg("trainer.max_staleness=1")
    tok = _tokenizer(cfg)
    source = AsyncRollouts(cfg, TimedEngine(tok, {"s2r0p2": 3.0, "s2r0p3": 3.0}), tok, tmp_path)
    try:
        _next_batch_within(source, 1)
        source.updating_weights(1, 0.5)  # the load thread has not drained yet
        with pytest.raises(WeightSyncTimeout, match=r"^4 request\(s\) in flight on the inf"):
            _next_batch_within(source, 2, seconds=10)
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
    cfg = _cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.FailingStep",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    tok = _tokenizer(cfg)
    sync_cfg = _cfg(
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
            batch, metrics = _next_batch_within(source, 1)
    finally:
        FailingStep.failing = False
        source.close()
    assert len(set(batch.metadata["uids"])) == 2
    assert metrics[names.ASYNC_FILTERED_GROUPS] == 4
    assert sync_metrics[names.ENV_ERRORS] == 12.0
    assert metrics[names.ENV_ERRORS] == 12.0
    # the staleness describes what is trained: the batch's 2 groups x 2 samples, at version 0
    assert metrics[names.ASYNC_STALENESS_MAX] == 0.0

"""``AsyncRollouts``: the admission rule, the stream against a real engine actor (tiny model),
and its equality with the synchronous source at ``max_staleness=0``."""

from __future__ import annotations

import time

import pytest
from async_helpers import async_cfg, tokenizer_of

import skyrl
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate
from skyrl.inference import make_engine
from skyrl.rollouts import make_rollouts
from skyrl.rollouts.async_rollouts import Admission, AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts
from skyrl.tracking import metric_names as names


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


@pytest.fixture(scope="module")
def actor_engine(ray_cluster):
    cfg = async_cfg()
    engine = make_engine(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    yield engine
    engine.shutdown()


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
    cfg = async_cfg()
    tok = tokenizer_of(cfg)
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
    cfg = async_cfg("trainer.max_staleness=1")
    source = make_rollouts(cfg, tokenizer_of(cfg), tmp_path, actor_engine)
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
    cfg = async_cfg("trainer.max_staleness=2")
    tok = tokenizer_of(cfg)
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
    cfg = async_cfg("trainer.max_staleness=1", f"trainer.partial_rollouts={partial}")
    # step 2's prompts (chunk 2: uids s2r0p2, s2r0p3) answer 1.5 s late: in flight at the sync
    engine = DelayedEngine(actor_engine, {"s2r0p2", "s2r0p3"}, delay_s=1.5)
    source = AsyncRollouts(cfg, engine, tokenizer_of(cfg), tmp_path)
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

    cfg = async_cfg("trainer.max_staleness=1")
    engine = DelayedEngine(actor_engine, {"s2r0p2", "s2r0p3"}, delay_s=5.0)
    source = AsyncRollouts(cfg, engine, tokenizer_of(cfg), tmp_path)
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
    cfg = async_cfg(
        "trainer.max_staleness=1", "algorithm.dynamic_sampling=filter",
        f"algorithm.dynamic_filter={__name__}.keep_even_prompts",
    )  # fmt: skip
    source = AsyncRollouts(cfg, actor_engine, tokenizer_of(cfg), tmp_path)
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

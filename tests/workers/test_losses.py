"""The policy loss and KL estimator a worker trains with are the driver's: a function
registered where the run started (a notebook's or script's ``__main__``), under a new name or
over a built-in (``override=True``), reaches the worker process, whose own registries hold
only what it imports (``skyrl.workers.losses.driver_parts``).

The driver and the worker are two processes here, as on Ray: the driver registers the
functions in its ``__main__`` and pickles them as ``WorkerGroup`` does; the worker, which
never defined them, builds a ``TrainingWorker`` with them and takes one step.
"""

from __future__ import annotations

import textwrap

import pytest
from worker_helpers import run_script

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent(
    """
    import dataclasses, pickle, sys
    from worker_helpers import make_config

    from skyrl.algorithms import KL_ESTIMATORS, POLICY_LOSSES
    from skyrl.algorithms.kl import k1
    from skyrl.algorithms.policy_losses.ppo import ppo
    from skyrl.workers.group import pickled_driver_parts

    @POLICY_LOSSES.register("shifted_ppo")  # a new name
    def shifted_ppo(*args):
        loss, metrics = ppo(*args)
        return loss + 7.0, metrics

    @KL_ESTIMATORS.register("k1", override=True)  # over a built-in
    def tripled_k1(logprobs, ref_logprobs):
        return 3.0 * k1(logprobs, ref_logprobs)

    model_path, out = sys.argv[1], sys.argv[2]
    cfg = make_config(model_path, dp_size=1, micro_batch_max_tokens=64)  # one micro batch
    algorithm = dataclasses.replace(
        cfg.algorithm, policy_loss="shifted_ppo", use_kl_loss=True, kl_estimator="k1"
    )
    cfg = dataclasses.replace(cfg, algorithm=algorithm)
    with open(out, "wb") as f:
        pickle.dump((cfg, pickled_driver_parts(cfg)), f)
    print("{}")  # run_script reads a JSON line
    """
)

WORKER = textwrap.dedent(
    """
    import dataclasses, json, pickle, sys
    import torch
    from worker_helpers import MAX_SEQ_LEN, make_batch

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import compute_prompt_mini_batch_boundaries
    from skyrl.dispatch import MeshDispatch
    from skyrl.tracking import metric_names as names
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.worker import TrainingWorker

    model_path, payload = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    with open(payload, "rb") as f:
        cfg, parts = pickle.load(f)
    batch = make_batch(model_path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    # log pi_ref = log pi_old - 0.5 on every loss token: k1 = log pi - log pi_ref = 0.5 there
    batch = batch.replace(ref_logprobs=(batch.old_logprobs - 0.5) * batch.loss_mask)
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], 2, 2)
    ((chunk,),) = MeshDispatch.stage_chunks(
        1, batch, bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )

    def first_step(cfg, parts):
        worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10, None, parts)
        record = worker.train_mini_batch(chunk)
        return {"loss": record.losses.loss, "kl_sum": record.losses.token_sums[names.KL_TERM]}

    out = {}
    try:  # this process never registered shifted_ppo
        first_step(cfg, None)
    except KeyError as exc:
        out["without_parts"] = str(exc)
    builtin = dataclasses.replace(cfg.algorithm, policy_loss="ppo")
    out["builtin"] = first_step(dataclasses.replace(cfg, algorithm=builtin), None)
    out["driver"] = first_step(cfg, parts)
    print(json.dumps(out))
    """
)


def test_the_worker_trains_with_the_drivers_loss_and_kl_estimator(tiny_model_path, tmp_path):
    payload = str(tmp_path / "driver.pkl")
    for script in (DRIVER, WORKER):
        out = run_script(script, tiny_model_path, payload)
    # what the workers did before: they looked the name up in their own registry
    assert "unknown policy loss 'shifted_ppo'" in out["without_parts"]
    builtin, driver = out["builtin"], out["driver"]
    # the same first step from the same weights: the driver's loss is ppo + 7 (one micro batch)
    assert driver["loss"] == pytest.approx(builtin["loss"] + 7.0, abs=1e-5)
    # k1 = 0.5 on each of the 12 + 5 + 9 + 2 = 28 loss tokens (ratio 1 at the first step):
    # 14 with the built-in k1, 3 x 14 = 42 with the driver's override of it
    assert builtin["kl_sum"] == pytest.approx(14.0, abs=1e-4)
    assert driver["kl_sum"] == pytest.approx(42.0, abs=1e-4)


def test_a_driver_part_that_does_not_pickle_is_a_config_error_naming_its_key(tiny_model_path):
    # a loss whose global cannot be pickled (a lock) raised a bare TypeError after the policy's
    # placement group was reserved, which then stayed reserved
    import dataclasses
    import threading

    from worker_helpers import make_config

    from skyrl.algorithms import POLICY_LOSSES
    from skyrl.algorithms.policy_losses.ppo import ppo
    from skyrl.config.errors import ConfigError
    from skyrl.workers.group import pickled_driver_parts

    lock = threading.Lock()

    @POLICY_LOSSES.register("locked_ppo_test_only", override=True)
    def locked_ppo(*args):
        with lock:
            return ppo(*args)

    cfg = make_config(tiny_model_path, dp_size=1)
    cfg = dataclasses.replace(
        cfg, algorithm=dataclasses.replace(cfg.algorithm, policy_loss="locked_ppo_test_only")
    )
    with pytest.raises(ConfigError) as err:
        pickled_driver_parts(cfg)
    assert err.value.key == "algorithm.policy_loss" and "lock" in err.value.message

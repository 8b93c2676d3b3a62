"""The ``skyrl-train`` entry point (also ``python -m skyrl``).

Hydra composes the config from ``skyrl/conf`` (shipped inside the package, so
it works from any directory and from a non-editable install). Before Hydra's
own main runs, the command line is composed and validated once here, so that a
typo, a wrong type, an unknown option or a violated rule ends with ONE line
naming the key instead of a traceback. Then ``skyrl.train`` runs the pre-flight check
(``skyrl.config.preflight``: data files and rows, prompt lengths, model paths, the env,
the rollout driver), for a dry run too; what it finds is a ``ConfigError`` as well: one
``error:`` line naming the key, exit 2, before Ray or any engine starts.
"""

from __future__ import annotations

import math
import sys

import hydra
from omegaconf import DictConfig

from skyrl.api import TrainResult, train
from skyrl.config import register_configs
from skyrl.config.cli_errors import one_line_error
from skyrl.config.errors import ConfigError
from skyrl.config.precheck import precheck_command_line
from skyrl.models.resolve import ModelNotFoundError
from skyrl.tracking import metric_names as names

EXIT_CONFIG_ERROR = 2
EXIT_RUN_FAILED = 1


def run(cfg: DictConfig) -> TrainResult:
    """The Hydra task: train in Hydra's run (or sweep job) directory unless
    ``trainer.output_dir`` is set."""
    from hydra.core.hydra_config import HydraConfig

    configured = cfg.trainer.get("output_dir")
    return train(cfg, configured or HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    """Returns the final held-out pass@1 (a sweeper's objective), if the run evaluated.

    In a multirun a failed job raises (Hydra records it as failed and the sweep goes on);
    a single run ends with one error line and an exit code instead."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from skyrl.inference.client import EngineDiedError
    from skyrl.trainer.trainer import TrainingAborted
    from skyrl.workers.group import WorkerDiedError

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        result = run(cfg)
    except ConfigError as exc:
        if multirun:
            raise
        print(one_line_error(exc), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except ModelNotFoundError as exc:  # a config value naming nothing: its key, then what was tried
        if multirun:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    except (WorkerDiedError, EngineDiedError, TrainingAborted) as exc:
        if multirun:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_RUN_FAILED)
    objective = result.final(names.EVAL_PASS_AT_1)
    if math.isnan(objective):
        if multirun and "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")):
            raise ValueError(
                "no eval/pass@1 to return as the sweep objective: set data.num_eval_prompts > 0"
            )
        return None
    return objective


def check_command_line() -> None:
    """Compose and validate ``sys.argv`` once; a problem is one line on stderr and exit 2
    (``skyrl-train`` and ``skyrl-eval`` alike)."""
    register_configs()
    problem = precheck_command_line(sys.argv[1:])
    if problem is not None:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def main() -> None:
    """Console script: check the command line, then hand it to Hydra."""
    check_command_line()
    _hydra_main()


if __name__ == "__main__":
    main()

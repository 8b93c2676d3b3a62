"""The ``skyrl-train`` entry point (also ``python -m skyrl.train``).

Hydra composes the config from ``skyrl/conf`` (shipped inside the package, so
it works from any directory and from a non-editable install). Before Hydra's
own main runs, the command line is composed and validated once here, so that a
typo, a wrong type, an unknown option or a violated rule ends with ONE line
naming the key instead of a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from skyrl.config import register_configs
from skyrl.config.cli_errors import one_line_error
from skyrl.config.errors import ConfigError
from skyrl.config.precheck import precheck_command_line
from skyrl.config.validate import validate
from skyrl.trainer.plan import format_plan, make_plan

EXIT_CONFIG_ERROR = 2


def run(cfg: DictConfig, output_dir: Path | None = None) -> int:
    """Validate ``cfg``, save it resolved into the output dir, and run (or plan) the job."""
    typed = validate(cfg)
    output_dir = output_dir or _output_dir(typed.trainer.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, output_dir / "resolved_config.yaml", resolve=True)
    print(format_plan(make_plan(typed)))
    print(f"  {'output dir':<22}  {output_dir}")
    if typed.trainer.dry_run:
        return 0
    return _train(typed, output_dir)


def _train(cfg, output_dir: Path) -> int:
    """Start Ray (if needed), run the loop, export the final policy."""
    import ray

    from skyrl.trainer.trainer import RLTrainer

    if not ray.is_initialized():
        ray.init(num_cpus=_logical_cpus(cfg), include_dashboard=False, log_to_driver=False)
    trainer = RLTrainer(cfg, output_dir)
    try:
        trainer.train()
        if cfg.trainer.export_hf:
            print(f"final policy: {trainer.export()}")
    finally:
        trainer.shutdown()
    return 0


def _logical_cpus(cfg) -> int:
    """Ray CPUs for every worker bundle plus the driver (logical: may exceed the cores)."""
    t, a = cfg.trainer, cfg.algorithm
    roles = 1 + int(a.uses_critic) + int(a.uses_reference and not t.colocate_policy_ref)
    import math
    import os

    return max(os.cpu_count() or 1, math.ceil(t.dp_size * t.num_cpus_per_worker * roles) + 1)


def _output_dir(configured: str | None) -> Path:
    if configured:
        return Path(configured)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> int:
    try:
        return run(cfg)
    except ConfigError as exc:
        print(one_line_error(exc), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def main() -> None:
    """Console script: check the command line, then hand it to Hydra."""
    register_configs()
    problem = precheck_command_line(sys.argv[1:])
    if problem is not None:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    _hydra_main()


if __name__ == "__main__":
    main()

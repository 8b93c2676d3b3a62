"""``skyrl-serve``: any ``model.path`` behind an OpenAI-compatible endpoint.

    skyrl-serve model.path=skyrl-tiny generator=hf          the tiny model, transformers engine
    skyrl-serve serve.port=8001 generator.num_engines=2     two engines behind one endpoint

The config is composed and validated as for ``skyrl-train`` (same groups and
overrides); ``serve.host`` / ``serve.port`` say where to listen and
``serve.model_name`` the model id clients send (default ``model.path``). The
engine is the one ``generator`` names; requests are limited by
``generator.max_prompt_length`` and ``generator.max_generate_length``. The base
URL is printed once the endpoint listens; Ctrl-C (or SIGTERM) stops it.
"""

from __future__ import annotations

import signal
import sys
from concurrent.futures import Future

import hydra
from omegaconf import DictConfig

from skyrl.config.errors import ConfigError

SERVE_RUN_DIR = "hydra.run.dir=outputs/serve/${now:%Y-%m-%d}/${now:%H-%M-%S}"
"""Where a server's Hydra run directory goes unless the command line says otherwise."""


def serve(cfg: DictConfig, stop: Future | None = None) -> None:
    """Serve until ``stop`` is done (or a signal); blocks."""
    from skyrl.config.preflight import load_tokenizer, local_model_paths
    from skyrl.config.validate import validate
    from skyrl.inference.factory import make_engine
    from skyrl.serve.app import HTTPServer, build_app
    from skyrl.serve.backend import EngineBinding, Limits, OpenAIBackend

    typed = local_model_paths(validate(cfg))
    g, s = typed.generator, typed.serve
    assert typed.model.tokenizer_path is not None  # local_model_paths sets it
    tokenizer = load_tokenizer(typed, typed.model.tokenizer_path)
    if g.engines_in_actors:
        from skyrl.api import start_ray

        start_ray()
    engine = make_engine(
        g,
        typed.model.path,
        typed.model.tokenizer_path,
        trust_remote_code=typed.model.trust_remote_code,
    )
    stop = stop or Future()
    try:
        names = [s.model_name or cfg.model.path]
        limits = Limits(g.max_prompt_length, g.max_generate_length, g.max_tokens_per_turn)
        backend = OpenAIBackend(
            tokenizer, names, limits, EngineBinding(engine), tool_parser=g.tool_parser
        )
        server = HTTPServer(build_app(backend), s.host, s.port)
        try:
            url = server.start()
        except OSError as exc:
            raise ConfigError("serve.port", str(exc)) from None
        print(f"skyrl-serve: {names[0]} at {url} (Ctrl-C stops)", flush=True)

        def on_signal(*_) -> None:
            if not stop.done():
                stop.set_result(None)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        engine.serve(stop)  # an in-process engine works on this thread until stop
        stop.result()
        server.stop()
    finally:
        engine.shutdown()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from skyrl.cli import EXIT_CONFIG_ERROR
    from skyrl.config.cli_errors import one_line_error

    try:
        serve(cfg)
    except ConfigError as exc:
        print(one_line_error(exc), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def main() -> None:
    """Console script: check the command line (as ``skyrl-train`` does), then serve."""
    from skyrl.cli import check_command_line

    check_command_line()
    if not any(a.startswith(("hydra.run.dir=", "hydra/")) for a in sys.argv[1:]):
        sys.argv.insert(1, SERVE_RUN_DIR)
    _hydra_main()


if __name__ == "__main__":
    main()

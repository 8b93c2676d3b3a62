"""``skyrl-serve``: any ``model.path`` behind an OpenAI-compatible endpoint.

    skyrl-serve model.path=skyrl-tiny generator=hf          the tiny model, transformers engine
    skyrl-serve serve.port=8001 generator.num_engines=2     two engines behind one endpoint

The config is composed and validated as for ``skyrl-train`` (same groups and
overrides); ``serve.host`` / ``serve.port`` say where to listen and
``serve.model_name`` the model id clients send (default ``model.path``). The
engine is the one ``generator`` names; requests are limited by
``generator.max_prompt_length`` and ``generator.max_generate_length``. The base
URL is printed once the endpoint listens; Ctrl-C (or SIGTERM) stops it (exit 0).

A mistake is one ``error:`` line naming the key, exit 2, found before the engine loads
(minutes for a large model): ``serve`` values that cannot work (a port out of range, an empty
host or model name) are refused by ``validate``; ``serve.host`` / ``serve.port`` are bound
once up front (a port in use, a host that is no address of this machine); ``model.path``
must be a model folder with a tokenizer. Ctrl-C or SIGTERM before the endpoint listens ends the
start with one line and exit 128 + the signal (130, 143). A sweep (``-m``) is refused: each job
would serve until stopped, and Ctrl-C would only start the next.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
from concurrent.futures import Future
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from skyrl.config.errors import ConfigError

SERVE_RUN_DIR = "hydra.run.dir=outputs/serve/${now:%Y-%m-%d}/${now:%H-%M-%S}"
"""Where a server's Hydra run directory goes unless the command line says otherwise."""


def serve(cfg: DictConfig, stop: Future | None = None) -> None:
    """Serve until ``stop`` is done (or a signal); blocks."""
    from skyrl.config.preflight import (
        check_vocab_size,
        load_tokenizer,
        local_model_paths,
        model_text_config,
    )
    from skyrl.config.validate import validate
    from skyrl.generators.tool_calls import check_tool_parser
    from skyrl.inference.factory import make_engine
    from skyrl.serve.app import HTTPServer, build_app
    from skyrl.serve.backend import EngineBinding, Limits, OpenAIBackend

    checked = validate(cfg)
    check_listen_address(checked.serve.host, checked.serve.port)
    check_tool_parser(checked.generator.tool_parser)
    typed = local_model_paths(checked)
    g, s = typed.generator, typed.serve
    assert typed.model.tokenizer_path is not None  # local_model_paths sets it
    # the key the user set: model.path unless model.tokenizer_path was given
    tokenizer = load_tokenizer(checked, typed.model.tokenizer_path)
    model_config = model_text_config(typed.model.path, "model.path", typed.model.trust_remote_code)
    check_vocab_size(checked, len(tokenizer), model_config, None)
    if g.engines_in_actors:  # with room for them: a local Ray of the cores may have too little
        from skyrl.api import ray_for_engines

        ray_for_engines(typed)
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


def check_listen_address(host: str, port: int) -> None:
    """``serve.host`` / ``serve.port`` can be listened on: bound once, as uvicorn will bind
    them, and released (a ``ConfigError`` naming the key that is wrong). Their values (a
    port in range, a host named) are ``ServeConfig``'s own rules, checked by ``validate``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # uvicorn's choice
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn sets it
        try:
            sock.bind((host, port))
        except OSError as exc:
            problem = exc
        else:
            return
    if problem.errno == errno.EADDRINUSE:
        raise ConfigError("serve.port", f"{host}:{port} is already in use")
    if problem.errno == errno.EACCES:
        raise ConfigError("serve.port", f"{host}:{port}: permission denied (ports below 1024)")
    raise ConfigError("serve.host", f"cannot listen on {host}: {problem.strerror or problem}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from skyrl.cli import EXIT_CONFIG_ERROR
    from skyrl.config.cli_errors import one_line_error

    try:
        serve(cfg)
    except ConfigError as exc:
        print(one_line_error(exc), file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


SERVE_SUMMARY = (
    "Serve any model.path behind an OpenAI-compatible endpoint (/v1/chat/completions, "
    "/v1/completions, /v1/models) through the engine the generator group names; serve.host "
    "and serve.port say where to listen, serve.model_name the model id clients send. "
    "Ctrl-C stops it."
)
NO_SWEEP = (
    "error: --multirun: skyrl-serve serves one endpoint until it is stopped, so a sweep would "
    "serve its jobs one after another; start one skyrl-serve per config"
)
"""``skyrl-serve -m``: each job would serve until stopped, and Ctrl-C would start the next."""
SERVE_EXAMPLES = (
    ("skyrl-serve model.path=skyrl-tiny generator=hf", "the tiny model, transformers engine"),
    ("skyrl-serve serve.port=8001 generator.num_engines=2", "two engines behind one endpoint"),
)


def main() -> None:
    """Console script: check the command line (as ``skyrl-train`` does), then serve."""
    from hydra._internal.utils import get_args_parser

    from skyrl.cli import EXIT_CONFIG_ERROR, check_command_line, hydra_flags_problem
    from skyrl.config.help import command_help, wants_help

    if wants_help(sys.argv[1:]):
        print(command_help("skyrl-serve", SERVE_SUMMARY, SERVE_EXAMPLES, sys.argv[1:]))
        return
    problem = hydra_flags_problem(sys.argv[1:])  # first: the parse below would print usage
    if problem is None and get_args_parser().parse_known_args(sys.argv[1:])[0].multirun:
        problem = NO_SWEEP
    if problem is not None:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    signal.signal(signal.SIGTERM, _interrupt)  # until serve() listens: as Ctrl-C
    try:
        check_command_line()
        if not any(a.startswith(("hydra.run.dir=", "hydra/")) for a in sys.argv[1:]):
            sys.argv.insert(_first_override(sys.argv), SERVE_RUN_DIR)
        _hydra_main()
    except KeyboardInterrupt as exc:  # before the endpoint listened (serve() then takes both)
        signum = next((a for a in exc.args if isinstance(a, signal.Signals)), signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else f"terminated ({signum.name})"
        print(f"skyrl-serve: {what} while starting; nothing was served", file=sys.stderr)
        sys.exit(128 + signum)


def _first_override(argv: list[str]) -> int:
    """Where in ``argv`` the overrides start (else its end): an override put there keeps them
    one run, as Hydra's parser needs (``--cfg job a=1`` takes ``a=1``; ``x=1 --cfg job a=1``
    would not)."""
    return next((i for i, a in enumerate(argv) if i and "=" in a and a[0] != "-"), len(argv))


def _interrupt(signum: int, frame: object) -> NoReturn:
    """SIGTERM while starting: interrupt as Ctrl-C does (once; a second one is ignored)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum))


if __name__ == "__main__":
    main()

"""The HTTP side: a FastAPI app over an ``OpenAIBackend``, served by uvicorn on a thread.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET
/v1/models``, ``GET /health``. A body that is not JSON (or nested too deeply for
Python's parser) is a 400; every error is
an OpenAI error object (``APIError``), an unexpected exception included (a 500
``server_error``; its traceback goes to the server's log, not to the client);
streaming responses are server-sent events. ``HTTPServer`` runs uvicorn on a
daemon thread with its own event loop and knows its base URL once listening
(``port=0`` picks a free port).
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at runtime.

import json
import logging
import threading
import time
from typing import Optional

from skyrl.serve.backend import OpenAIBackend
from skyrl.serve.fields import APIError

logger = logging.getLogger(__name__)


def build_app(backend: OpenAIBackend):
    """The FastAPI application."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="skyrl", docs_url=None, redoc_url=None, openapi_url=None)

    def error(exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read(request: Request):
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc})") from None
        except RecursionError:  # Python's parser gives up past ~1000 levels
            raise APIError(400, "the request body is nested too deeply to read") from None

    def key_of(request: Request) -> Optional[str]:  # noqa: UP045
        auth = request.headers.get("authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    async def answer(request: Request, call):
        try:
            result = await call(await read(request), key_of(request))
        except APIError as exc:
            return error(exc)
        except Exception:
            logger.exception("%s %s failed", request.method, request.url.path)
            failed = "the server failed on this request; its log has the traceback"
            return error(APIError(500, failed, type="server_error"))
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, backend.chat)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, backend.completion)

    @app.get("/v1/models")
    async def models():
        return JSONResponse(backend.models())

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"})

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error(APIError(404, f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def wrong_method(request: Request, exc):
        return error(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

    return app


class HTTPServer:
    """uvicorn serving an app on a daemon thread."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.host = host
        self.port = port
        self._thread: Optional[threading.Thread] = None  # noqa: UP045
        self._failed: Optional[BaseException] = None  # noqa: UP045

    def start(self, timeout_s: float = 30.0) -> str:
        """Start listening; the base URL (``http://host:port/v1``)."""

        def run() -> None:
            try:
                self.server.run()
            except BaseException as exc:  # reported by start()
                self._failed = exc

        self._thread = threading.Thread(target=run, name="skyrl-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise OSError(
                    f"the endpoint could not listen on {self.host}:{self.port}"
                    + (f" ({self._failed})" if self._failed else "")
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the endpoint did not start within {timeout_s:g} s")
            time.sleep(0.01)
        sockets = [s for server in self.server.servers for s in server.sockets]
        self.port = sockets[0].getsockname()[1]
        return self.base_url

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

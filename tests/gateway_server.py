"""The inference gateway (`conch.gateway`'s ASGI application) served by uvicorn on a thread of the test process,
against the test database, the way `live_server` serves the console."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from conch.gateway_protocol import BoundedHttpToolsProtocol
from deployments.api.gateway import GatewayApp
from deployments.services.serving import Serving
from tests.services import free_port


class GatewayServer:
    """A running gateway: `url` is its base URL (`http://127.0.0.1:PORT`); `app` the application it serves. With
    `grpc`, it serves the gRPC edge too, at `grpc_target` (`127.0.0.1:PORT`), sharing `serving` (a `Serving`, e.g.
    one with a clock the test sets) or a new one."""

    def __init__(self, *, grpc: bool = False, serving: Serving | None = None) -> None:
        self.app = GatewayApp(serving, grpc_bind="127.0.0.1:0" if grpc else "")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_target = ""
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            http=BoundedHttpToolsProtocol,  # as `python -m conch.gateway` serves it
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        if self.app.grpc is not None:
            self.grpc_target = f"127.0.0.1:{self.app.grpc.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)


@pytest.fixture
def gateway(transactional_db, settings):
    """A gateway serving the test database; `settings.CONCH_GATEWAY_URL` points at it."""
    server = GatewayServer()
    server.start()
    settings.CONCH_GATEWAY_URL = server.url
    yield server
    server.stop()

"""The inference gateway's server process: `python -m conch.gateway` (uvicorn, uvloop, httptools; grpc.aio).

Serves `deployments.api.gateway.GatewayApp` (KServe v2 REST) on CONCH_GATEWAY_BIND (127.0.0.1:8001 by default)
and, on the same event loop with the same routes, rate limits and usage meter, the KServe v2 gRPC service
(`deployments.api.grpc_gateway`) on CONCH_GATEWAY_GRPC_BIND (127.0.0.1:8002 by default; empty: none), with
CONCH_GATEWAY_WORKERS processes (with more than one, their gRPC servers share the port through SO_REUSEPORT).

Why a process of its own and not a view of the console's web server (`conch.web`): the console's requests are
blocking Django views (uploads of GiBs among them), each run in a thread, while the gateway relays many small
concurrent requests; an event loop with pooled keep-alive connections to Triton adds far less to each request
than a thread of a WSGI server (bench/serving.py, systems e and g).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
django.setup()

from django.conf import settings as _settings  # noqa: E402

from conch.gateway_protocol import BoundedHttpToolsProtocol  # noqa: E402
from deployments.api.gateway import GatewayApp  # noqa: E402 - needs Django set up

__all__ = ["application", "main"]

application = GatewayApp(
    grpc_bind=_settings.CONCH_GATEWAY_GRPC_BIND,
    # Several worker processes share the gRPC port (each has its own gRPC server); one binds it alone.
    grpc_reuse_port=int(os.environ.get("CONCH_GATEWAY_WORKERS", "1")) > 1,
)


def main() -> None:
    """Run the gateway in the foreground until SIGINT/SIGTERM."""
    import uvicorn
    from django.conf import settings

    host, _, port = settings.CONCH_GATEWAY_BIND.rpartition(":")
    uvicorn.run(
        "conch.gateway:application",
        host=host.strip("[]") or "127.0.0.1",
        port=int(port),
        workers=int(os.environ.get("CONCH_GATEWAY_WORKERS", "1")),
        loop=os.environ.get("CONCH_GATEWAY_LOOP", "uvloop"),
        http=BoundedHttpToolsProtocol,  # httptools, with a bound on request heads
        lifespan="on",
        access_log=False,
        server_header=False,
        proxy_headers=False,
        log_level=os.environ.get("CONCH_GATEWAY_LOG_LEVEL", "warning"),
    )


if __name__ == "__main__":
    main()

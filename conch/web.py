"""The console's web server process: `python -m conch.web [--bind HOST:PORT] [--workers N]` (uvicorn, uvloop,
httptools) serving the console, the API and the admin (`conch.asgi`).

Why an event loop and not a WSGI server's threads: under gunicorn (2 workers x 4 threads) sixteen clients that
declared a body and sent a byte every few seconds held every thread for as long as they liked, and every page
timed out. Here a request's body is read on the event loop before Django runs (`conch.asgi`), a slow head or a
stalled body is cut off with 408 (`conch.http_protocol.ConsoleProtocol`: CONCH_WEB_HEADER_TIMEOUT_SECONDS,
CONCH_WEB_BODY_TIMEOUT_SECONDS), and a view gets a thread only once its request has arrived whole.

Defaults: CONCH_BIND (127.0.0.1:8000) and CONCH_WEB_WORKERS (2) processes.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os

__all__ = ["main"]

# glibc's malloc raises its mmap threshold after large blocks are freed, so the 8 MiB parts an upload streams to
# S3 then come from the heap and stay in the process's RSS after the upload. A fixed threshold keeps such blocks
# on mmap: freed blocks go back to the OS (bench/upload.py). Set at import, so in every worker process too.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1024 * 1024


def _keep_large_blocks_on_mmap() -> None:
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        ctypes.CDLL(libc_name).mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


_keep_large_blocks_on_mmap()

from conch.asgi import application  # noqa: E402 - after the allocator is set: Django's import allocates


def main(argv: list[str] | None = None) -> None:
    """Serve the console in the foreground until SIGINT/SIGTERM."""
    import uvicorn

    from conch.http_protocol import ConsoleProtocol

    parser = argparse.ArgumentParser(prog="python -m conch.web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bind", default=os.environ.get("CONCH_BIND", "127.0.0.1:8000"), help="HOST:PORT")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("CONCH_WEB_WORKERS", "2")))
    args = parser.parse_args(argv)
    host, _, port = args.bind.rpartition(":")
    uvicorn.run(
        "conch.web:application" if args.workers > 1 else application,
        host=host.strip("[]") or "127.0.0.1",
        port=int(port),
        workers=args.workers,
        loop=os.environ.get("CONCH_WEB_LOOP", "uvloop"),
        http=ConsoleProtocol,  # httptools, with bounds on heads and timeouts on slow heads and bodies
        lifespan="off",  # Django speaks no lifespan protocol
        ws="none",  # nor WebSocket: an upgrade request is served as plain HTTP
        timeout_graceful_shutdown=30,  # on SIGTERM, requests under way get this long (gunicorn's graceful_timeout)
        # A worker answers the supervisor's health ping from a thread while it imports Django and the apps; on a
        # busy 2-core machine those imports can hold it past uvicorn's 5 s default, and the supervisor then kills
        # and restarts it over and over (seen in CI as "Child process died" until the start timed out).
        timeout_worker_healthcheck=int(os.environ.get("CONCH_WEB_HEALTHCHECK_SECONDS", "30")),
        access_log=False,
        server_header=False,
        proxy_headers=False,  # the client's address behind a proxy: CONCH_TRUSTED_PROXIES
        log_level=os.environ.get("CONCH_WEB_LOG_LEVEL", "info"),
    )


if __name__ == "__main__":
    main()

"""Where the verify step runs: the worker's warm verify server (or a throwaway one), and stopping verify servers
whose build worker is gone."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from tritonserving import server as triton_server
from tritonserving import smoke
from tritonserving.smoke import ScratchServer, VerifyServer

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

#: Server ids of verify servers are "<CONCH_INSTANCE_ID>.verify.<owner pid>-<hex>", the owner being the worker
#: process that runs the build. Instance ids may not contain ".", so one installation's prefix never matches
#: another's.
SERVER_ID_INFIX_VERIFY = ".verify."


def scratch_server() -> ScratchServer | VerifyServer:
    """The server the verify step runs on: this process's warm one (CONCH_VERIFY_WARM_SERVER), else a throwaway."""
    if settings.CONCH_VERIFY_WARM_SERVER:
        return smoke.get_verify_server(_verify_server_settings())
    return ScratchServer(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}{os.getpid()}-{uuid.uuid4().hex[:12]}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
    )


def scratch_server_with_backends(backends: dict[str, tuple[str, Path]]) -> ScratchServer:
    """A throwaway verify server whose backend directory adds the custom `backends` (name -> (identity, local
    folder)): the warm server is shared by every team's builds, and Triton loads a backend once per server by name,
    so a team's backend is never put there."""
    return ScratchServer(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}{os.getpid()}-{uuid.uuid4().hex[:12]}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
        backends=backends,
    )


def _verify_server_settings() -> smoke.VerifyServerSettings:
    # The server appends "<owner pid>-<hex>": stop_verify_servers relies on that form.
    return smoke.VerifyServerSettings(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id_prefix=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
    )


def warm_up_verify_server() -> None:
    """Start this worker process's warm verify server in a background thread, so its first build finds it ready
    (run on Celery's `worker_process_init`). Does nothing when CONCH_VERIFY_WARM_SERVER is off."""
    if settings.CONCH_VERIFY_WARM_SERVER:
        smoke.warm_up_verify_server(_verify_server_settings())


def stop_warm_verify_server() -> None:
    """Stop this process's warm verify server, if it has one (run on Celery's `worker_process_shutdown`)."""
    smoke.stop_verify_server()


def stop_verify_servers(*, only_abandoned: bool = True) -> int:
    """Stop this installation's verify servers on this host whose build worker process is gone (all of them
    when `only_abandoned` is False, at shutdown); returns how many. Run by the periodic reconcile, so a verify
    server whose build died is stopped within one reconcile interval. A server counts as this installation's when
    its id starts with `<CONCH_INSTANCE_ID>.verify.` and it runs on the backend directory under CONCH_TRITON_DIR
    (`find_servers`): another installation's verify servers are left alone."""
    stopped = 0
    prefix = f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}"
    for found in triton_server.find_servers(prefix, backend_root=Path(settings.CONCH_TRITON_DIR) / "backends"):
        owner = found.server_id[len(prefix) :].split("-", 1)[0]
        if only_abandoned and owner.isdigit() and triton_server.process_exists(int(owner)):
            continue
        triton_server.stop_server(found.pid, found.create_time)
        stopped += 1
        log.warning("build.verify_server_stopped", extra={"server_id": found.server_id})
    return stopped

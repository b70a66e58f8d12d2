"""Inference asked by synchronous code (the REST API's `POST /api/v1/deployments/<id>/infer/`, the console's test
inference): the same path as the gateway's, from a Django view.

The request goes through the process's `Serving` (`deployments.services.serving`: the rate limiter, the usage
meter, the server pick) and `tritonserving.relay` (the data path), exactly as a request to the gateway does: a
token's requests through the REST API and through the gateway count against one limit (its requests per minute)
and land in the same usage rows. The view is synchronous (DRF) and the relay asynchronous, so each process keeps
one `InferenceEdge`: an event loop on a daemon thread of its own, holding the relay's pooled keep-alive
connections and the limiter's Redis sync. The view's thread hands each request to that loop and waits for the
answer (`asyncio.run_coroutine_threadsafe`), so the same code runs under the console's ASGI server, a WSGI
server, a management command or a test, whichever loop (if any) the caller has.

A console session (no token) is rate limited by the REST API's own inference budget (`conch.throttling`,
CONCH_API_RATES["inference"]) and not metered: usage is kept per token.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.db import transaction

from conch.errors import Conflict, InvalidInput, RateLimited, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.services.gateway import RELAY_TIMEOUT_S, Route, UsageCounts, deployment_route, require_servers
from deployments.services.records import require_deployment_access
from deployments.services.serving import MAX_SERVERS_TRIED, Serving, TooManyRequests
from tenancy.choices import Scope
from tenancy.services import TokenGrant
from tritonserving.client import InferenceResponse, TritonUnavailable, TritonUnreachable, check_inference_header
from tritonserving.relay import TritonRelay, infer_body

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)

__all__ = ["InferenceEdge", "inference_edge", "infer"]

T = TypeVar("T")


class InferenceEdge:
    """This process's event loop for inference asked by synchronous code, on a daemon thread: a `TritonRelay`
    and a `Serving` live on it. `clock` (seconds since the epoch) drives the rate limiter's windows (tests give
    one they set). `run(coroutine)` runs a coroutine there and returns its result (or raises its error);
    `close()` flushes the usage and stops the loop."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.pid = os.getpid()
        self.flushed_at = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conch-inference-edge", daemon=True)
        self._thread.start()
        self.relay, self.serving = self.run(self._start(clock))

    async def _start(self, clock: Callable[[], float]) -> tuple[TritonRelay, Serving]:
        relay = TritonRelay(max_connections=settings.CONCH_GATEWAY_MAX_CONNECTIONS, timeout_s=RELAY_TIMEOUT_S)
        serving = Serving(clock=clock)
        # Only the limiter's Redis sync runs here: usage is written by the requests' own threads, with their own
        # database connections (`flush_usage_when_due`), never from this loop's.
        serving.limiter.start()
        return relay, serving

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the edge's loop and wait for it; its exception is raised here."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def flush_usage_when_due(self) -> None:
        """Write the usage counted so far once CONCH_GATEWAY_USAGE_FLUSH_SECONDS have passed since the last write,
        from the calling thread, after its transaction commits (at once outside one). Counts whose write does not
        happen (a rolled-back transaction) stay pending for the next."""
        now = time.monotonic()
        if now - self.flushed_at >= settings.CONCH_GATEWAY_USAGE_FLUSH_SECONDS:
            self.flushed_at = now
            transaction.on_commit(self.serving.usage.flush_blocking)

    def close(self) -> None:
        """Write the pending usage, close the relay's connections and the limiter, and stop the loop."""
        if not self._thread.is_alive():
            return
        self.serving.usage.flush_blocking()
        self.run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _stop(self) -> None:
        await self.serving.limiter.close()
        await self.relay.close()


_edge: InferenceEdge | None = None
_edge_lock = threading.Lock()


def inference_edge() -> InferenceEdge:
    """The process's `InferenceEdge`, started on first use (again in a forked child: threads do not survive a
    fork)."""
    global _edge
    with _edge_lock:
        if _edge is None or _edge.pid != os.getpid():
            _edge = InferenceEdge()
            atexit.register(_edge.close)
        return _edge


def infer(
    *,
    user: User,
    deployment: Deployment,
    body: bytes,
    header_length: int | None = None,
    token: TokenGrant | None = None,
) -> InferenceResponse:
    """Forward a KServe v2 / Open Inference Protocol request body to a ready Triton of the deployment, unchanged.

    `body`: JSON, or (`header_length` set, Triton's `Inference-Header-Content-Length`) a JSON header followed by
    binary tensor data. Returns Triton's response as Triton wrote it (`InferenceResponse`). As through the
    gateway: a token's request counts against its requests per minute (RateLimited, 429, with
    `retry_after_seconds`), the body is checked before it is sent (InvalidInput naming the field), each request goes to
    the next ready Triton in turn (Kubernetes pods), one that cannot be reached (nothing was sent) is left out for
    the next, up to `MAX_SERVERS_TRIED`, and the token's usage (requests, inferences, errors, bytes) is counted.
    Raises Forbidden (developer role; with a token, the `infer` scope and, for a token limited to named
    deployments, the deployment's name), Conflict when the deployment is not ready (field `replicas` when it is
    scaled to 0), InvalidInput (Triton's own message and tensor when Triton rejects the request; the model's
    inputs are listed when the names were wrong), Unavailable when no Triton is ready or answers.
    """
    require_deployment_access(
        user=user, deployment=deployment, action="Sending an inference request", token=token, scope=Scope.INFER
    )
    edge = inference_edge()
    route = deployment_route(deployment=deployment, token=token)
    try:
        return edge.run(_infer(edge, route, deployment, body, header_length, metered=token is not None))
    except InvalidInput as error:
        raise _with_model_inputs(error, deployment) from None
    except TooManyRequests as refused:
        raise RateLimited(refused.detail, retry_after_seconds=refused.retry_after_s) from None
    finally:
        if token is not None:
            edge.flush_usage_when_due()


async def _infer(
    edge: InferenceEdge,
    route: Route,
    deployment: Deployment,
    body: bytes,
    header_length: int | None,
    *,
    metered: bool,
) -> InferenceResponse:
    """The request on the edge's loop: admit, check, pick a server, relay, count (as the gateway's HTTP edge)."""
    serving = edge.serving
    counts = UsageCounts(requests=1)
    failed = True
    try:
        if metered:
            serving.limiter.admit(route)
        if deployment.status not in (DeploymentStatus.READY, DeploymentStatus.DEGRADED):
            raise Conflict(f"Deployment {deployment.pk} is '{deployment.status}', not ready.", field=None)
        summary = check_inference_header(body, header_length, len(body))
        counts.inferences = summary.batch if route.batching and summary.batch is not None else 1
        require_servers(route)
        answer = await _send(edge, route, deployment, body, header_length, summary.names)
        counts.bytes_in, counts.bytes_out = len(body), len(answer.body)
        failed = False
        return answer
    finally:
        if metered:
            if failed:
                counts.errors, counts.inferences = 1, 0  # refused or failed: nothing was inferred
            serving.usage.count(route, counts)


async def _send(
    edge: InferenceEdge,
    route: Route,
    deployment: Deployment,
    body: bytes,
    header_length: int | None,
    names: list[str],
) -> InferenceResponse:
    """Send the body to the server whose turn it is; one that cannot be reached is left out for the next."""
    runtime = get_runtime(deployment.runtime)
    tried = 0
    while True:
        url, _key = edge.serving.picker.next_http(route)
        try:
            return await infer_body(
                edge.relay, url, route.model_name, body, header_length=header_length, sent_inputs=names
            )
        except TritonUnreachable as exc:
            # Nothing reached that server (a pod that just went away): the next one in turn may answer.
            runtime.forget_server(deployment.runtime_state, url)
            edge.serving.routes.forget(route)
            tried += 1
            if tried >= min(MAX_SERVERS_TRIED, len(route.servers)):
                log.warning(
                    "inference.relay.unreachable", extra={"deployment_id": route.deployment_id, "error": str(exc)}
                )
                raise Unavailable(
                    f"Deployment '{route.deployment_name}' cannot be reached right now (its Triton may be "
                    "restarting); retry in a few seconds."
                ) from None
        except TritonUnavailable as exc:
            # Triton's own address stays in the log: it is internal.
            log.warning("inference.relay.failed", extra={"deployment_id": route.deployment_id, "error": str(exc)})
            raise Unavailable(
                f"Deployment '{route.deployment_name}' failed while answering (its Triton stopped or timed out); "
                "retry in a few seconds."
            ) from None


#: Words of Triton's refusals of a request whose input names do not match the model's: an unknown input, a
#: missing one, or a count that differs (core's "expected 2 inputs but got 3 inputs").
_INPUT_NAME_PROBLEMS = ("unexpected inference input", "missing required input", "inputs but got")


def _with_model_inputs(error: InvalidInput, deployment: Deployment) -> InvalidInput:
    """`error` with the model's inputs appended ("The model's inputs: x FP32 [-1, 4]; shift FP32 [-1, 1]", -1
    marking a variable axis) when Triton refused the request's input names, so the caller reads what to send
    instead; any other error unchanged."""
    if not any(words in error.detail for words in _INPUT_NAME_PROBLEMS):
        return error
    inputs = (deployment.model_version.signature or {}).get("inputs") or []
    if not inputs:
        return error
    listed = "; ".join(f"{spec['name']} {spec['datatype']} {list(spec['dims'])}" for spec in inputs)
    error.detail = f"{error.detail.rstrip('.')}. The model's inputs: {listed}."
    return error

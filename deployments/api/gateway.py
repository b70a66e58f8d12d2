"""The inference gateway's HTTP edge: an ASGI application serving `/serve/<team>/<deployment>/v2/...`.

It runs in its own process (`python -m conch.gateway`, uvicorn), apart from the console's web server, so that
a request costs little more than the relay itself: the body streams from the client to a pooled keep-alive
connection to Triton (`tritonserving.relay`) and the answer streams back, while the rules live in
`deployments.services.gateway` and the state every inference edge shares (route cache, rate limiter, usage
meter, server pick) in `deployments.services.serving`. Per request and in the steady state it does no database
query: the (token, deployment) route is resolved once and kept for `CONCH_GATEWAY_ROUTE_CACHE_SECONDS`; the
per-token rate limit is counted in memory and synced with Redis; usage is counted in memory and written every
`CONCH_GATEWAY_USAGE_FLUSH_SECONDS`.

Authentication is a Conch API token only (`Authorization: Bearer conch_…`), as applications send it. Every
error is written as `{"error": "…"}`, the form Triton's and KServe's clients read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from conch.errors import ConchError, InvalidInput, PayloadTooLarge, Unavailable, UnsupportedMediaType
from deployments.api.grpc_gateway import GrpcGateway
from deployments.services import gateway as rules
from deployments.services.gateway import Plan, Route, UsageCounts
from deployments.services.serving import MAX_SERVERS_TRIED, Serving, TooManyRequests
from tritonserving.access import API_KEY_HEADER
from tritonserving.client import (
    HEADER_LENGTH,
    TritonUnavailable,
    TritonUnreachable,
    check_inference_header,
    explained_error_body,
)
from tritonserving.relay import TritonRelay
from tritonserving.shared_memory import Placement, SharedMemoryInputs

log = logging.getLogger(__name__)

__all__ = ["GatewayApp"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_PATH = re.compile(r"/serve/(?P<team>[-a-z0-9]+)/(?P<deployment>[-a-z0-9]+)(?:/(?P<path>.*))?")


class _ClientFault(ConchError):
    """The client stopped sending its body: went away (400) or went quiet for CONCH_GATEWAY_CLIENT_IDLE_SECONDS
    (408). Not Triton's fault: its route stays, and the log says it was the client."""

    status_code = 400


class _ClientTimedOut(_ClientFault):
    status_code = 408


class GatewayApp:
    """The ASGI application (HTTP and lifespan). One per process; state is built at lifespan start-up (or on the
    first request when the server sends no lifespan events) inside the server's event loop. `serving`: the
    process's shared routes, rate limiter, usage meter and server pick (`deployments.services.serving`), given
    when another edge shares it; a new one otherwise. `grpc_bind`: where to serve the gRPC edge
    (`deployments.api.grpc_gateway`, `host:port`) on the same event loop with the same `serving`; "" for none.
    `grpc_reuse_port`: bind it with SO_REUSEPORT, for several gateway processes on one port (never by default: a
    second installation's gateway on the same port would silently take half of the calls)."""

    def __init__(self, serving: Serving | None = None, *, grpc_bind: str = "", grpc_reuse_port: bool = False) -> None:
        self.serving = serving if serving is not None else Serving()
        self.grpc_bind = grpc_bind
        self.grpc_reuse_port = grpc_reuse_port
        self.grpc: GrpcGateway | None = None
        self._relay: TritonRelay | None = None
        self._shared_memory: SharedMemoryInputs | None = None

    # --- ASGI ---------------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if self._relay is None:
                await self._start()
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        if self._relay is not None:
            return
        self._relay = TritonRelay(
            max_connections=settings.CONCH_GATEWAY_MAX_CONNECTIONS, timeout_s=rules.RELAY_TIMEOUT_S
        )
        self._shared_memory = (
            SharedMemoryInputs(self._relay, settings.CONCH_GATEWAY_SHARED_MEMORY_BYTES)
            if settings.CONCH_GATEWAY_SHARED_MEMORY_BYTES > 0
            else None
        )
        await self.serving.start()
        if self.grpc_bind:
            self.grpc = GrpcGateway(self.serving, reuse_port=self.grpc_reuse_port, shared_memory=self._shared_memory)
            await self.grpc.start(self.grpc_bind)

    async def _stop(self) -> None:
        if self._relay is None:
            return
        if self.grpc is not None:
            await self.grpc.stop()
            self.grpc = None
        await self.serving.stop()
        if self._shared_memory is not None:
            await self._shared_memory.close()
            self._shared_memory = None
        await self._relay.close()
        self._relay = None
        await sync_to_async(connections.close_all)()

    # --- one request --------------------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if scope["path"] == "/healthz":
            await _answer(send, 200, b'{"status":"ok"}', head=method == "HEAD")
            return
        match = _PATH.fullmatch(scope["path"])
        if match is None:
            await _answer_error(send, NotFoundAtAll())
            return
        headers = _headers(scope)
        route: Route | None = None
        counts = UsageCounts(requests=1)
        status = 500
        try:
            route = await self.serving.route(headers.get("authorization", ""), match["team"], match["deployment"])
            self.serving.limiter.admit(route)
            plan = rules.plan_request(route, method, match["path"] or "")
            if plan.kind:
                status = await self._forward(route, plan, method, headers, receive, send, counts)
            else:
                status = plan.status
                await _answer(send, plan.status, plan.body, head=method == "HEAD")
        except ConchError as exc:
            status = exc.status_code
            await _answer_error(send, exc)
        finally:
            if route is not None:
                counts.errors = int(status >= 400)
                if status >= 400:
                    counts.inferences = 0  # refused or failed: nothing was inferred
                self.serving.usage.count(route, counts)

    async def _forward(
        self, route: Route, plan: Plan, method: str, headers: dict[str, str], receive: Receive, send: Send, counts
    ) -> int:
        """Pass the request to a Triton of `route` and stream its answer back; return the status sent."""
        body = await _RequestBody.read_start(receive, headers, infer=plan.kind == "infer", route=route)
        counts.inferences = body.inferences if plan.kind == "infer" else 0
        # The restricted-endpoint key is Conch's to send, never the client's.
        sent_headers = {name: value for name, value in headers.items() if name != API_KEY_HEADER.lower()}
        tried = 0
        placement: Placement | None = None
        shared_memory = self._shared_memory if body.binary_request is not None else None
        while True:
            url, key = self.serving.picker.next_http(route)
            if plan.restricted:
                sent_headers[API_KEY_HEADER] = key
            payload, length, headers_out = body.payload(), body.length or None, sent_headers
            if shared_memory is not None:
                # A Triton on this host reads the tensors from shared memory: only the JSON header is sent.
                placement = await shared_memory.place(
                    url, key, body.binary_request, body.binary_sizes, body.header_length, body.pieces
                )
                if placement is not None:
                    payload, length = placement.body, len(placement.body)
                    headers_out = {
                        name: value
                        for name, value in sent_headers.items()
                        if name not in ("inference-header-content-length", "content-type")
                    }
                    headers_out["content-type"] = "application/json"
            try:
                answer = await self._relay.send(
                    "GET" if method == "HEAD" else method,  # Triton answers HEAD with 405; the body is dropped below
                    url + plan.triton_path,
                    headers=headers_out,
                    body=payload,
                    content_length=length,
                )
                if placement is not None and answer.status >= 400:
                    answer = await _Buffered.of(answer)
                    if shared_memory.names_region(placement, answer.body):
                        # Lost with a restart, or an error that only shared memory causes: send the body as it is.
                        placement.release()
                        placement, shared_memory = None, None
                        continue
                break
            except TritonUnreachable as exc:
                # Nothing reached that server (a pod that just went away): forget the route, try another one.
                if placement is not None:
                    placement.release()
                    placement = None
                    shared_memory.forget(url)
                tried += 1
                self.serving.routes.forget(route)
                if tried >= min(MAX_SERVERS_TRIED, len(route.servers)) or body.started:
                    log.warning(
                        "gateway.relay.unreachable", extra={"deployment_id": route.deployment_id, "error": str(exc)}
                    )
                    raise Unavailable(
                        f"Deployment '{route.deployment_name}' cannot be reached right now (its Triton may be "
                        "restarting); retry in a few seconds."
                    ) from None
            except TritonUnavailable as exc:
                if placement is not None:
                    placement.release()
                if body.fault is not None:  # the client stopped sending: Triton is not to blame
                    log.info(
                        "gateway.client.stopped", extra={"deployment_id": route.deployment_id, "why": body.fault.detail}
                    )
                    raise body.fault from None
                # Triton's own address stays in the log: it is internal.
                log.warning("gateway.relay.failed", extra={"deployment_id": route.deployment_id, "error": str(exc)})
                self.serving.routes.forget(route)
                raise Unavailable(
                    f"Deployment '{route.deployment_name}' failed while answering (its Triton stopped or timed out); "
                    "retry in a few seconds."
                ) from None
        counts.bytes_in = body.length
        try:
            return await self._answer_back(route, plan, method, answer, send, counts)
        finally:
            answer.close()  # after a complete answer, the connection goes back to the pool; else it is dropped
            if placement is not None:
                placement.release()

    @staticmethod
    async def _answer_back(route: Route, plan: Plan, method: str, answer, send: Send, counts: UsageCounts) -> int:
        if plan.kind == "server":
            payload = _renamed_server_metadata(await answer.read(), route.deployment_name)
            answer.headers["content-length"] = str(len(payload))
            await _start_answer(send, answer.status, answer.headers)
            counts.bytes_out = len(payload)
            await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})
            return answer.status
        if answer.status == 400 and method != "HEAD":
            # A refused request: Triton's words, with advice meant for a configuration's author worded for the caller
            payload = explained_error_body(await answer.read())
            answer.headers.pop("transfer-encoding", None)
            answer.headers["content-length"] = str(len(payload))
            await _start_answer(send, answer.status, answer.headers)
            counts.bytes_out = len(payload)
            await send({"type": "http.response.body", "body": payload})
            return answer.status
        await _start_answer(send, answer.status, answer.headers)
        if method == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return answer.status
        try:
            async for chunk in answer.chunks():
                counts.bytes_out += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except TritonUnavailable as exc:
            log.warning("gateway.relay.broken", extra={"deployment_id": route.deployment_id, "error": str(exc)})
        await send({"type": "http.response.body", "body": b""})
        return answer.status


class NotFoundAtAll(ConchError):
    """A path outside `/serve/<team>/<deployment>/`."""

    status_code = 404

    def __init__(self) -> None:
        super().__init__("Not found: deployments are served at /serve/<team>/<deployment>/v2/...")


class _RequestBody:
    """The client's request body: read as far as it must be to check it, then streamed to Triton.

    An inference request with binary tensor data is checked on its JSON header alone (the rest streams); a JSON
    one is read whole and checked; a compressed one streams unchecked (Triton decompresses it). `length` is the
    body's size in bytes (Content-Length); `inferences` what the request counts as (its batch for a batching
    model, else 1).
    """

    def __init__(self, receive: Receive, start: list[bytes], length: int, more: bool, inferences: int) -> None:
        self._receive = receive
        self._start = start  # the pieces read so far, as the client's server handed them over (not joined)
        self._more = more
        self.length = length
        self.inferences = inferences
        self.started = False
        self.fault: _ClientFault | None = None
        # Set for a whole, uncompressed body with binary tensor data: its parsed JSON header (`request`), the
        # `binary_data_size` of each binary input (bytes) and the header's length in bytes.
        self.binary_request: dict | None = None
        self.binary_sizes: tuple[int, ...] = ()
        self.header_length = 0

    @classmethod
    async def read_start(cls, receive: Receive, headers: dict[str, str], *, infer: bool, route: Route):
        declared = headers.get("content-length")
        if declared is not None and not declared.strip().isdigit():
            raise InvalidInput(f"Content-Length must be a number of bytes, got {declared!r}.", field="Content-Length")
        limit = settings.CONCH_GATEWAY_MAX_BODY_BYTES
        if declared is not None and int(declared) > limit:
            raise PayloadTooLarge(
                f"The request body has {int(declared)} bytes; the gateway accepts at most {limit} bytes "
                "(CONCH_GATEWAY_MAX_BODY_BYTES).",
                field="body",
            )
        header_length = rules.parse_header_length(headers.get(HEADER_LENGTH.lower())) if infer else None
        encoding = headers.get("content-encoding", "identity").strip().lower() or "identity"
        if encoding not in ("identity", "gzip", "deflate"):
            raise UnsupportedMediaType(
                f"Content-Encoding {encoding!r} is not one the gateway takes; send the body as is, gzip or deflate.",
                field="Content-Encoding",
            )
        if declared is None or not infer or encoding != "identity":
            # No length (chunked), nothing to check, or compressed: read all of it, within the limit.
            pieces, _ = await _read(receive, limit, until=None)
            start = b"".join(pieces)
            body = cls(receive, [start], len(start), False, 1)
            if infer:
                # Checked as Triton will read it: decompressed (within the same limit) and parsed, off the loop
                # when large, so one big request does not hold up the others.
                summary = await _off_loop(_check_whole, start, encoding, header_length, limit)
                body.inferences = _inferences(summary, route)
            return body
        length = int(declared)
        # A body up to CONCH_GATEWAY_STREAM_FROM_BYTES is read whole before a connection to Triton is taken, so a
        # client that stalls holds no Triton connection; a larger one streams once its JSON header is checked.
        if length <= settings.CONCH_GATEWAY_STREAM_FROM_BYTES or header_length is None:
            want = length
        else:
            want = min(header_length, length)
        pieces, more = await _read(receive, limit, until=want)
        # Only the JSON header is parsed (the binary tensor data after it is not looked at): its size, not the
        # body's, decides whether the check is worth a thread, and only the pieces that hold it are joined.
        checked = _leading(pieces, length if header_length is None else header_length)
        if header_length is not None and header_length < OFF_LOOP_BYTES:
            summary = check_inference_header(checked, header_length, length)
        else:
            summary = await _off_loop(check_inference_header, checked, header_length, length)
        body = cls(receive, pieces, length, more, _inferences(summary, route))
        if header_length and header_length < OFF_LOOP_BYTES and summary.binary_sizes and not more:
            # A small JSON header (it is written again, on the loop, for shared memory: `SharedMemoryInputs`).
            body.binary_request, body.binary_sizes = summary.request, summary.binary_sizes
            body.header_length = header_length
        return body

    @property
    def pieces(self) -> list[bytes]:
        """The pieces read so far (the whole body when `binary_header` is set)."""
        return self._start

    def payload(self) -> list[bytes] | AsyncIterator[bytes] | None:
        """What to send to Triton: the pieces when the whole body is read already (sent in one write), else
        `stream()`; None for an empty body."""
        if not self.length:
            return None
        if not self._more:  # can be sent again to another server: `started` stays False
            return self._start
        return self.stream()

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's bytes: what was read already, then the rest as the client sends it."""
        self.started = True
        for piece in self._start:
            yield piece
        more = self._more
        while more:
            try:
                message = await _next_message(self._receive)
            except _ClientFault as fault:
                self.fault = fault
                raise TritonUnavailable(fault.detail) from None
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if chunk:
                yield chunk


class _Buffered:
    """A Triton answer read whole (a small error answer the gateway looks into), with `RelayedAnswer`'s shape:
    `status`, `headers`, `chunks()`, `read()`, `close()`; `body` holds its bytes."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @classmethod
    async def of(cls, answer) -> _Buffered:
        """Read `answer` (a RelayedAnswer) to its end; its connection goes back to the pool."""
        try:
            return cls(answer.status, answer.headers, await answer.read())
        finally:
            answer.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    async def read(self) -> bytes:
        return self.body

    def close(self) -> None:
        pass


#: Bodies from this many bytes are decompressed and parsed on a worker thread rather than on the event loop.
OFF_LOOP_BYTES = 256 * 1024


async def _off_loop(function: Callable[..., Any], data: bytes, *args: Any) -> Any:
    """`function(data, *args)`, on a thread when `data` is large (the loop keeps serving other requests)."""
    if len(data) < OFF_LOOP_BYTES:
        return function(data, *args)
    return await asyncio.to_thread(function, data, *args)


def _check_whole(body: bytes, encoding: str, header_length: int | None, limit: int):
    """Decompress `body` (gzip or deflate) as Triton will, at most `limit` bytes, and check the request in it.
    Raises PayloadTooLarge (field `body`) past the limit, InvalidInput (field `Content-Encoding`) for data that
    is not in that encoding, and what `check_inference_header` raises."""
    plain = body
    if encoding != "identity":
        inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # 32: a gzip or zlib header, whichever it is
        try:
            plain = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise InvalidInput(
                f"The body is not {encoding} data ({exc}); send it compressed as Content-Encoding says, or drop that "
                "header.",
                field="Content-Encoding",
            ) from None
        if len(plain) > limit or inflater.unconsumed_tail:
            raise PayloadTooLarge(
                f"The request body decompresses to more than the {limit} bytes the gateway accepts "
                "(CONCH_GATEWAY_MAX_BODY_BYTES).",
                field="body",
            )
    return check_inference_header(plain, header_length, len(plain))


async def _next_message(receive: Receive) -> dict[str, Any]:
    """The client's next piece of body. Raises _ClientTimedOut when none comes for CONCH_GATEWAY_CLIENT_IDLE_SECONDS,
    _ClientFault when the client went away."""
    idle = settings.CONCH_GATEWAY_CLIENT_IDLE_SECONDS
    try:
        # asyncio.timeout, not wait_for: no task is made per piece of body on this hot path.
        async with asyncio.timeout(idle):
            message = await receive()
    except TimeoutError:
        raise _ClientTimedOut(
            f"The request body stopped arriving for {idle:g} s (CONCH_GATEWAY_CLIENT_IDLE_SECONDS); send it whole."
        ) from None
    if message["type"] == "http.disconnect":
        raise _ClientFault("The client closed the connection before sending its whole request.", field="body")
    return message


def _leading(pieces: list[bytes], size: int) -> bytes:
    """The body's first `size` bytes or more, joining only the pieces that hold them."""
    if pieces and len(pieces[0]) >= size:
        return pieces[0]
    taken, held = [], 0
    for piece in pieces:
        taken.append(piece)
        held += len(piece)
        if held >= size:
            break
    return b"".join(taken)


async def _read(receive: Receive, limit: int, *, until: int | None) -> tuple[list[bytes], bool]:
    """Read the body until at least `until` bytes (None: all of it); return its pieces (not joined: the body
    goes to Triton as they are) and whether more follows."""
    parts: list[bytes] = []
    size = 0
    more = True
    while more and (until is None or size < until):
        message = await _next_message(receive)
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"The request body is over the {limit} bytes the gateway accepts (CONCH_GATEWAY_MAX_BODY_BYTES).",
                field="body",
            )
        if chunk:
            parts.append(chunk)
    return parts, more


def _inferences(summary, route: Route) -> int:
    if route.batching and summary.batch is not None:
        return max(int(summary.batch), 0)
    return 1


#: Triton protocol extensions a client can use through the gateway (Triton docs, "Protocol extensions"); the
#: server metadata lists only these.
SERVED_EXTENSIONS = frozenset(
    {"classification", "sequence", "model_configuration", "binary_tensor_data", "parameters", "schedule_policy"}
)


def _renamed_server_metadata(payload: bytes, name: str) -> bytes:
    """Triton's server metadata with the deployment's name as the server's (Triton's own id is internal) and
    only the extensions the gateway serves (SERVED_EXTENSIONS)."""
    try:
        metadata = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(metadata, dict) and "name" in metadata:
        metadata["name"] = name
        if isinstance(metadata.get("extensions"), list):
            # Only what a client can use through the gateway: no repository, shared-memory, statistics, trace
            # or logging API is served here.
            metadata["extensions"] = [item for item in metadata["extensions"] if item in SERVED_EXTENSIONS]
        return json.dumps(metadata, separators=(",", ":")).encode()
    return payload


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


async def _start_answer(send: Send, status: int, headers: dict[str, str]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()],
        }
    )


async def _answer(send: Send, status: int, body: bytes, *, head: bool = False, extra: dict | None = None) -> None:
    headers = {"content-type": "application/json", "content-length": str(len(body)), **(extra or {})}
    await _start_answer(send, status, headers)
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _answer_error(send: Send, exc: ConchError) -> None:
    extra: dict[str, str] = {}
    if exc.status_code == 401:
        extra["www-authenticate"] = 'Bearer realm="conch"'
    if isinstance(exc, TooManyRequests):
        extra["retry-after"] = str(exc.retry_after_s)
    await _answer(send, exc.status_code, json.dumps({"error": exc.detail}).encode(), extra=extra)

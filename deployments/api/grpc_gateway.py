"""The inference gateway's gRPC edge: KServe v2's `inference.GRPCInferenceService`, behind Conch's tokens.

NVIDIA's `tritonclient.grpc` (or any KServe v2 gRPC client) talks to it unchanged, sending two metadata entries
with every call (gRPC metadata keys are lower case):
- `authorization: Bearer conch_…`: a Conch API token with the `infer` scope;
- `conch-deployment: <team>/<deployment>`: which deployment the call is for (`DEPLOYMENT_KEY`).

What it answers (KServe "Open Inference Protocol", gRPC; Triton docs "HTTP/REST and GRPC Protocol"):
- `ServerLive`, `ServerReady`: by Conch (ready: the deployment has a ready Triton);
- `ServerMetadata`: Triton's, with the deployment's name as the server's and only the extensions served here;
- `ModelMetadata`, `ModelReady`, `ModelConfig` (read only), `ModelStatistics` (of the deployment's model),
  `ModelInfer`, and `ModelStreamInfer` (bidirectional streaming): passed to a ready Triton of the deployment over
  its gRPC port as serialized bytes (`tritonserving.grpc_relay`), the server taken in turn;
- anything else (the model repository, shared memory, trace and log settings): UNIMPLEMENTED, saying so.

The same rules as the HTTP edge, from the same `deployments.services.serving.Serving` of the process: routes
(a token of another team, or one limited to other deployments, gets NOT_FOUND: no existence leak; a missing
scope or role PERMISSION_DENIED), the per-token rate limit (RESOURCE_EXHAUSTED), the usage meter (requests,
inferences, errors, bytes of messages) and the server pick. A request for another model than the deployment's is
NOT_FOUND. Messages are limited to CONCH_GATEWAY_MAX_BODY_BYTES each way.

It runs in the gateway's process, on the same event loop as the HTTP edge (`conch.gateway`), bound to
CONCH_GATEWAY_GRPC_BIND.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn

import grpc
import grpc.aio
from django.conf import settings

from conch.errors import ConchError, Conflict, InvalidInput, NotFound, Unavailable
from deployments.services import gateway as rules
from deployments.services.gateway import Route, UsageCounts
from deployments.services.serving import MAX_SERVERS_TRIED, Serving, bearer_token
from tritonserving.client import TritonUnreachable
from tritonserving.grpc_relay import (
    SERVICE,
    GrpcRelay,
    TritonGrpcError,
    explained_stream_answer,
    live_answer,
    model_named,
    ready_answer,
    renamed_server_metadata,
    shared_memory_infer_request,
    split_raw_input_contents,
    stream_answer_failed,
    stream_error_answer,
    stream_failure,
    summarize_infer_request,
)
from tritonserving.shared_memory import Placement, SharedMemoryInputs

log = logging.getLogger(__name__)

__all__ = ["DEPLOYMENT_KEY", "GrpcGateway"]

#: The metadata key naming the deployment a call is for: `<team>/<deployment>`.
DEPLOYMENT_KEY = rules.GRPC_DEPLOYMENT_KEY
_DEPLOYMENT = re.compile(r"(?P<team>[-a-z0-9]+)/(?P<deployment>[-a-z0-9]+)")

#: Triton protocol extensions a client can use through the gateway; the server metadata lists only these.
SERVED_EXTENSIONS = frozenset(
    {"classification", "sequence", "model_configuration", "binary_tensor_data", "parameters", "schedule_policy"}
)

#: The service's methods the gateway does not serve, with what they are about.
REFUSED_METHODS = {
    "RepositoryIndex": "the model repository",
    "RepositoryModelLoad": "the model repository",
    "RepositoryModelUnload": "the model repository",
    "SystemSharedMemoryStatus": "shared memory",
    "SystemSharedMemoryRegister": "shared memory",
    "SystemSharedMemoryUnregister": "shared memory",
    "CudaSharedMemoryStatus": "shared memory",
    "CudaSharedMemoryRegister": "shared memory",
    "CudaSharedMemoryUnregister": "shared memory",
    "TraceSetting": "tracing",
    "LogSettings": "logging",
}

#: Conch's error statuses (HTTP) as gRPC status codes.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}

#: Calls relayed to Triton with the model named in the request checked against the deployment's, and whether
#: they need the server's restricted-endpoint key.
_MODEL_CALLS = {"ModelMetadata": False, "ModelReady": False, "ModelConfig": True, "ModelStatistics": True}

_Unary = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


class GrpcGateway:
    """The gRPC server of the gateway. `serving`: the process's shared routes, rate limiter, usage meter and server
    pick. `start(bind)` binds and serves on the running event loop; `stop()` ends it. `reuse_port`: bind with
    SO_REUSEPORT (several gateway processes on one port).
    `shared_memory`: the HTTP edge's regions (one per same-host Triton, shared by both edges), through which
    `ModelInfer`'s raw input tensors reach a Triton on this host; None: every request goes over gRPC as sent."""

    def __init__(
        self, serving: Serving, *, reuse_port: bool = False, shared_memory: SharedMemoryInputs | None = None
    ) -> None:
        self.serving = serving
        self.reuse_port = reuse_port
        self.shared_memory = shared_memory
        self.port = 0
        self._relay: GrpcRelay | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self, bind: str) -> int:
        """Serve on `bind` (`host:port`; port 0 picks a free one) and return the port bound. Raises RuntimeError
        when the address cannot be bound."""
        limit = settings.CONCH_GATEWAY_MAX_BODY_BYTES
        self._relay = GrpcRelay(max_message_bytes=limit, timeout_s=rules.RELAY_TIMEOUT_S)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", int(self.reuse_port)),
            ]
        )
        handlers: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(self._unary_handler(name))
            for name in ("ServerLive", "ServerReady", "ServerMetadata", "ModelInfer", *_MODEL_CALLS)
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self._stream)
        for name, what in REFUSED_METHODS.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(_refusal(name, what))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        try:
            self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise RuntimeError(f"The gRPC gateway cannot bind {bind} (CONCH_GATEWAY_GRPC_BIND): {exc}") from None
        await server.start()
        self._server = server
        await self.serving.start()
        log.info("gateway.grpc.started", extra={"bind": bind, "port": self.port})
        return self.port

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop taking calls, give running ones `grace_s` seconds, close the channels to Triton."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await server.stop(grace_s)
        await self.serving.stop()
        if self._relay is not None:
            await self._relay.close()
            self._relay = None

    # --- unary calls --------------------------------------------------------------------------------------------

    def _unary_handler(self, method: str) -> _Unary:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self._unary(method, request, context)

        return handle

    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        route: Route | None = None
        counts = UsageCounts(requests=1, bytes_in=len(request))
        failed = True
        try:
            route = await self._route(context)
            self.serving.limiter.admit(route)
            answer = await self._answer(method, route, request, context, counts)
            counts.bytes_out = len(answer)
            failed = False
            return answer
        except TritonGrpcError as exc:  # Triton's own answer: its status and words
            await context.abort(exc.code, exc.detail)
        except ConchError as exc:
            await _abort(context, exc)
        finally:
            if route is not None:
                if failed:
                    counts.errors, counts.inferences = 1, 0  # refused or failed: nothing was inferred
                self.serving.usage.count(route, counts)

    async def _answer(
        self, method: str, route: Route, request: bytes, context: grpc.aio.ServicerContext, counts: UsageCounts
    ) -> bytes:
        if method == "ServerLive":
            return live_answer()
        if method == "ServerReady":
            return ready_answer(route.ready and bool(route.grpc_servers))
        _require_servers(route)
        if method == "ModelInfer":
            try:
                summary = summarize_infer_request(request)
            except ValueError as exc:
                raise InvalidInput(f"The request is not a ModelInferRequest: {exc}.", field="request") from None
            _require_model(route, summary.model_name)
            counts.inferences = _inferences(route, summary.batch)
            return await self._relayed(route, method, request, context, raw_inputs=self.shared_memory is not None)
        if method == "ServerMetadata":
            answer = await self._relayed(route, method, request, context)
            return renamed_server_metadata(answer, route.deployment_name, SERVED_EXTENSIONS)
        try:
            name, request = model_named(method, request, route.model_name)
        except ValueError as exc:
            raise InvalidInput(f"The request is not a {method}Request: {exc}.", field="request") from None
        _require_model(route, name)
        return await self._relayed(route, method, request, context, restricted=_MODEL_CALLS[method])

    async def _relayed(
        self,
        route: Route,
        method: str,
        request: bytes,
        context: grpc.aio.ServicerContext,
        *,
        restricted: bool = False,
        raw_inputs: bool = False,
    ) -> bytes:
        """Triton's answer to `method`, from the server whose turn it is; a server that cannot be reached is left
        out and the next one tried, up to MAX_SERVERS_TRIED. `raw_inputs` (ModelInfer, with shared memory on):
        the request's `raw_input_contents` are handed to a Triton on this host in its shared-memory region, and
        only the rest of the message goes over gRPC."""
        assert self._relay is not None  # started
        split: tuple[bytes, list[memoryview]] | None = None
        if raw_inputs:
            split = split_raw_input_contents(request)  # checked well-formed by summarize_infer_request
        tried = 0
        while True:
            target, key, url = self.serving.picker.next_grpc(route)
            placement = await self._place(url, key, split) if split is not None else None
            try:
                return await self._relay.unary(
                    target,
                    method,
                    placement.body if placement is not None else request,
                    key=key if restricted else "",
                    timeout_s=context.time_remaining(),
                )
            except TritonGrpcError as exc:
                if placement is None or self.shared_memory is None:
                    raise
                if self.shared_memory.names_region(placement, exc.detail.encode()):
                    # Lost with a restart, or an error only shared memory causes: send the tensors as they came.
                    split = None
                    continue
                raise
            except TritonUnreachable as exc:
                if placement is not None and self.shared_memory is not None:
                    self.shared_memory.forget(url)
                tried += 1
                self.serving.routes.forget(route)
                if tried >= min(MAX_SERVERS_TRIED, len(route.grpc_servers)):
                    log.warning(
                        "gateway.grpc.unreachable", extra={"deployment_id": route.deployment_id, "error": str(exc)}
                    )
                    raise Unavailable(
                        f"Deployment '{route.deployment_name}' cannot be reached right now (its Triton may be "
                        "restarting); retry in a few seconds."
                    ) from None
            finally:
                if placement is not None:
                    placement.release()

    async def _place(self, url: str, key: str, split: tuple[bytes, list[memoryview]]) -> Placement | None:
        """The raw input tensors of a split ModelInferRequest written to the shared-memory region of the Triton at
        `url`, with the request that names them as the placement's body; None to send the request as it came
        (another host, no region or span, no raw tensors, or contents that do not pair with the inputs)."""
        rest, tensors = split
        if self.shared_memory is None or not tensors:
            return None
        placement = await self.shared_memory.place_tensors(url, key, tensors)
        if placement is None:
            return None
        body = shared_memory_infer_request(
            rest, [len(tensor) for tensor in tensors], placement.region.name, placement.offset
        )
        if body is None:
            placement.release()
            return None
        placement.body = body
        return placement

    # --- streaming ----------------------------------------------------------------------------------------------

    async def _stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """ModelStreamInfer: one stream to one Triton of the deployment. Each request of the stream is checked
        (rate limit, model) and counted as a request; one that is refused is answered in the stream with an
        `error_message`, as Triton answers a request it refuses, and the stream goes on."""
        assert self._relay is not None  # started
        try:
            route = await self._route(context)
            _require_servers(route)
        except ConchError as exc:
            await _abort(context, exc)
        target, _, _ = self.serving.picker.next_grpc(route)
        call = self._relay.stream(target)
        answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        failure: list[BaseException] = []

        async def pump() -> None:
            async for raw in requests:
                counts = UsageCounts(requests=1, bytes_in=len(raw))
                request_id = ""
                try:
                    self.serving.limiter.admit(route)
                    try:
                        summary = summarize_infer_request(raw)
                    except ValueError as exc:
                        raise InvalidInput(f"The request is not a ModelInferRequest: {exc}.", field="request") from None
                    request_id = summary.id
                    _require_model(route, summary.model_name)
                except ConchError as exc:
                    counts.errors = 1
                    answers.put_nowait(stream_error_answer(exc.detail, request_id=request_id, model_name=""))
                else:
                    counts.inferences = _inferences(route, summary.batch)
                    await call.write(raw)
                self.serving.usage.count(route, counts)
            await call.done_writing()

        async def read() -> None:
            try:
                async for raw in call:
                    answers.put_nowait(explained_stream_answer(raw))
            except grpc.aio.AioRpcError as exc:
                failure.append(exc)
            finally:
                answers.put_nowait(None)

        pumping = asyncio.create_task(pump())
        reading = asyncio.create_task(read())
        try:
            while (raw := await answers.get()) is not None:
                self.serving.usage.count(route, UsageCounts(bytes_out=len(raw), errors=int(stream_answer_failed(raw))))
                yield raw
            if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
                failure.append(pumping.exception())  # type: ignore[arg-type]
        finally:
            pumping.cancel()
            reading.cancel()
            call.cancel()
        if failure:
            error = failure[0]
            if isinstance(error, grpc.aio.AioRpcError):
                converted = stream_failure(error)
                log.warning(
                    "gateway.grpc.stream_failed", extra={"deployment_id": route.deployment_id, "error": str(converted)}
                )
                if isinstance(converted, TritonGrpcError):
                    await context.abort(converted.code, converted.detail)
                self.serving.routes.forget(route)
                await _abort(
                    context,
                    Unavailable(
                        f"Deployment '{route.deployment_name}' stopped answering the stream (its Triton may be "
                        "restarting); open a new stream in a few seconds."
                    ),
                )
            raise error

    # --- routes -------------------------------------------------------------------------------------------------

    async def _route(self, context: grpc.aio.ServicerContext) -> Route:
        authorization, named = "", ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                authorization = value if isinstance(value, str) else value.decode("latin-1")
            elif key == DEPLOYMENT_KEY:
                named = value if isinstance(value, str) else value.decode("latin-1")
        bearer_token(authorization)  # no token: UNAUTHENTICATED before anything else
        match = _DEPLOYMENT.fullmatch(named.strip())
        if match is None:
            raise InvalidInput(
                f"Name the deployment in the '{DEPLOYMENT_KEY}' metadata as '<team>/<deployment>'"
                + (f"; got {named!r}." if named else "."),
                field=DEPLOYMENT_KEY,
            )
        return await self.serving.route(authorization, match["team"], match["deployment"])


def _require_servers(route: Route) -> None:
    if route.grpc_servers:
        return
    if route.unavailable_status == 409:
        raise Conflict(route.unavailable, field="replicas")
    raise Unavailable(
        route.unavailable or f"Deployment '{route.deployment_name}' has no ready Triton with a gRPC port right now."
    )


def _require_model(route: Route, name: str) -> None:
    if name != route.model_name:
        raise NotFound(
            f"Model '{name}' is not served here; deployment '{route.deployment_name}' serves '{route.model_name}'."
        )


def _inferences(route: Route, batch: int | None) -> int:
    if route.batching and batch is not None:
        return max(batch, 0)
    return 1


async def _abort(context: grpc.aio.ServicerContext, exc: ConchError) -> NoReturn:
    await context.abort(_CODES.get(exc.status_code, grpc.StatusCode.UNKNOWN), exc.detail)
    raise AssertionError("abort returned")  # context.abort always raises


def _refusal(method: str, what: str) -> _Unary:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"The Conch gateway does not serve {method} ({what} is Conch's to manage); it serves health, metadata, "
            "model configuration and statistics, ModelInfer and ModelStreamInfer.",
        )
        raise AssertionError("abort returned")

    return refuse

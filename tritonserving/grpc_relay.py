"""Relay of KServe v2 gRPC calls to Triton over pooled channels, message bytes passed through as they are.

The inference gateway's gRPC edge (`deployments.api.grpc_gateway`) serves Triton's own service,
`inference.GRPCInferenceService` (KServe v2 "Open Inference Protocol", gRPC; Triton docs "HTTP/REST and GRPC
Protocol"), so NVIDIA's `tritonclient.grpc` works through it unchanged. To add little to each call, the edge and
this relay move the serialized messages as bytes (gRPC's identity (de)serializers): an inference request is
decoded only to read what the gateway checks (the model's name, the batch of the first input), never encoded
again, and Triton's answer goes back as Triton wrote it. One `grpc.aio` channel per Triton `host:port` is kept
open and shared by every call (HTTP/2 carries the concurrent calls side by side).

The messages' classes come from `tritonclient.grpc.service_pb2` (the generated code of Triton's
`grpc_service.proto`); the small helpers here decode and build the few messages the edge reads or answers itself.

Talks to: Triton's gRPC endpoint (`--grpc-port`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import grpc
import grpc.aio
from tritonclient.grpc import service_pb2

from tritonserving.access import GRPC_API_KEY_HEADER
from tritonserving.client import TritonUnavailable, TritonUnreachable, explained_message
from tritonserving.shared_memory import aligned

__all__ = [
    "SERVICE",
    "GrpcRelay",
    "InferSummary",
    "TritonGrpcError",
    "live_answer",
    "model_named",
    "ready_answer",
    "renamed_server_metadata",
    "shared_memory_infer_request",
    "split_raw_input_contents",
    "stream_answer_failed",
    "stream_error_answer",
    "stream_failure",
    "summarize_infer_request",
]

#: The gRPC service Triton (and KServe) serves: `inference.GRPCInferenceService`.
SERVICE = "inference.GRPCInferenceService"

#: Metadata of the calls the relay sends, as (key, value) pairs.
Metadata = tuple[tuple[str, str], ...]


class TritonGrpcError(TritonUnavailable):
    """Triton answered a call with an error status (a bad request, a model that failed, a deadline). `code` is the
    `grpc.StatusCode` and `detail` Triton's message: the edge passes both to its client unchanged."""

    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class InferSummary:
    """What the gateway reads of a `ModelInferRequest`: the model's `model_name`, the request's `id`, and `batch`,
    the first dimension of the first input's shape (None without an input or a shape)."""

    model_name: str
    id: str
    batch: int | None


def summarize_infer_request(raw: bytes) -> InferSummary:
    """Read what the gateway checks of the serialized `ModelInferRequest` `raw` without decoding all of it.

    The protobuf wire format is walked field by field (Protocol Buffers "Encoding"): `model_name` (field 1) and
    `id` (3) are read, the last occurrence winning as in a full decode; the first of `inputs` (5) is walked for its
    `shape` (3, packed or not); everything else, the tensors' bytes in `raw_input_contents` (7) among it, is
    skipped by its length without being copied: a full decode of a 600 KB request cost about 160 µs. Raises
    `ValueError` when `raw` is not a well-formed message."""
    model_name, request_id, batch = b"", b"", None
    seen_input = False
    for field, _, position, stop in _fields(raw):
        if field == 1:
            model_name = raw[position:stop]
        elif field == 3:
            request_id = raw[position:stop]
        elif field == 5 and not seen_input:
            seen_input = True
            batch = _first_dim(raw, position, stop)
    try:
        return InferSummary(model_name=model_name.decode(), id=request_id.decode(), batch=batch)
    except UnicodeDecodeError as exc:
        raise ValueError(f"a name is not UTF-8 ({exc})") from None


def split_raw_input_contents(raw: bytes) -> tuple[bytes, list[memoryview]]:
    """The serialized `ModelInferRequest` `raw` without its `raw_input_contents` (field 7), and those contents in
    order, as views of `raw` (nothing of the tensors' bytes is copied). The rest is a well-formed message of the
    same fields (protobuf fields may come in any order: Protocol Buffers "Encoding"). Raises `ValueError` when
    `raw` is not a well-formed message."""
    view = memoryview(raw)
    rest: list[memoryview] = []
    contents: list[memoryview] = []
    kept_from = 0
    for field, field_start, position, stop in _fields(raw):
        if field == 7:
            rest.append(view[kept_from:field_start])
            contents.append(view[position:stop])
            kept_from = stop
    rest.append(view[kept_from:])
    return b"".join(rest), contents


def shared_memory_infer_request(rest: bytes, sizes: Sequence[int], region: str, base: int) -> bytes | None:
    """A serialized `ModelInferRequest` asking for `rest` (a request without `raw_input_contents`, from
    `split_raw_input_contents`) with the inputs whose bytes were raw read from spans of the registered system
    shared-memory `region` instead: the i-th such input (one without `contents` and without a region of its own,
    in order) at `base` + the aligned sizes (`shared_memory.aligned`) of those before it, `sizes[i]` bytes long, as
    the `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size` parameters say (Triton docs,
    "Shared-Memory Extension"). None when the raw contents do not pair one to one with such inputs (the request is
    then sent as it is, for Triton to answer). Raises `ValueError` when `rest` is not a `ModelInferRequest`."""
    try:
        request = service_pb2.ModelInferRequest.FromString(rest)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ValueError(f"not a ModelInferRequest ({exc})") from None
    takers = [
        tensor
        for tensor in request.inputs
        if "shared_memory_region" not in tensor.parameters and not tensor.HasField("contents")
    ]
    if len(takers) != len(sizes):
        return None
    offset = base
    for tensor, size in zip(takers, sizes, strict=True):
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = size
        offset += aligned(size)
    return request.SerializeToString()


def _fields(raw: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Each top-level field of the serialized message `raw`, in order, as (field number, start of its key, start
    of its value, end): for a length-delimited field (wire type 2) the value is its bytes, for the others its
    encoding. Raises `ValueError` when a field runs past the end of `raw`."""
    position, end = 0, len(raw)
    while position < end:
        field_start = position
        key, position = _varint(raw, position)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, position = _varint(raw, position)
            stop = position + length
            if stop > end:
                raise ValueError("a field runs past the end of the message")
        else:
            stop = _skip(raw, position, wire)
        yield field, field_start, position, stop
        position = stop
    if position != end:
        raise ValueError("the last field runs past the end of the message")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at `position` of `data`, and the position after it."""
    value, shift = 0, 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("a varint runs past the end of the message")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _skip(data: bytes, position: int, wire: int) -> int:
    """The position after a field of wire type `wire` (not 2) whose value starts at `position`."""
    if wire == 0:
        return _varint(data, position)[1]
    if wire == 1:
        return position + 8
    if wire == 5:
        return position + 4
    raise ValueError(f"wire type {wire} is not one a ModelInferRequest holds")


def _first_dim(data: bytes, position: int, stop: int) -> int | None:
    """The first `shape` value (field 3, int64) of the `InferInputTensor` in `data[position:stop]`; None without."""
    while position < stop:
        key, position = _varint(data, position)
        field, wire = key >> 3, key & 7
        if field == 3 and wire in (0, 2):
            if wire == 2:  # packed: a length, then the values
                length, position = _varint(data, position)
                if length == 0:
                    continue
            value, _ = _varint(data, position)
            return value - (1 << 64) if value >= 1 << 63 else value  # int64: two's complement
        if wire == 2:
            length, position = _varint(data, position)
            position += length
        else:
            position = _skip(data, position, wire)
    return None


def model_named(method: str, raw: bytes, model_name: str) -> tuple[str, bytes]:
    """The model a `ModelMetadataRequest`, `ModelReadyRequest`, `ModelConfigRequest` or `ModelStatisticsRequest`
    (`method` names the call: "ModelMetadata" …) asks about, and the request to send Triton: `raw` unchanged, or,
    for statistics asked without a name (every model's: what `get_inference_statistics()` sends by default), one
    naming `model_name`. Raises `ValueError` when `raw` is not such a message."""
    kind = {
        "ModelMetadata": service_pb2.ModelMetadataRequest,
        "ModelReady": service_pb2.ModelReadyRequest,
        "ModelConfig": service_pb2.ModelConfigRequest,
        "ModelStatistics": service_pb2.ModelStatisticsRequest,
    }[method]
    try:
        request = kind.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ValueError(f"not a {kind.__name__} ({exc})") from None
    if method == "ModelStatistics" and not request.name:
        request.name = model_name
        return model_name, request.SerializeToString()
    return request.name, raw


def live_answer() -> bytes:
    """A serialized `ServerLiveResponse` saying live."""
    return service_pb2.ServerLiveResponse(live=True).SerializeToString()


def ready_answer(ready: bool) -> bytes:
    """A serialized `ServerReadyResponse` with `ready`."""
    return service_pb2.ServerReadyResponse(ready=ready).SerializeToString()


def renamed_server_metadata(raw: bytes, name: str, extensions: Iterable[str]) -> bytes:
    """Triton's serialized `ServerMetadataResponse` with `name` as the server's name (Triton's own id is internal)
    and only the protocol extensions in `extensions` (those a client can use through the gateway)."""
    metadata = service_pb2.ServerMetadataResponse.FromString(raw)
    kept = [item for item in metadata.extensions if item in set(extensions)]
    metadata.name = name
    del metadata.extensions[:]
    metadata.extensions.extend(kept)
    return metadata.SerializeToString()


def stream_error_answer(message: str, *, request_id: str, model_name: str) -> bytes:
    """A serialized `ModelStreamInferResponse` carrying `message` as its `error_message`, for one request of a
    stream, as Triton answers a request of a stream it refuses (the stream stays open)."""
    return service_pb2.ModelStreamInferResponse(
        error_message=message, infer_response=service_pb2.ModelInferResponse(id=request_id, model_name=model_name)
    ).SerializeToString()


def explained_stream_answer(raw: bytes) -> bytes:
    """The serialized `ModelStreamInferResponse` `raw`, with its `error_message` worded for the caller
    (`tritonserving.client.explained_message`) when it carries one; an answer without an error is returned as is
    (not decoded)."""
    if not stream_answer_failed(raw):
        return raw
    answer = service_pb2.ModelStreamInferResponse.FromString(raw)
    explained = explained_message(answer.error_message)
    if explained == answer.error_message:
        return raw
    answer.error_message = explained
    return answer.SerializeToString()


def stream_answer_failed(raw: bytes) -> bool:
    """Whether the serialized `ModelStreamInferResponse` `raw` carries an `error_message` (its field 1, which a
    serializer writes first: no decoding needed)."""
    return raw[:1] == b"\x0a"


_Unary: TypeAlias = grpc.aio.UnaryUnaryMultiCallable
_Stream: TypeAlias = grpc.aio.StreamStreamMultiCallable


class GrpcRelay:
    """Pooled channels to Tritons' gRPC endpoints, calling `SERVICE`'s methods with serialized messages.

    `max_message_bytes`: the largest message sent or received (gRPC's own default is 4 MiB). Every call has a
    deadline (`timeout_s`, or less when the caller gives one). Use it on one event loop; `close()` when done.
    """

    def __init__(self, *, max_message_bytes: int, timeout_s: float) -> None:
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # One TCP connection per Triton for this process's channel, kept alive across idle minutes.
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.enable_retries", 0),
        ]
        self._timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], _Unary] = {}
        self._streams: dict[str, _Stream] = {}
        self._closing: list[grpc.aio.Channel] = []  # dropped by `forget`, closed with the relay

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = grpc.aio.insecure_channel(target, options=self._options)
        return channel

    async def unary(
        self, target: str, method: str, request: bytes, *, key: str = "", timeout_s: float | None = None
    ) -> bytes:
        """Call `method` (e.g. "ModelInfer") of the Triton at `target` (`host:port`) with the serialized request
        and return its serialized answer. `key`: the server's restricted-endpoint key, sent for the calls that need
        it (ModelConfig, ModelStatistics). Raises `TritonUnreachable` (status UNAVAILABLE: the server cannot be
        reached; the caller may try another one) and `TritonGrpcError` with Triton's status otherwise."""
        callable_ = self._unary.get((target, method))
        if callable_ is None:
            callable_ = self._unary[(target, method)] = self._channel(target).unary_unary(f"/{SERVICE}/{method}")
        metadata: Metadata = ((GRPC_API_KEY_HEADER, key),) if key else ()
        timeout = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        try:
            return await callable_(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    def stream(self, target: str) -> grpc.aio.StreamStreamCall:
        """Open a `ModelStreamInfer` stream to the Triton at `target`: `write(bytes)` serialized
        `ModelInferRequest`s, `done_writing()`, and read serialized `ModelStreamInferResponse`s from it (`read()`,
        or `async for`). Reading raises `grpc.aio.AioRpcError`; `stream_failure(exc)` turns one into ours."""
        callable_ = self._streams.get(target)
        if callable_ is None:
            callable_ = self._streams[target] = self._channel(target).stream_stream(f"/{SERVICE}/ModelStreamInfer")
        return callable_()

    def forget(self, target: str) -> None:
        """Drop the channel to `target` (a server that went away); the next call opens a new one."""
        channel = self._channels.pop(target, None)
        self._streams.pop(target, None)
        for key in [key for key in self._unary if key[0] == target]:
            del self._unary[key]
        if channel is not None:
            # Closed with the relay: calls still on it end with their own status.
            self._closing.append(channel)

    async def close(self) -> None:
        """Close every channel (calls still running end with CANCELLED)."""
        channels = [*self._channels.values(), *self._closing]
        self._channels.clear()
        self._unary.clear()
        self._streams.clear()
        self._closing.clear()
        for channel in channels:
            await channel.close()


def stream_failure(exc: grpc.aio.AioRpcError) -> TritonUnavailable:
    """Our error for a failed stream call: `TritonUnreachable` or `TritonGrpcError`."""
    return _error(exc)


def _error(exc: grpc.aio.AioRpcError) -> TritonUnavailable:
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return TritonUnreachable(detail or "the server cannot be reached")
    return TritonGrpcError(code, explained_message(detail))

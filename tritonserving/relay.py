"""Asynchronous relay of KServe v2 requests to Triton over pooled keep-alive HTTP/1.1 connections.

The inference gateway (`deployments.api.gateway`) passes each client request to a Triton of the deployment and
streams Triton's answer back. Opening a TCP connection per request costs more than Conch's whole share of a
request's latency budget, so one `TritonRelay` per process keeps connections to every Triton it talks to open
and reuses them (HTTP/1.1 keep-alive; Triton's HTTP endpoint keeps a connection open until the client closes it).

Why not a general HTTP client: on the 2-core benchmark machine every CPU microsecond the gateway spends is taken
from Triton (bench/serving.py, system e). aiohttp's client, which this module used first, cost about 0.4 ms of
CPU per relayed 600 KB inference request (request and response objects, multidict headers, payload registry,
timers per request) out of a budget of about 0.45 ms for the whole gateway. The relay here speaks only what Triton's
HTTP endpoint needs: one request at a time per connection, Content-Length or no body, answers parsed by httptools
(the C parser uvicorn serves the gateway's own side with) including chunked ones, no redirects, no cookies, no
decompression.

This is the data path of every user's inference over HTTP: the gateway streams bodies through `TritonRelay.send`,
and the REST API's `/infer` (a synchronous Django view, through `deployments.services.inference`) sends a whole
body with `infer_body`. Control calls (health, load/unload, configuration, statistics, metrics, Conch's own smoke
inferences) use the synchronous `tritonserving.client.TritonClient` instead.

Talks to: Triton's HTTP/REST endpoint (KServe v2 protocol; Triton docs "HTTP/REST and GRPC Protocol").
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import httptools

from tritonserving.access import API_KEY_HEADER
from tritonserving.client import (
    HEADER_LENGTH,
    RELAYED_HEADERS,
    InferenceResponse,
    TritonUnavailable,
    TritonUnreachable,
    error_from_answer,
    input_names,
    names_no_missing_input,
)

__all__ = ["RelayedAnswer", "TritonRelay", "infer_body"]

#: The restricted-endpoint key's header, as request header names are compared (lower case).
_KEY_HEADER = API_KEY_HEADER.lower()
#: Headers of Triton's answer passed back besides RELAYED_HEADERS: the length lets the client keep its connection.
_ANSWER_HEADERS = RELAYED_HEADERS | {"content-length"}
#: Bytes of an answer held for a client that reads slowly before the connection to Triton stops being read.
ANSWER_BUFFER_BYTES = 1024 * 1024


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to a Triton, carrying one exchange at a time; the answer is parsed by httptools
    as it arrives and its body queued for `RelayedAnswer.chunks`."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answer: _Exchange | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._writable: asyncio.Future | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.answer.fail(TritonUnavailable(f"Triton's answer is not valid HTTP: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.answer is not None and not self.answer.complete:
            why = f": {exc}" if exc else ""
            self.answer.fail(TritonUnavailable(f"Triton closed the connection before its answer was complete{why}"))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools callbacks ------------------------------------------------------------------------------------
    # httptools calls these only from `data_received`'s feed_data, which runs with an exchange open on a connected
    # transport: the asserts state that for the type checker.

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        lowered = name.decode("latin-1").lower()
        if lowered in _ANSWER_HEADERS:
            self.answer.headers[lowered] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.answer is not None
        self.answer.started(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.answer is not None and self.transport is not None
        if self.answer.add(body) > ANSWER_BUFFER_BYTES:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer.finish(keep_alive=self._parser.should_keep_alive())

    # -- use ----------------------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until the transport takes more bytes (its buffer is under the high-water mark) or is closed."""
        if self._writable is not None:
            await self._writable

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


@dataclass(eq=False)
class _Exchange:
    """The answer to one request as it arrives: its status and headers, then body pieces."""

    connection: _Connection
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0
    complete: bool = False
    keep_alive: bool = False
    sent_all: bool = False
    error: TritonUnavailable | None = None
    queued: collections.deque = field(default_factory=collections.deque)
    queued_bytes: int = 0
    waiter: asyncio.Future | None = None

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def started(self, status: int) -> None:
        self.status = status
        self._wake()

    def add(self, body: bytes) -> int:
        self.queued.append(body)
        self.queued_bytes += len(body)
        self._wake()
        return self.queued_bytes

    def finish(self, *, keep_alive: bool) -> None:
        self.complete, self.keep_alive = True, keep_alive
        self._wake()

    def fail(self, error: TritonUnavailable) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def wait(self, deadline: float) -> None:
        """Wait for news (status, body, end or failure), at the latest until `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        handle = loop.call_at(deadline, self._wake)
        try:
            await self.waiter
        finally:
            handle.cancel()
            self.waiter = None
        if self.error is None and not self.complete and not self.queued and loop.time() >= deadline:
            self.error = TritonUnavailable("Triton timed out")


class RelayedAnswer:
    """Triton's answer: HTTP `status`, the `headers` that describe the body (lower-case names), and `chunks()`,
    an async iterator over the body's bytes (read from Triton as the client takes them). Reading to the end hands
    the connection back to the pool; `close()` before that drops the connection."""

    def __init__(self, relay: TritonRelay, exchange: _Exchange, deadline: float) -> None:
        self.status = exchange.status
        self.headers = dict(exchange.headers)
        self._relay = relay
        self._exchange = exchange
        self._deadline = deadline
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body in the pieces Triton sent. Raises TritonUnavailable when Triton stops or times out
        mid-way."""
        exchange = self._exchange
        try:
            while True:
                while exchange.queued:
                    chunk = exchange.queued.popleft()
                    exchange.queued_bytes -= len(chunk)
                    if exchange.queued_bytes <= ANSWER_BUFFER_BYTES // 2:
                        exchange.connection.resume_reading()
                    yield chunk
                if exchange.complete:
                    break
                if exchange.error is not None:
                    raise exchange.error
                await exchange.wait(self._deadline)
        finally:
            self._finish()

    async def read(self) -> bytes:
        """The whole body (for small answers Conch rewrites, e.g. server metadata)."""
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Give up on the rest of the body (the connection is closed unless the answer was complete)."""
        self._finish()

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._relay._release(self._exchange)


class TritonRelay:
    """A pool of keep-alive HTTP/1.1 connections to Tritons, for one event loop.

    `max_connections`: connections open at once per Triton (host:port); requests beyond wait for a free one.
    `timeout_s`: seconds a whole relayed request may take (connect + send + Triton's work + answer).
    `connect_timeout_s`: seconds to open a connection; past it the server counts as unreachable.
    Create it inside the running loop; `await close()` at shutdown.
    """

    def __init__(self, *, max_connections: int = 64, timeout_s: float = 60.0, connect_timeout_s: float = 3.0) -> None:
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._open: set[_Connection] = set()
        self._where: dict[str, tuple[tuple[str, int], str]] = {}

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | list[bytes] | AsyncIterator[bytes] | None = None,
        content_length: int | None = None,
    ) -> RelayedAnswer:
        """Send one request to `url` (a Triton's `http://host:port/v2/...`) and return its answer, body unread.

        `headers`: the client's; only RELAYED_HEADERS (Content-Type, Content-Encoding, Accept-Encoding,
        Inference-Header-Content-Length) and `X-Conch-Key` (the restricted-endpoint key) go on. `body`: bytes, a
        list of pieces (sent in one write, not joined), or an async iterator of chunks sent as they come, with
        `content_length` (bytes) sent as Content-Length so Triton reads a plain, not chunked, body. Raises
        TritonUnreachable when no connection opens (nothing was sent, so another server may be tried),
        TritonUnavailable when the exchange fails after that.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        key, netloc, target = self._split(url)
        head = [f"{method} {target} HTTP/1.1\r\nHost: {netloc}\r\n"]
        for name, value in (headers or {}).items():
            lowered = name.lower()
            if lowered in RELAYED_HEADERS or lowered == _KEY_HEADER:
                head.append(f"{name}: {value}\r\n")
        if content_length is not None:
            head.append(f"Content-Length: {content_length}\r\n")
        elif isinstance(body, bytes | bytearray | memoryview):
            head.append(f"Content-Length: {len(body)}\r\n")
        elif isinstance(body, list):
            head.append(f"Content-Length: {sum(len(piece) for piece in body)}\r\n")
        head.append("\r\n")
        request_head = "".join(head).encode("latin-1")

        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = asyncio.Semaphore(self._max_connections)
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            raise TritonUnavailable(f"Triton at {url} timed out: no free connection") from None
        replayable = not isinstance(body, AsyncIterator)
        try:
            while True:
                connection, reused = await self._connection(key, url, deadline)
                exchange = _Exchange(connection)
                connection.answer = exchange
                try:
                    await self._write(connection, request_head, body)
                    exchange.sent_all = not connection.closed
                    while not exchange.status and exchange.error is None:
                        await exchange.wait(deadline)
                except TritonUnavailable as exc:
                    exchange.error = exchange.error or exc
                if exchange.error is None:
                    return RelayedAnswer(self, exchange, deadline)
                connection.close()
                self._open.discard(connection)
                if reused and replayable and not exchange.status and loop.time() < deadline:
                    continue  # a pooled connection Triton had closed meanwhile: the request goes on a new one
                raise TritonUnavailable(f"Triton at {url} failed: {exchange.error}")
        except BaseException:
            slots.release()
            raise

    async def close(self) -> None:
        """Close every pooled connection."""
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    # -- internals ----------------------------------------------------------------------------------------------

    def _split(self, url: str) -> tuple[tuple[str, int], str, str]:
        """`url`'s (host, port), its host:port as written, and the path (with query) to request."""
        end = url.find("/", url.find("://") + 3)
        base, target = (url[:end], url[end:]) if end >= 0 else (url, "/")
        known = self._where.get(base)
        if known is None:
            parts = urlsplit(base)
            if parts.scheme != "http" or not parts.hostname:
                raise TritonUnreachable(f"Triton at {url} cannot be reached: only http:// servers are relayed to")
            known = ((parts.hostname, parts.port or 80), parts.netloc)
            if len(self._where) < 10_000:
                self._where[base] = known
        return known[0], known[1], target

    async def _connection(self, key: tuple[str, int], url: str, deadline: float) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                return connection, True
            self._open.discard(connection)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(self._connect_timeout_s, max(0.0, deadline - loop.time()))):
                _, connection = await loop.create_connection(lambda: _Connection(key), key[0], key[1])
        except (OSError, TimeoutError) as exc:
            raise TritonUnreachable(f"Triton at {url} cannot be reached: {exc or 'connect timed out'}") from None
        self._open.add(connection)
        return connection, False

    @staticmethod
    async def _write(connection: _Connection, head: bytes, body: bytes | list | AsyncIterator[bytes] | None) -> None:
        transport = connection.transport
        assert transport is not None  # create_connection returns the protocol once connection_made has run
        if body is None or isinstance(body, bytes | bytearray | memoryview):
            transport.writelines((head, body) if body else (head,))
            return
        if isinstance(body, list):
            transport.writelines((head, *body))
            return
        transport.write(head)
        async for chunk in body:
            if connection.closed:
                break  # Triton answered (an error) or went away: its answer, or the failure, says which
            transport.write(chunk)
            await connection.drain()

    def _release(self, exchange: _Exchange) -> None:
        connection = exchange.connection
        connection.answer = None
        reusable = exchange.complete and exchange.keep_alive and exchange.sent_all and exchange.error is None
        if reusable and not connection.closed:
            self._idle.setdefault(connection.key, []).append(connection)
        else:
            connection.close()
            self._open.discard(connection)
        self._slots[connection.key].release()


async def infer_body(
    relay: TritonRelay,
    http_url: str,
    model_name: str,
    body: bytes,
    *,
    header_length: int | None = None,
    sent_inputs: Sequence[str] = (),
) -> InferenceResponse:
    """Send an inference request body to model `model_name` of the Triton at `http_url` (`http://host:port`) as
    the client wrote it, and return Triton's answer unchanged (KServe v2 "Inference").

    `body`: a KServe v2 "Inference Request JSON Object" (`header_length` None) or, with Triton's "Binary Tensor
    Data Extension", that JSON header followed by the inputs' raw bytes (`header_length`: the header's length in
    bytes, sent as `Inference-Header-Content-Length`; 0: Triton's raw request). Check it first with
    `tritonserving.client.check_inference_header` (Triton answers 500 to a malformed one); `sent_inputs` are the
    input names the check found, used to name the tensor of a "missing input" refusal.
    Returns `InferenceResponse` (body, Content-Type, and the header length when outputs are binary). Raises
    `TritonRequestError` (Triton's message; `field` the tensor it names), `TritonModelNotFound`,
    `TritonUnreachable` (no connection opened: another server may be tried), `TritonUnavailable`.
    """
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
    path = f"/v2/models/{quote(model_name, safe='')}"
    answer = await relay.send("POST", f"{http_url}{path}/infer", headers=headers, body=body)
    payload = await answer.read()
    if answer.status == 200:
        raw_length = answer.headers.get(HEADER_LENGTH.lower())
        return InferenceResponse(
            body=payload,
            content_type=answer.headers.get("content-type", "application/json"),
            header_length=int(raw_length) if raw_length and raw_length.isascii() and raw_length.isdigit() else None,
        )
    known = None
    if names_no_missing_input(payload):
        # Triton lists what is missing, not what it did not know: the model's metadata says which input that was.
        try:
            metadata = await relay.send("GET", f"{http_url}{path}")
            known = input_names(json.loads(await metadata.read())) if metadata.status == 200 else None
        except (TritonUnavailable, ValueError):
            known = None
    raise error_from_answer(
        answer.status, payload, model_name=model_name, where=http_url, known_inputs=known, sent_inputs=sent_inputs
    )

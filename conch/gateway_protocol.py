"""uvicorn's httptools HTTP/1.1 protocol with a bound on a request's head, and request bodies passed on uncopied.

uvicorn (0.54) puts no limit on the head when it parses with httptools: a client could send a header of hundreds
of MB, all of it held in memory, while the event loop parses it. `BoundedHttpToolsProtocol` answers 431 and
closes the connection as soon as a head passes `MAX_HEAD_BYTES`, before its request reaches the gateway.

Its request bodies reach the application in the pieces read from the socket (`PiecewiseCycle`): uvicorn joins
a body into one bytearray and copies that into bytes for each `http.request` message, two copies of every body
that, for a 600 KB inference request, cost the gateway more CPU than parsing and checking the request does.
"""

from __future__ import annotations

import collections
import json
from typing import Any

from django.conf import settings
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "BoundedHttpToolsProtocol"]

#: Most bytes a request's head may take (a chunk read with the head's end may add a few hundred KiB of body
#: to the count, so this is well above any real head: tokens and headers of clients are a few KiB).
MAX_HEAD_BYTES = 1024 * 1024

# Bytes of a request body buffered before the socket stops being read until the application takes them: the
# gateway's CONCH_GATEWAY_STREAM_FROM_BYTES, the size it reads whole anyway (uvicorn's own HIGH_WATER_LIMIT is
# 64 KiB, at which a 600 KB inference request paused and resumed the socket ten times, each a wake-up of the
# request's task: most of the gateway's own CPU per request).


class PiecewiseCycle(httptools_impl.RequestResponseCycle):
    """uvicorn's request/response cycle whose `receive()` hands the body over piece by piece as it was read
    (`http.request` messages, `more_body` set until the last), never joined or copied. Pieces wait in `pieces`;
    `buffered` counts their bytes (the protocol stops reading the socket past CONCH_GATEWAY_STREAM_FROM_BYTES)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pieces: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.transport = _HeadHoldingTransport(self.transport)

    async def send(self, message: dict[str, Any]) -> None:
        """uvicorn's send, with the response head held back and written together with the first piece of body:
        one write and one packet instead of two (and one wake-up of the client instead of two)."""
        transport = self.transport
        if message["type"] == "http.response.start" and not self.response_started:
            transport.hold_next = True
        try:
            await super().send(message)
        finally:
            if message["type"] != "http.response.start" or self.response_complete:
                transport.release()

    async def receive(self) -> dict[str, Any]:
        if not self.pieces or self.waiting_for_100_continue:
            # uvicorn's own receive: sends 100 Continue, resumes reading, waits, or says the client went away.
            message = await super().receive()
            if message["type"] != "http.request" or not self.pieces:
                return message
        piece = self.pieces.popleft()
        self.buffered -= len(piece)
        return {"type": "http.request", "body": piece, "more_body": bool(self.pieces) or self.more_body}


class _HeadHoldingTransport:
    """The cycle's view of its connection's transport: when `hold_next` is set, the next write (the response
    head) is held and goes out with the write after it, in one `writelines`; `release()` writes what is held."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self.hold_next = False

    def write(self, data: bytes) -> None:
        if self.hold_next:
            self.hold_next, self._held = False, data
        elif self._held is not None:
            held, self._held = self._held, None
            self._transport.writelines((held, data))
        else:
            self._transport.write(data)

    def release(self) -> None:
        self.hold_next = False
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# uvicorn's protocol makes its cycle from this module global (uvicorn is pinned: requirements.txt).
httptools_impl.RequestResponseCycle = PiecewiseCycle


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses (431, connection closed) a request whose head passes MAX_HEAD_BYTES."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return  # answered already (e.g. 413 before the body was read): the rest is dropped, as uvicorn does
        cycle.pieces.append(body)
        cycle.buffered += len(body)
        if cycle.buffered > settings.CONCH_GATEWAY_STREAM_FROM_BYTES:
            self.flow.pause_reading()
        cycle.message_event.set()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            body = json.dumps(
                {"error": f"The request line and headers pass {MAX_HEAD_BYTES} bytes; send them shorter."}
            ).encode()
            self.logger.warning("gateway.request.head_too_large client=%s", self.client)
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            self.transport.close()

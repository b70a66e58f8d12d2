"""The inference gateway's HTTP/1.1 protocol: uvicorn's httptools one with a bound on a request's head
(`conch.http_protocol.HeadLimitProtocol`), and request bodies passed on uncopied.

Its request bodies reach the application in the pieces read from the socket (`PiecewiseCycle`): uvicorn joins
a body into one bytearray and copies that into bytes for each `http.request` message, two copies of every body
that, for a 600 KB inference request, cost the gateway more CPU than parsing and checking the request does.

uvicorn's `on_headers_complete` makes each request's cycle from its module's global `RequestResponseCycle`. The
protocol runs a copy of that method whose globals name `PiecewiseCycle` instead, so uvicorn's module stays as it
is for every other server in the process (the console's, `conch.web`, among them).
"""

from __future__ import annotations

import collections
import types
from typing import Any

from django.conf import settings
from uvicorn.protocols.http import httptools_impl

from conch.http_protocol import MAX_HEAD_BYTES, HeadLimitProtocol

__all__ = ["MAX_HEAD_BYTES", "BoundedHttpToolsProtocol"]

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


def _with_cycle_class(function: types.FunctionType, cycle_class: type) -> types.FunctionType:
    """A copy of uvicorn's `function` that makes its request cycles from `cycle_class`: the same code, run with a
    copy of its module's globals in which `RequestResponseCycle` names `cycle_class`.

    Raises RuntimeError at import when `function` no longer reads that global (uvicorn is pinned:
    requirements.txt; a new release must be checked against this)."""
    if "RequestResponseCycle" not in function.__code__.co_names:
        raise RuntimeError(f"uvicorn's {function.__qualname__} no longer makes its cycle from RequestResponseCycle")
    scope = dict(function.__globals__)
    scope["RequestResponseCycle"] = cycle_class
    copy = types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__, function.__closure__)
    copy.__qualname__ = function.__qualname__
    return copy


_piecewise_on_headers_complete = _with_cycle_class(httptools_impl.HttpToolsProtocol.on_headers_complete, PiecewiseCycle)


class BoundedHttpToolsProtocol(HeadLimitProtocol):
    """HeadLimitProtocol (431 past MAX_HEAD_BYTES) whose requests run in `PiecewiseCycle`s, their body pieces
    buffered up to CONCH_GATEWAY_STREAM_FROM_BYTES before the socket stops being read."""

    log_prefix = "gateway"

    def on_headers_complete(self) -> None:
        self._in_head = False
        _piecewise_on_headers_complete(self)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return  # answered already (e.g. 413 before the body was read): the rest is dropped, as uvicorn does
        cycle.pieces.append(body)
        cycle.buffered += len(body)
        if cycle.buffered > settings.CONCH_GATEWAY_STREAM_FROM_BYTES:
            self.flow.pause_reading()
        cycle.message_event.set()

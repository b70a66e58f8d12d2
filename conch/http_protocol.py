"""uvicorn's httptools HTTP/1.1 protocol with the bounds Conch's two servers put on what a client may hold.

uvicorn (0.54) puts no limit on a request's head when it parses with httptools (a client could send a header of
hundreds of MB, all of it held in memory), and no time limit on a head or a body that arrives slowly.

- `HeadLimitProtocol` answers 431 and closes the connection as soon as a head passes `MAX_HEAD_BYTES`, before
  its request reaches the application. The inference gateway (`conch.gateway_protocol`) builds on it.
- `ConsoleProtocol` (the console's web server, `conch.web`) also cuts off a client that is slow to send its
  head (CONCH_WEB_HEADER_TIMEOUT_SECONDS from the connection's start or the request's first byte) or that goes
  quiet while sending a body (CONCH_WEB_BODY_TIMEOUT_SECONDS without a byte): 408 and the connection closed.
  Django's ASGI handler reads a whole body before any view runs, so a slow client holds a connection of the
  event loop (a few KiB), never a thread, while it sends; these timeouts free that connection too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "ConsoleProtocol", "HeadLimitProtocol"]

#: Most bytes a request's head may take (a chunk read with the head's end may add a few hundred KiB of body
#: to the count, so this is well above any real head: tokens and headers of clients are a few KiB).
MAX_HEAD_BYTES = 1024 * 1024


class HeadLimitProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses (431, connection closed) a request whose head passes MAX_HEAD_BYTES.

    `log_prefix` names the server in log events (`<prefix>.request.head_too_large`); `error_body()` writes the
    JSON body of the refusals in the form the server's clients read.
    """

    log_prefix = "http"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0

    @staticmethod
    def error_body(message: str) -> bytes:
        """The JSON body of a refusal written by the protocol itself: `{"error": message}`."""
        return json.dumps({"error": message}).encode()

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self.logger.warning("%s.request.head_too_large client=%s", self.log_prefix, self.client)
            self.refuse(
                b"431 Request Header Fields Too Large",
                f"The request line and headers pass {MAX_HEAD_BYTES} bytes; send them shorter.",
            )

    def refuse(self, status_line: bytes, message: str) -> None:
        """Answer `status_line` (b"431 Request Header Fields Too Large") with `message` and close the connection."""
        body = self.error_body(message)
        self.transport.write(
            b"HTTP/1.1 " + status_line + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()


class ConsoleProtocol(HeadLimitProtocol):
    """HeadLimitProtocol that also cuts off slow heads and stalled bodies (408, connection closed).

    - Head: from the connection's start (first request) or the request's first byte (later ones on a kept-alive
      connection) to the end of its headers, at most CONCH_WEB_HEADER_TIMEOUT_SECONDS. A connection that sent
      no byte at all is closed without an answer.
    - Body: at most CONCH_WEB_BODY_TIMEOUT_SECONDS between two reads of it. Time the server itself stops reading
      (the application has not taken what was read yet) does not count.

    Both are read from settings when a connection starts (seconds, floats).
    """

    log_prefix = "web"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = float(settings.CONCH_WEB_HEADER_TIMEOUT_SECONDS)
        self._body_timeout = float(settings.CONCH_WEB_BODY_TIMEOUT_SECONDS)
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False
        self._last_body_read = 0.0

    @staticmethod
    def error_body(message: str) -> bytes:
        """The console's API error form: `{"detail": message, "field": null}`."""
        return json.dumps({"detail": message, "field": None}).encode()

    # -- the head -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._set_timer(self._header_timeout, self._head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        if self._timer is None:  # a later request of a kept-alive connection: its own deadline
            self._set_timer(self._header_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if not self._head_started:
            self.transport.close()  # nothing was asked: nobody to answer
            return
        self.logger.warning("web.request.head_timeout client=%s", self.client)
        self.refuse(
            b"408 Request Timeout",
            f"The request line and headers took more than {self._header_timeout:g} s to arrive; send them at once.",
        )

    # -- the body -------------------------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._head_started = False
        self._last_body_read = self.loop.time()
        self._set_timer(self._body_timeout, self._body_timed_out)

    def on_body(self, body: bytes) -> None:
        self._last_body_read = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        super().on_message_complete()

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        quiet = self.loop.time() - self._last_body_read
        if self.flow.read_paused:
            # Not the client's fault: the application has yet to take the buffered body.
            self._last_body_read = self.loop.time()
            self._set_timer(self._body_timeout, self._body_timed_out)
            return
        if quiet < self._body_timeout:
            self._set_timer(self._body_timeout - quiet, self._body_timed_out)
            return
        self.logger.warning("web.request.body_timeout client=%s", self.client)
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # an answer is under way: it cannot become a 408
            return
        self.refuse(
            b"408 Request Timeout",
            f"The request body stopped arriving for {self._body_timeout:g} s; send it again without pausing.",
        )

    # -- timers ---------------------------------------------------------------------------------------------
    def _set_timer(self, delay: float, callback: Any) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

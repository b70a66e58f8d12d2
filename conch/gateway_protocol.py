"""uvicorn's httptools HTTP/1.1 protocol with a bound on a request's head (request line and headers).

uvicorn (0.54) puts no limit on the head when it parses with httptools: a client could send a header of hundreds
of MB, all of it held in memory, while the event loop parses it. `BoundedHttpToolsProtocol` answers 431 and
closes the connection as soon as a head passes `MAX_HEAD_BYTES`, before its request reaches the gateway.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "BoundedHttpToolsProtocol"]

#: Most bytes a request's head may take (a chunk read with the head's end may add a few hundred KiB of body
#: to the count, so this is well above any real head: tokens and headers of clients are a few KiB).
MAX_HEAD_BYTES = 1024 * 1024

#: Bytes of a request body uvicorn buffers before it stops reading the socket until the application takes them
#: (uvicorn's HIGH_WATER_LIMIT, 64 KiB by default). The gateway reads bodies up to
#: CONCH_GATEWAY_STREAM_FROM_BYTES (4 MiB) whole anyway, and at 64 KiB a 600 KB inference request paused and
#: resumed the socket ten times, each a wake-up of the request's task: most of the gateway's own CPU per request.
BODY_BUFFER_BYTES = 4 * 1024 * 1024
httptools_impl.HIGH_WATER_LIMIT = BODY_BUFFER_BYTES


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

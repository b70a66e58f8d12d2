"""ASGI entry point: the console, the API and the admin as `python -m conch.web` serves them (uvicorn).

Django's ASGI handler reads a request's whole body (into a file spooled to disk past FILE_UPLOAD_MAX_MEMORY_SIZE)
on the event loop before any middleware or view runs, so a client that sends slowly holds no thread; the view
then runs in a thread of its own. `ConsoleASGIHandler` adds what that needs to stay bounded:

- a body larger than its view accepts (`conch.limits`) is not read: a declared Content-Length over the limit gets
  the usual 413 at once, and a chunked body is cut off with it once it passes the limit;
- a streaming response with a synchronous iterator (WhiteNoise's static files, a model file download) is sent
  chunk by chunk, each chunk read in the request's thread (Django's handler would read it whole into memory);
- the request's database connections are closed when it ends: its thread ends with it, so a kept connection
  (CONN_MAX_AGE) would be left to the garbage collector.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

from conch.middleware import body_refusal, transfer_limit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")

__all__ = ["ConsoleASGIHandler", "application"]

Message = dict[str, Any]


class ConsoleASGIHandler(ASGIHandler):
    """Django's ASGIHandler with bounded request bodies, streamed synchronous responses and per-request database
    connections (see the module docstring)."""

    async def handle(self, scope: Message, receive: Callable[[], Awaitable[Message]], send: Callable) -> None:
        path_info = scope["path"][len(scope.get("root_path", "")) :] or "/"
        limit, max_bytes = transfer_limit(path_info, scope["method"])
        declared = _declared_length(scope)
        try:
            if declared is not None and declared > max_bytes:
                await self._refuse(body_refusal(path_info, limit, declared), send)
                return
            bounded = _BoundedReceive(receive, max_bytes)
            await super().handle(scope, bounded, send)
            if bounded.over:
                await self._refuse(body_refusal(path_info, limit, bounded.received), send)
        finally:
            await sync_to_async(connections.close_all)()

    async def _refuse(self, response: Any, send: Callable) -> None:
        # The unread rest of the body would be the next request's start: the connection ends with the answer.
        response["Connection"] = "close"
        await self.send_response(response, send)

    async def send_response(self, response: Any, send: Callable) -> None:
        if response.streaming and not response.is_async:
            response.streaming_content = _read_in_thread(iter(response.streaming_content))
        await super().send_response(response, send)


def _declared_length(scope: Message) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn's parser refuses such a request before it gets here
    return None


class _BoundedReceive:
    """`receive` that reports the client gone (`http.disconnect`) once the body passes `max_bytes`; `over` says
    so, `received` counts the bytes taken."""

    def __init__(self, receive: Callable[[], Awaitable[Message]], max_bytes: int) -> None:
        self._receive = receive
        self._max_bytes = max_bytes
        self.received = 0
        self.over = False

    async def __call__(self) -> Message:
        if self.over:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self._max_bytes:
                self.over = True
                return {"type": "http.disconnect"}
        return message


async def _read_in_thread(parts: Iterator[bytes]) -> AsyncIterator[bytes]:
    take = sync_to_async(next)  # thread-sensitive: the request's own thread, as a WSGI server would read it
    while (part := await take(parts, None)) is not None:
        yield part


django.setup(set_prefix=False)
application = ConsoleASGIHandler()

"""Asynchronous relay of KServe v2 requests to Triton over pooled keep-alive connections (aiohttp).

The inference gateway (`deployments.api.gateway`) passes each client request to a Triton of the deployment and
streams Triton's answer back. Opening a TCP connection per request costs more than Conch's whole share of a
request's latency budget, so one `TritonRelay` per process keeps connections to every Triton it talks to open
and reuses them (HTTP/1.1 keep-alive; Triton's HTTP endpoint keeps a connection open until the client closes it).

Talks to: Triton's HTTP/REST endpoint (KServe v2 protocol; Triton docs "HTTP/REST and GRPC Protocol").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp

from tritonserving.client import RELAYED_HEADERS, TritonUnavailable, TritonUnreachable

__all__ = ["RelayedAnswer", "TritonRelay"]

#: Headers of Triton's answer passed back besides RELAYED_HEADERS: the length lets the client keep its connection.
_ANSWER_HEADERS = RELAYED_HEADERS | {"content-length"}
#: Bytes read from Triton per chunk of a streamed answer.
CHUNK_BYTES = 256 * 1024


@dataclass
class RelayedAnswer:
    """Triton's answer: HTTP `status`, the `headers` that describe the body, and `chunks`, an async iterator over
    the body's bytes (read from Triton as the client takes them). `close()` (or reading to the end) hands the
    connection back to the pool."""

    status: int
    headers: dict[str, str]
    response: aiohttp.ClientResponse

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body in pieces of at most CHUNK_BYTES. Raises TritonUnavailable when Triton stops mid-way."""
        try:
            async for chunk in self.response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise TritonUnavailable(f"Triton stopped while sending its answer: {exc}") from None
        finally:
            self.response.release()

    async def read(self) -> bytes:
        """The whole body (for small answers Conch rewrites, e.g. server metadata)."""
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        self.response.release()


class TritonRelay:
    """A pool of keep-alive HTTP connections to Tritons, for one event loop.

    `max_connections`: connections open at once per Triton (host:port); requests beyond wait for a free one.
    `timeout_s`: seconds a whole relayed request may take (connect + send + Triton's work + answer).
    `connect_timeout_s`: seconds to open a connection; past it the server counts as unreachable.
    Create it inside the running loop; `await close()` at shutdown.
    """

    def __init__(self, *, max_connections: int = 64, timeout_s: float = 60.0, connect_timeout_s: float = 3.0) -> None:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=max_connections, keepalive_timeout=60, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | AsyncIterator[bytes] | None = None,
        content_length: int | None = None,
    ) -> RelayedAnswer:
        """Send one request to `url` (a Triton's `http://host:port/v2/...`) and return its answer, body unread.

        `headers`: the client's; only RELAYED_HEADERS (Content-Type, Content-Encoding, Accept-Encoding,
        Inference-Header-Content-Length) and `X-Conch-Key` (the restricted-endpoint key) go on. `body`: bytes, or
        an async iterator of chunks sent as they come, with `content_length` (bytes) sent as Content-Length so
        Triton reads a plain, not chunked, body. Raises TritonUnreachable when no connection opens (nothing was
        sent, so another server may be tried), TritonUnavailable when the exchange fails after that.
        """
        sent = {
            name: value
            for name, value in (headers or {}).items()
            if name.lower() in RELAYED_HEADERS or name.lower() == "x-conch-key"
        }
        if content_length is not None:
            sent["Content-Length"] = str(content_length)
        try:
            response = await self._session.request(method, url, data=body, headers=sent, allow_redirects=False)
        except (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) or "connect" in str(exc).lower():
                raise TritonUnreachable(f"Triton at {url} cannot be reached: {exc}") from None
            raise TritonUnavailable(f"Triton at {url} timed out: {exc}") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            kind = "timed out" if isinstance(exc, asyncio.TimeoutError) else "failed"
            raise TritonUnavailable(f"Triton at {url} {kind}: {exc}") from None
        kept = {name: value for name, value in response.headers.items() if name.lower() in _ANSWER_HEADERS}
        return RelayedAnswer(status=response.status, headers=kept, response=response)

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._session.close()

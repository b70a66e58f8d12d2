"""Input tensors handed to a Triton on the same host through POSIX shared memory instead of its HTTP socket.

Triton's "System Shared Memory" extension (Triton docs, "Shared-Memory Extension"): a client registers a POSIX
shared-memory object with the server (`POST v2/systemsharedmemory/region/<name>/register` with `key`, `offset`,
`byte_size`; the server maps it once), and an inference request then names a region, offset and byte size in an
input's `parameters` (`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`) instead of
sending the tensor's bytes. Triton reads the tensor straight from the mapping.

The gateway uses it for Tritons on its own host (the local runtime), on both edges: a 600 KB image tensor then
crosses the loopback socket once (client to gateway) instead of twice, and Triton parses a JSON header (HTTP) or
a `ModelInferRequest` without `raw_input_contents` (gRPC, `grpc_relay.shared_memory_infer_request`) of a few
hundred bytes instead of receiving the tensors. Both edges of a gateway process share one region per server.
On the 2-core benchmark machine that CPU is taken from Triton itself (bench/serving.py, systems e and g).

One `SharedMemoryRegion` per (gateway process, Triton server): created here with mode 0600 under a random name,
registered with the server (a restricted endpoint: it needs the server's key), then unlinked, so nothing is left
in /dev/shm if the process dies; the server keeps its mapping until the region is unregistered or it stops.
Each request leases a span of the region (`SpanAllocator`) for as long as its answer is being read.

Talks to: nothing itself; `TritonRelay` carries the registration requests.
"""

from __future__ import annotations

import asyncio
import bisect
import ipaddress
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any
from urllib.parse import urlsplit

from tritonserving.access import API_KEY_HEADER
from tritonserving.client import TritonUnavailable
from tritonserving.relay import TritonRelay

log = logging.getLogger(__name__)

__all__ = [
    "ALIGNMENT",
    "Placement",
    "SharedMemoryInputs",
    "SharedMemoryRegion",
    "SpanAllocator",
    "aligned",
    "copy_span",
    "is_same_host",
    "shared_memory_header",
]

#: Spans start at multiples of this many bytes (a cache line; tensors of every datatype stay aligned).
ALIGNMENT = 64


class SpanAllocator:
    """First-fit allocation of byte spans in a region of `size` bytes; not thread-safe (one event loop uses it).

    `allocate(n)` returns the offset (bytes, a multiple of ALIGNMENT) of a free span of at least `n` bytes, or
    None when no free span is large enough; `release(offset)` frees a span `allocate` returned. Freed neighbours
    merge, so a region used by requests that come and go does not fragment for good.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"a region needs a positive size in bytes, got {size}")
        self.size = size
        self._free_starts: list[int] = [0]  # sorted starts of free spans
        self._free_ends: dict[int, int] = {0: size}  # start -> end (exclusive) of each free span
        self._used: dict[int, int] = {}  # start -> end of each allocated span

    @property
    def used_bytes(self) -> int:
        """Bytes held by allocated spans (aligned sizes)."""
        return sum(end - start for start, end in self._used.items())

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a new span of `nbytes` (rounded up to ALIGNMENT; 0 bytes takes one ALIGNMENT), or None."""
        want = max(ALIGNMENT, aligned(nbytes))
        for index, start in enumerate(self._free_starts):
            end = self._free_ends[start]
            if end - start >= want:
                del self._free_ends[start]
                if end - start == want:
                    del self._free_starts[index]
                else:
                    self._free_starts[index] = start + want
                    self._free_ends[start + want] = end
                self._used[start] = start + want
                return start
        return None

    def release(self, offset: int) -> None:
        """Free the span that starts at `offset`. Raises KeyError when no allocated span starts there."""
        end = self._used.pop(offset)
        start = offset
        index = bisect.bisect_left(self._free_starts, start)
        # Merge with the free span after it, then with the one before it.
        if index < len(self._free_starts) and self._free_starts[index] == end:
            end = self._free_ends.pop(end)
            del self._free_starts[index]
        if index > 0:
            before = self._free_starts[index - 1]
            if self._free_ends[before] == start:
                self._free_ends[before] = end
                return
        self._free_starts.insert(index, start)
        self._free_ends[start] = end


class SharedMemoryRegion:
    """A POSIX shared-memory object of `byte_size` bytes, mapped here, to register with one Triton server.

    `name`: the region's name for Triton (letters, digits, '-'); `key`: the object's POSIX name ('/…') that
    Triton opens when the region is registered; `buffer`: a writable memoryview of the whole region;
    `spans`: its `SpanAllocator`. Call `forget_key()` once the server has mapped it (the object's name is
    removed; both mappings stay), and `close()` when done with it.
    Raises OSError when the object cannot be created (e.g. /dev/shm full or missing).
    """

    def __init__(self, byte_size: int, *, prefix: str = "conch-gw") -> None:
        self.name = f"{prefix}-{os.getpid()}-{secrets.token_hex(8)}"
        self._memory = shared_memory.SharedMemory(name=self.name, create=True, size=byte_size)  # mode 0600
        self.key = "/" + self._memory.name
        self.byte_size = byte_size
        self.buffer: memoryview | None = self._memory.buf  # None once closed
        self.spans = SpanAllocator(byte_size)
        self._key_forgotten = False

    def registration(self) -> bytes:
        """The JSON body of Triton's `POST v2/systemsharedmemory/region/<name>/register` for this region."""
        return json.dumps({"key": self.key, "offset": 0, "byte_size": self.byte_size}).encode()

    def forget_key(self) -> None:
        """Remove the object's name (/dev/shm/<name>): mappings made already stay valid. Idempotent."""
        if not self._key_forgotten:
            self._key_forgotten = True
            self._memory.unlink()

    def close(self) -> None:
        """Unmap the region here (and remove its name if still there). Idempotent."""
        self.forget_key()
        self.buffer = None
        try:
            self._memory.close()
        except BufferError:  # a memoryview of it is still alive somewhere; the mapping goes with the object
            pass


def copy_span(buffer: memoryview, offset: int, pieces: Sequence[bytes], start: int, nbytes: int) -> None:
    """Copy bytes [start, start + nbytes) of the concatenation of `pieces` to `buffer[offset:]`, without joining
    the pieces. Raises ValueError when the pieces hold fewer bytes."""
    position = 0  # where the current piece starts in the concatenation
    written = 0
    for piece in pieces:
        piece_end = position + len(piece)
        if piece_end > start + written and written < nbytes:
            begin = start + written - position
            take = min(len(piece) - begin, nbytes - written)
            buffer[offset + written : offset + written + take] = memoryview(piece)[begin : begin + take]
            written += take
        position = piece_end
        if written == nbytes:
            return
    if written < nbytes:
        raise ValueError(f"the body holds {written} of the {nbytes} bytes to copy from byte {start}")


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to a multiple of ALIGNMENT."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def shared_memory_header(request: Mapping[str, Any], region: str, base: int) -> bytes:
    """The JSON body that asks for `request` (a checked binary-data inference header, parsed; not changed) with
    its binary inputs read from spans of the registered `region` instead: input i's bytes at offset `base` + the
    aligned sizes of the binary inputs before it (what `copy_span` is to fill), `shared_memory_byte_size` its
    `binary_data_size`. No binary tensor data follows the returned body."""
    offset = base
    inputs = []
    for tensor in request["inputs"]:
        parameters = dict(tensor.get("parameters") or {})
        if "binary_data_size" in parameters:
            size = int(parameters.pop("binary_data_size"))
            parameters["shared_memory_region"] = region
            parameters["shared_memory_offset"] = offset
            parameters["shared_memory_byte_size"] = size
            offset += aligned(size)
            tensor = {**tensor, "parameters": parameters}
        inputs.append(tensor)
    return json.dumps({**request, "inputs": inputs}, separators=(",", ":")).encode()


def is_same_host(base_url: str) -> bool:
    """Whether the Triton at `base_url` (`http://host:port`) listens on a loopback address, i.e. runs on this
    host and can map this host's POSIX shared memory (Conch's local runtime binds its Tritons to 127.0.0.1)."""
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Placement:
    """A request's binary inputs written to a span of a registered region: `body` is the JSON header to send
    instead (no binary data after it); `release()` frees the span once Triton's answer has been read."""

    body: bytes
    region: SharedMemoryRegion
    offset: int

    def release(self) -> None:
        """Give the span back (idempotent)."""
        if self.offset >= 0:
            self.region.spans.release(self.offset)
            self.offset = -1


class SharedMemoryInputs:
    """Places the binary inputs of inference requests for same-host Tritons in shared memory, one registered
    region of `region_bytes` bytes per server (for one event loop; create it inside the running loop).

    `relay`: the `TritonRelay` that carries registration requests. A server that refuses a registration, or a
    host without usable /dev/shm, is left to the plain relay for `RETRY_AFTER_S` seconds.
    """

    #: Seconds a server whose registration failed is not tried again.
    RETRY_AFTER_S = 60.0
    #: Regions kept at most (one per server this process talked to); the least recently used is dropped past it.
    MAX_REGIONS = 64

    def __init__(self, relay: TritonRelay, region_bytes: int) -> None:
        self._relay = relay
        self._region_bytes = region_bytes
        self._regions: dict[str, SharedMemoryRegion] = {}
        self._registering: set[str] = set()
        self._refused_until: dict[str, float] = {}
        self._keys: dict[str, str] = {}

    async def lease(self, base_url: str, api_key: str, sizes: Sequence[int]) -> Placement | None:
        """A span of `base_url`'s region (registered first if need be) for tensors of `sizes` bytes each, in
        order: tensor i goes at `placement.offset` + the aligned sizes of those before it (`aligned`). The
        returned `Placement` has an empty `body` for the caller to set. None to send the tensors as they are
        (another host, region being registered or refused, no free span, no tensor or an empty one)."""
        if not sizes or not all(sizes):
            return None
        region = self._regions.get(base_url)
        if region is None:
            await self._register(base_url, api_key)
            region = self._regions.get(base_url)
            if region is None:
                return None
        else:
            self._regions[base_url] = self._regions.pop(base_url)  # most recently used last
        base = region.spans.allocate(sum(aligned(size) for size in sizes))
        if base is None or region.buffer is None:  # no free span (a region here is never closed)
            return None
        return Placement(b"", region, base)

    async def place(
        self,
        base_url: str,
        api_key: str,
        request: Mapping[str, Any],
        sizes: Sequence[int],
        header_length: int,
        pieces: Sequence[bytes],
    ) -> Placement | None:
        """Write the binary inputs of a checked HTTP request to a span of `base_url`'s region; return the
        `Placement`, or None to send the body as it is (see `lease`).

        `request`: its parsed JSON header (left as it is, so the body can be placed again); `sizes`: the
        `binary_data_size` of each binary input, in order (bytes); `header_length`: bytes of the JSON header;
        `pieces`: the whole body, as read.
        """
        placement = await self.lease(base_url, api_key, sizes)
        if placement is None:
            return None
        region = placement.region
        assert region.buffer is not None  # checked by lease, on this loop
        placement.body = shared_memory_header(request, region.name, placement.offset)
        offset, start = placement.offset, header_length
        for size in sizes:
            copy_span(region.buffer, offset, pieces, start, size)
            offset += aligned(size)
            start += size
        return placement

    async def place_tensors(self, base_url: str, api_key: str, tensors: Sequence[memoryview]) -> Placement | None:
        """Copy `tensors` (each one input's raw bytes, in order) to a span of `base_url`'s region, at the offsets
        `lease` gives; return the `Placement` (its `body` empty, for the caller's request naming the span), or
        None to send the tensors as they are (see `lease`)."""
        placement = await self.lease(base_url, api_key, [len(tensor) for tensor in tensors])
        if placement is None:
            return None
        buffer = placement.region.buffer
        assert buffer is not None  # checked by lease, on this loop
        offset = placement.offset
        for tensor in tensors:
            buffer[offset : offset + len(tensor)] = tensor
            offset += aligned(len(tensor))
        return placement

    def names_region(self, placement: Placement, answer_body: bytes) -> bool:
        """Whether Triton's error answer (an HTTP body, or a gRPC status's details as bytes) names the placement's
        region, so that the request is to be sent again with its bytes (the client must not see an internal
        region's name, nor an error only shared memory causes). When the server says it has no such region (it
        restarted on the same address and lost its registrations), the region is forgotten here too and the next
        request registers a new one."""
        name = placement.region.name.encode()
        if name not in answer_body:
            return False
        # Triton 2.5x's HTTP frontend: "Unable to find shared memory region: '<name>'" (404); its core's
        # shared-memory manager: "Unable to find system shared memory region: '<name>'".
        if re.search(rb"Unable to find (?:system )?shared memory region: '" + re.escape(name) + rb"'", answer_body):
            self._drop(placement.region)
        return True

    def forget(self, base_url: str) -> None:
        """Drop `base_url`'s region (the server went away); nothing is sent to it."""
        region = self._regions.get(base_url)
        if region is not None:
            self._drop(region)

    async def close(self) -> None:
        """Unregister every region from its server (best effort) and unmap it."""
        for base_url, region in list(self._regions.items()):
            await self._unregister(base_url, region)
            self._drop(region)

    # -- internals ----------------------------------------------------------------------------------------------

    async def _register(self, base_url: str, api_key: str) -> None:
        loop = asyncio.get_running_loop()
        if (
            self._region_bytes <= 0
            or base_url in self._registering
            or self._refused_until.get(base_url, 0.0) > loop.time()
            or not is_same_host(base_url)
        ):
            return
        self._registering.add(base_url)
        region = None
        try:
            region = SharedMemoryRegion(self._region_bytes)
            answer = await self._relay.send(
                "POST",
                f"{base_url}/v2/systemsharedmemory/region/{region.name}/register",
                headers={"Content-Type": "application/json", API_KEY_HEADER: api_key},
                body=region.registration(),
            )
            detail = await answer.read()
            if answer.status != 200:
                raise OSError(f"Triton refused the registration ({answer.status}): {detail[:200]!r}")
            region.forget_key()
        except (OSError, TritonUnavailable) as exc:  # TritonUnreachable is a TritonUnavailable
            log.warning("relay.shared_memory.refused", extra={"server": base_url, "error": str(exc)})
            self._refused_until[base_url] = loop.time() + self.RETRY_AFTER_S
            if region is not None:
                region.close()
            return
        finally:
            self._registering.discard(base_url)
        if len(self._regions) >= self.MAX_REGIONS:
            oldest_url = next(iter(self._regions))
            oldest = self._regions[oldest_url]
            await self._unregister(oldest_url, oldest)
            self._drop(oldest)
        self._regions[base_url] = region
        self._keys[base_url] = api_key

    async def _unregister(self, base_url: str, region: SharedMemoryRegion) -> None:
        try:
            answer = await self._relay.send(
                "POST",
                f"{base_url}/v2/systemsharedmemory/region/{region.name}/unregister",
                headers={API_KEY_HEADER: self._keys.get(base_url, "")},
            )
            await answer.read()
        except TritonUnavailable:
            pass  # the server is gone, and its mapping with it

    def _drop(self, region: SharedMemoryRegion) -> None:
        for base_url, known in list(self._regions.items()):
            if known is region:
                del self._regions[base_url]
                self._keys.pop(base_url, None)
        region.close()

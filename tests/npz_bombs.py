"""`.npz` files that unpack to far more than they weigh, or whose sizes lie, written without holding their arrays."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npz_bomb(*, name: str, shape: tuple[int, ...], dtype: type = np.float32) -> bytes:
    """An honest `.npz` (deflated) holding one array of zeros of `shape`: tiny packed, large unpacked.

    The zeros are written a megabyte at a time, so making it never holds the array.
    """
    kind = np.dtype(dtype)
    left = int(np.prod(shape)) * kind.itemsize
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
            member.write(_npy_header(shape, kind))
            chunk = bytes(1024 * 1024)
            while left:
                member.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
    return buffer.getvalue()


def lying_npz(*, name: str, header_shape: tuple[int, ...], data: bytes, stream_extra: int = 0) -> bytes:
    """A one-member `.npz` whose .npy header declares `header_shape` (float32) but which holds `data` after it.

    The zip entry declares the true size and CRC-32 of header + `data`. With `stream_extra`, the deflated stream
    holds that many more zero bytes than the entry declares (sizes and CRC-32 still of header + `data`): a reader
    that trusts the stream rather than the entry unpacks them all.
    """
    body = _npy_header(header_shape, np.dtype(np.float32)) + data
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    packed = [compressor.compress(body)]
    chunk = bytes(1024 * 1024)
    left = stream_extra
    while left:
        packed.append(compressor.compress(chunk[: min(left, len(chunk))]))
        left -= min(left, len(chunk))
    packed.append(compressor.flush())
    stream = b"".join(packed)
    filename = f"{name}.npy".encode()
    crc = zlib.crc32(body)
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc, len(stream), len(body), len(filename), 0
    )
    central = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        20,
        20,
        0,
        8,
        0,
        0x21,
        crc,
        len(stream),
        len(body),
        len(filename),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    entry = local + filename + stream
    directory = central + filename
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), len(entry), 0)
    return entry + directory + end

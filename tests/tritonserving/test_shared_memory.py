"""Pure parts of `tritonserving.shared_memory`: the span allocator, the copy out of body pieces and the header
rewrite (the path through a real Triton is tested with the gateway, tests/deployments/test_gateway.py)."""

from __future__ import annotations

import json
import random

import pytest

from tritonserving.shared_memory import (
    ALIGNMENT,
    SharedMemoryRegion,
    SpanAllocator,
    copy_span,
    is_same_host,
    shared_memory_header,
)


def test_spans_are_aligned_and_disjoint_and_a_full_region_says_none():
    spans = SpanAllocator(4 * ALIGNMENT)
    first, second = spans.allocate(1), spans.allocate(ALIGNMENT + 1)
    assert (first, second) == (0, ALIGNMENT)
    assert spans.allocate(2 * ALIGNMENT) is None  # one aligned span is left, not two
    assert spans.allocate(ALIGNMENT) == 3 * ALIGNMENT
    assert spans.used_bytes == 4 * ALIGNMENT


def test_freed_spans_merge_so_churn_does_not_fragment_the_region():
    rng = random.Random(7)
    spans = SpanAllocator(1024 * ALIGNMENT)
    held: list[int] = []
    for _ in range(5000):
        if held and rng.random() < 0.5:
            spans.release(held.pop(rng.randrange(len(held))))
        else:
            offset = spans.allocate(rng.randrange(1, 40 * ALIGNMENT))
            if offset is not None:
                held.append(offset)
    for offset in held:
        spans.release(offset)
    assert spans.used_bytes == 0
    assert spans.allocate(1024 * ALIGNMENT) == 0  # one free span again, the whole region


def test_releasing_a_span_twice_or_one_never_given_raises():
    spans = SpanAllocator(8 * ALIGNMENT)
    offset = spans.allocate(10)
    spans.release(offset)
    with pytest.raises(KeyError):
        spans.release(offset)


def test_copy_span_takes_bytes_across_pieces_without_joining_them():
    pieces = [b"HEADERab", b"cdef", b"", b"ghij"]
    buffer = memoryview(bytearray(16))
    copy_span(buffer, 3, pieces, 5, 8)
    assert bytes(buffer[3:11]) == b"Rabcdefg"
    with pytest.raises(ValueError, match="holds 2 of the 5 bytes"):
        copy_span(buffer, 0, pieces, 14, 5)


def test_the_header_names_spans_in_input_order_and_keeps_json_inputs():
    header = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
                {"name": "b", "shape": [1], "datatype": "INT64", "data": [5]},
                {"name": "c", "shape": [3], "datatype": "INT8", "parameters": {"binary_data_size": 3}},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    request = json.loads(header)
    rewritten = json.loads(shared_memory_header(request, "r1", 128))
    assert request == json.loads(header)  # left as it was: a retry on another server places it again
    a, b, c = rewritten["inputs"]
    assert a["parameters"] == {"shared_memory_region": "r1", "shared_memory_offset": 128, "shared_memory_byte_size": 8}
    assert b == {"name": "b", "shape": [1], "datatype": "INT64", "data": [5]}
    assert c["parameters"]["shared_memory_offset"] == 128 + ALIGNMENT
    assert rewritten["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]


def test_only_loopback_servers_count_as_this_host():
    assert (
        is_same_host("http://127.0.0.1:8000") and is_same_host("http://localhost:1") and is_same_host("http://[::1]:2")
    )
    assert not is_same_host("http://10.1.2.3:8000") and not is_same_host("http://triton.conch.svc:8000")


def test_a_region_is_private_to_this_user_and_its_name_can_be_removed_while_mapped(tmp_path):
    import os
    import stat
    from pathlib import Path

    region = SharedMemoryRegion(4096)
    try:
        path = Path("/dev/shm") / region.key.lstrip("/")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        region.buffer[:5] = b"hello"
        region.forget_key()
        assert not path.exists()
        assert bytes(region.buffer[:5]) == b"hello"
    finally:
        region.close()

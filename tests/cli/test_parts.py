"""Pure pieces of the CLI: inference bodies from .npy files, outputs back to arrays, sizes, exit codes, the shared
rate limit and the log-style progress line."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conch_cli import output, tensors
from conch_cli.errors import CliError, exit_code_for_status
from conch_cli.main import _grpc_gateway_line, _size
from conch_cli.transfer import RateLimit


def test_build_request_puts_each_array_as_little_endian_binary_after_the_json_header(tmp_path):
    x = np.arange(6, dtype=">f4").reshape(2, 3)  # big-endian on disk: sent little-endian
    ids = np.array([[1, 2]], dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ids.npy", ids)
    body, header_length = tensors.build_request([("x", tmp_path / "x.npy"), ("ids", tmp_path / "ids.npy")])
    header = json.loads(body[:header_length])
    assert header == {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
            {"name": "ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
        ]
    }
    rest = body[header_length:]
    assert np.frombuffer(rest[:24], dtype="<f4").tolist() == [0, 1, 2, 3, 4, 5]
    assert np.frombuffer(rest[24:], dtype="<i8").tolist() == [1, 2]


def test_build_request_refuses_a_dtype_triton_lacks_and_names_the_input(tmp_path):
    np.save(tmp_path / "c.npy", np.zeros(2, dtype=np.complex64))
    with pytest.raises(CliError) as refused:
        tensors.build_request([("z", tmp_path / "c.npy")])
    assert refused.value.field == "z" and "complex64" in refused.value.detail


def test_parse_input_option_needs_name_and_file():
    assert tensors.parse_input_option("x=a/b.npy")[0] == "x"
    for bad in ("x", "=a.npy", "x="):
        with pytest.raises(CliError):
            tensors.parse_input_option(bad)


def test_output_arrays_reshape_json_outputs():
    answer = {"outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}
    y = tensors.output_arrays(answer)["y"]
    assert y.dtype == np.float32 and y.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("text", "expected"), [("5M", 5 * 2**20), ("5MiB", 5 * 2**20), ("1g", 2**30), ("1048576", 2**20), ("64k", 65536)]
)
def test_sizes(text, expected):
    assert _size(text) == expected


@pytest.mark.parametrize("text", ["lots", "0", "-5M", ""])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(CliError) as refused:
        _size(text)
    assert refused.value.exit_code == 1


@pytest.mark.parametrize(
    ("status", "code"), [(400, 1), (415, 1), (401, 2), (403, 2), (404, 3), (409, 4), (413, 4), (429, 6), (503, 6)]
)
def test_exit_codes_of_http_statuses(status, code):
    assert exit_code_for_status(status) == code


def test_rate_limit_spreads_bytes_over_time():
    limit = RateLimit(10 * 2**20)  # 10 MiB/s
    started = time.monotonic()
    for _ in range(5):
        limit.take(2**20)
    # the first MiB goes at once, the other four wait 0.1 s each
    assert 0.35 <= time.monotonic() - started <= 1.0


def test_line_progress_prints_done_total_speed_and_time_left(capsys):
    progress = output.LineProgress(interval_s=0)
    progress.start("upload m.onnx", 100 * 2**20)
    progress.advance(25 * 2**20)
    line = capsys.readouterr().err.strip()
    assert line.startswith("upload m.onnx: 25.0 MiB of 100.0 MiB (25%), ")
    assert line.endswith(" s left")


def test_a_deployment_status_line_does_not_repeat_the_status():
    from conch_cli.main import _status_line

    assert _status_line(3, "stopped", "stopped") == "deployment 3: stopped"
    assert _status_line(3, "stopped", "Stopped.") == "deployment 3: stopped"
    assert (
        _status_line(3, "loading", "Triton is loading the model") == "deployment 3: loading Triton is loading the model"
    )
    assert _status_line(3, "ready", None) == "deployment 3: ready"


def test_a_text_file_as_an_input_is_said_to_need_numpy_save_naming_the_input(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("1, 2, 3\n")
    with pytest.raises(CliError) as refused:
        tensors.build_request([("x", notes)])
    assert refused.value.field == "x"
    assert refused.value.detail.startswith(
        f"{notes} is not a .npy file (input 'x'): give an array saved with numpy.save"
    )
    assert "pickle" not in refused.value.detail


def test_the_grpc_gateway_line_names_the_address_and_the_metadata_to_send():
    endpoints = {"gateway_grpc": "127.0.0.1:8002", "gateway_grpc_metadata": {"conch-deployment": "demo/orientation"}}
    assert _grpc_gateway_line(endpoints) == (
        "127.0.0.1:8002 (metadata conch-deployment: demo/orientation, authorization: Bearer <token>)"
    )
    assert _grpc_gateway_line({"gateway": "http://x"}) == ""  # a server without a gRPC gateway

"""The gRPC relay's message helpers: what the gateway reads of an inference request without decoding it whole,
checked against protobuf's own decoding of the same bytes."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2

from tritonserving.grpc_relay import (
    model_named,
    renamed_server_metadata,
    stream_answer_failed,
    stream_error_answer,
    summarize_infer_request,
)


def _request(
    model: str = "adder", shape: tuple[int, ...] = (3, 4), request_id: str = ""
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="x", datatype="FP32").shape.extend(shape)
    request.inputs.add(name="z", datatype="FP32").shape.extend([9])
    request.outputs.add(name="y")
    request.parameters["sequence_id"].int64_param = 7
    request.raw_input_contents.append(bytes(4 * 12))
    return request


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (_request(), ("adder", "", 3)),
        (_request("résumé", (-1, 4), "id-1"), ("résumé", "id-1", -1)),
        (service_pb2.ModelInferRequest(model_name="m"), ("m", "", None)),
        (service_pb2.ModelInferRequest(), ("", "", None)),
    ],
)
def test_the_summary_reads_the_model_the_id_and_the_first_dimension_of_the_first_input(request_, expected):
    summary = summarize_infer_request(request_.SerializeToString())
    assert (summary.model_name, summary.id, summary.batch) == expected


def test_a_model_name_given_twice_is_read_as_protobuf_reads_it_the_last_one():
    # a client could append a second model_name after the first: Triton would serve the last one
    raw = _request("adder").SerializeToString() + service_pb2.ModelInferRequest(model_name="other").SerializeToString()
    assert service_pb2.ModelInferRequest.FromString(raw).model_name == "other"
    assert summarize_infer_request(raw).model_name == "other"


@pytest.mark.parametrize("raw", [b"\x0a\x05ab", b"\xff", b"\x0b", b"\x0a\x02\xff\xfe"])
def test_bytes_that_are_not_a_message_are_refused(raw):
    with pytest.raises(ValueError):
        summarize_infer_request(raw)


def test_statistics_asked_without_a_name_are_asked_for_the_deployments_model():
    name, raw = model_named("ModelStatistics", b"", "adder")
    assert (name, service_pb2.ModelStatisticsRequest.FromString(raw).name) == ("adder", "adder")
    asked = service_pb2.ModelConfigRequest(name="other").SerializeToString()
    assert model_named("ModelConfig", asked, "adder") == ("other", asked)


def test_server_metadata_is_renamed_and_keeps_only_the_extensions_served():
    triton = service_pb2.ServerMetadataResponse(
        name="triton", version="2.51.0", extensions=["classification", "model_repository", "statistics"]
    ).SerializeToString()
    renamed = service_pb2.ServerMetadataResponse.FromString(
        renamed_server_metadata(triton, "adder", {"classification", "binary_tensor_data"})
    )
    assert (renamed.name, renamed.version, list(renamed.extensions)) == ("adder", "2.51.0", ["classification"])


def test_an_error_answer_of_a_stream_is_told_from_a_result_without_decoding():
    failed = stream_error_answer("no", request_id="7", model_name="adder")
    assert service_pb2.ModelStreamInferResponse.FromString(failed).infer_response.id == "7"
    result = service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse(id="7"))
    assert stream_answer_failed(failed) and not stream_answer_failed(result.SerializeToString())


def test_raw_input_contents_are_split_off_and_the_request_names_shared_memory_spans_instead():
    """Every raw tensor of a ModelInferRequest leaves the message (as views, in order); the request sent instead
    names a span of the region for each input that took raw bytes, aligned, and keeps inputs with `contents`."""
    from tritonserving.grpc_relay import shared_memory_infer_request, split_raw_input_contents

    request = service_pb2.ModelInferRequest(model_name="m", id="7")
    for name in ("a", "b"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 3])
        tensor.parameters["custom"].string_param = "kept"
    typed = request.inputs.add(name="c", datatype="INT32", shape=[1])
    typed.contents.int_contents.append(5)
    request.raw_input_contents.extend([bytes(range(12)), bytes(range(100, 110))])
    raw = request.SerializeToString()

    rest, tensors = split_raw_input_contents(raw)
    assert [bytes(t) for t in tensors] == [bytes(range(12)), bytes(range(100, 110))]
    sent = service_pb2.ModelInferRequest.FromString(shared_memory_infer_request(rest, [12, 10], "region-1", 128))
    assert not sent.raw_input_contents and sent.model_name == "m" and sent.id == "7"
    a, b, c = sent.inputs
    assert (a.parameters["shared_memory_region"].string_param, a.parameters["shared_memory_offset"].int64_param) == (
        "region-1",
        128,
    )
    assert a.parameters["shared_memory_byte_size"].int64_param == 12 and a.parameters["custom"].string_param == "kept"
    assert b.parameters["shared_memory_offset"].int64_param == 128 + 64  # 12 bytes, aligned to 64
    assert b.parameters["shared_memory_byte_size"].int64_param == 10
    assert "shared_memory_region" not in c.parameters and list(c.contents.int_contents) == [5]
    # contents that do not pair one to one with the inputs: sent as they came, for Triton to answer
    assert shared_memory_infer_request(rest, [12], "region-1", 0) is None
    with pytest.raises(ValueError):
        split_raw_input_contents(raw[:-3])

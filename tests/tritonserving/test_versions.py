"""Switching the versions one real Triton serves (tritonserving.versions), and the configuration helpers it uses."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from conch.errors import InvalidInput
from tests.tiny_models import add_constant
from tritonserving.client import ModelLoadError, TritonClient
from tritonserving.config import config_to_pbtxt, same_apart_from_versions, serving_versions
from tritonserving.server import allocate_ports, ensure_backend_directory, start_server, stop_server, wait_until_ready
from tritonserving.versions import load_versions, warm_up_version

API_KEY = "a" * 64


def _config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="adder", backend="onnxruntime", max_batch_size=4)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="y", data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return config


def test_serving_versions_sets_a_specific_policy_and_keeps_the_rest():
    # when
    config = serving_versions(_config(), [3, 1, 3])
    # then
    assert list(config.version_policy.specific.versions) == [1, 3]
    assert "version_policy {\n  specific {\n    versions: 1\n    versions: 3\n  }\n}" in config_to_pbtxt(config)
    assert same_apart_from_versions(config, _config())
    with pytest.raises(ValueError):
        serving_versions(_config(), [])


def test_configs_that_differ_in_more_than_versions_are_told_apart():
    # given
    other = _config()
    other.max_batch_size = 2
    # then
    assert not same_apart_from_versions(serving_versions(_config(), [1]), other)


@pytest.fixture
def server(tmp_path):
    """A Triton whose repository holds adder versions 1 (x + 1), 2 (x + 2) and 3 (not a model)."""
    repository = tmp_path / "repository"
    add_constant(repository / "adder" / "1" / "model.onnx", 1.0)
    add_constant(repository / "adder" / "2" / "model.onnx", 2.0)
    (repository / "adder" / "3").mkdir()
    (repository / "adder" / "3" / "model.onnx").write_bytes(b"not onnx")
    http_port, grpc_port, metrics_port = allocate_ports(3)
    process = start_server(
        server_id="conchtest-versions",
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=tmp_path / "triton.log",
        backend_root=ensure_backend_directory(tmp_path / "backends"),
        api_key=API_KEY,
    )
    try:
        wait_until_ready(process, timeout_s=60)
        yield process
    finally:
        stop_server(process.pid, process.create_time, timeout_s=10)


def _initialized_instances(server) -> int:
    return server.log_path.read_text().count("TRITONBACKEND_ModelInstanceInitialize")


@pytest.mark.triton
def test_a_version_added_warmed_and_kept_alone_fails_no_concurrent_request(server):
    # given version 1 served, and a client sending requests without naming a version all the time
    admin = TritonClient(server.http_url, timeout_s=60, api_key=API_KEY)
    load_versions(admin, _config(), [1])
    x = np.zeros((1, 4), np.float32)
    answers: list[object] = []
    stop = threading.Event()

    def keep_inferring() -> None:
        with TritonClient(server.http_url, timeout_s=60) as client:
            while not stop.is_set():
                try:
                    answers.append(float(client.infer_numpy("adder", {"x": x})["y"][0, 0]))
                except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                    answers.append(repr(exc))

    sender = threading.Thread(target=keep_inferring, daemon=True)
    sender.start()
    time.sleep(0.5)
    # when version 2 is added, warmed up by name, then served alone
    load_versions(admin, _config(), [1, 2])
    both = admin.ready_versions("adder")
    instances_with_both = _initialized_instances(server)
    warm_up_version(admin, "adder", 2, {"x": x})
    load_versions(admin, _config(), [2])
    time.sleep(0.5)
    stop.set()
    sender.join(timeout=30)
    # then no request failed, answers moved from version 1 to version 2 once, and version 2 was not re-created
    assert both == {1, 2}
    assert [a for a in answers if not isinstance(a, float)] == []
    changes = [a for i, a in enumerate(answers) if i == 0 or answers[i - 1] != a]
    assert changes == [1.0, 2.0]
    assert _initialized_instances(server) == instances_with_both == 2
    assert admin.ready_versions("adder") == {2}


@pytest.mark.triton
def test_a_version_triton_refuses_leaves_the_served_one_serving(server):
    # given version 1 served
    admin = TritonClient(server.http_url, timeout_s=60, api_key=API_KEY)
    load_versions(admin, _config(), [1])
    # when version 3 (not a model) is added
    with pytest.raises(ModelLoadError) as refused:
        load_versions(admin, _config(), [1, 3])
    # then Triton says why, and version 1 still answers
    assert "version 3" in refused.value.detail
    assert admin.ready_versions("adder") == {1}
    y = admin.infer_numpy("adder", {"x": np.zeros((1, 4), np.float32)})["y"]
    assert y.tolist() == [[1.0, 1.0, 1.0, 1.0]]


@pytest.mark.triton
def test_a_warm_up_the_model_fails_names_model_version(server):
    # given version 1 served
    admin = TritonClient(server.http_url, timeout_s=60, api_key=API_KEY)
    load_versions(admin, _config(), [1])
    # when it is warmed up with inputs it does not take
    with pytest.raises(InvalidInput) as failed:
        warm_up_version(admin, "adder", 1, {"x": np.zeros((1, 3), np.float32)})
    # then
    assert failed.value.field == "model_version"
    assert "version 1 failed its warm-up inference" in failed.value.detail

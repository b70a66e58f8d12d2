"""The build's scratch verify server (`tritonserving.smoke`) is locked down like every server Conch starts."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.real_models import classifier
from tritonserving.access import API_KEY_HEADER
from tritonserving.server import find_servers
from tritonserving.smoke import ScratchServer, run_smoke_inference

CONCH_SECRETS = {
    "DATABASE_URL": "postgres://conch:db-password-2b7c@db.internal:5432/conch",
    "DJANGO_SECRET_KEY": "django-secret-5e0d-not-for-triton",
    "CELERY_BROKER_URL": "redis://:broker-password-c3a1@redis.internal:6379/0",
}


def _repository(root: Path) -> Path:
    config = model_config_pb2.ModelConfig(name="orientation", backend="onnxruntime", max_batch_size=4)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    (root / "orientation" / "1").mkdir(parents=True)
    shutil.copyfile(classifier(), root / "orientation" / "1" / "model.onnx")
    (root / "orientation" / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root


def _load_status(http_url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"{http_url}/v2/repository/models/orientation/load", data=b"{}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_verify_server_refuses_keyless_loads_and_gets_no_secret(tmp_path, monkeypatch):
    # given: Conch's secrets in the environment, and a probe run while the scratch server has the model loaded
    for name, value in CONCH_SECRETS.items():
        monkeypatch.setenv(name, value)
    scratch = ScratchServer(work_dir=tmp_path / "work", server_id=f"conchtest-smoke-{uuid.uuid4().hex[:8]}")
    seen: dict[str, object] = {}

    def log(line: str) -> None:
        if not line.startswith("Triton loaded model"):
            return
        [server] = find_servers(scratch.server_id)
        processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        seen["keyless_load"] = _load_status(server.http_url, {})
        seen["keyed_load"] = _load_status(server.http_url, {API_KEY_HEADER: server.api_key})
        seen["environments"] = {proc.name(): proc.environ() for proc in processes}

    image = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)

    # when
    [outputs] = run_smoke_inference(
        scratch=scratch,
        repository=str(_repository(tmp_path / "repository")),
        environment={},
        model_name="orientation",
        input_sets=[{"x": image}],
        log=log,
    )

    # then
    assert (seen["keyless_load"], seen["keyed_load"]) == (403, 200)
    assert sorted(seen["environments"]) == ["triton_python_backend_stub", "tritonserver"]
    for environment in seen["environments"].values():
        assert not set(CONCH_SECRETS) & set(environment)
    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(outputs["fetch_name_0"], expected, atol=1e-4)
    assert find_servers(scratch.server_id) == []

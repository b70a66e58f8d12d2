"""The build's verify servers (`tritonserving.smoke`): the throwaway scratch server and the warm per-process one.

Both are locked down like every server Conch starts; the warm one is reused between verifications, unloads each
model, and is replaced (with one retry) when it misbehaves.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from conch.errors import InvalidInput, Unavailable
from tests.real_models import classifier
from tritonserving import smoke
from tritonserving.access import API_KEY_HEADER
from tritonserving.client import TritonClient
from tritonserving.server import find_servers, is_alive, is_stopped
from tritonserving.smoke import ScratchServer, VerifyServerSettings, run_smoke_inference

CONCH_SECRETS = {
    "DATABASE_URL": "postgres://conch:db-password-2b7c@db.internal:5432/conch",
    "DJANGO_SECRET_KEY": "django-secret-5e0d-not-for-triton",
    "CELERY_BROKER_URL": "redis://:broker-password-c3a1@redis.internal:6379/0",
}


def _repository(root: Path, name: str = "orientation", model_bytes: bytes | None = None) -> Path:
    config = model_config_pb2.ModelConfig(name=name, backend="onnxruntime", max_batch_size=4)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    (root / name / "1").mkdir(parents=True)
    if model_bytes is None:
        shutil.copyfile(classifier(), root / name / "1" / "model.onnx")
    else:
        (root / name / "1" / "model.onnx").write_bytes(model_bytes)
    (root / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root


def _post_status(http_url: str, path: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"{http_url}{path}", data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.triton
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
        load = "/v2/repository/models/orientation/load"
        seen["keyless_load"] = _post_status(server.http_url, load, {})
        seen["keyed_load"] = _post_status(server.http_url, load, {API_KEY_HEADER: server.api_key})
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


# --- the warm verify server -------------------------------------------------------------------------------------

IMAGE = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)


@pytest.fixture
def warm(tmp_path):
    """This process's warm verify server, with a test-only id; stopped afterwards."""
    settings = VerifyServerSettings(
        work_dir=tmp_path / "work", server_id_prefix=f"conchtest{os.getpid()}.verify.", start_timeout_s=60
    )
    server = smoke.get_verify_server(settings)
    yield server
    smoke.stop_verify_server()


def _expected() -> np.ndarray:
    return ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": IMAGE})[0]


def _verify(server, repository: Path, name: str = "orientation", **kwargs) -> dict[str, np.ndarray]:
    [outputs] = run_smoke_inference(
        scratch=server,
        repository=str(repository),
        environment={},
        model_name=name,
        input_sets=[{"x": IMAGE}],
        log=kwargs.pop("log", lambda line: None),
        **kwargs,
    )
    return outputs


def _busy_models(server) -> list[dict]:
    process = server.process
    with TritonClient(process.http_url, api_key=process.api_key) as client:
        return [entry for entry in client.repository_index() if entry.get("state") in ("LOADING", "READY", "UNLOADING")]


@pytest.mark.triton
def test_the_warm_server_verifies_two_models_in_a_row_and_unloads_each(warm, tmp_path):
    # given a repository with the classifier
    repository = _repository(tmp_path / "repository")

    # when two verifications run, with a pause for the background clean-up after each
    first = _verify(warm, repository, label="v1-a1")
    first_process = warm.process
    assert warm.wait_idle()
    left_after_first = (_busy_models(warm), sorted(warm.scratch_repository.iterdir()))
    second = _verify(warm, repository, label="v2-a1")
    assert warm.wait_idle()

    # then both ran on the same server process, found the model's real outputs, and left nothing loaded or copied
    assert warm.process == first_process
    assert [server.pid for server in find_servers(first_process.server_id)] == [first_process.pid]
    assert first_process.server_id.startswith(f"conchtest{os.getpid()}.verify.{os.getpid()}-")
    for outputs in (first, second):
        assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)
    assert left_after_first == ([], [])
    assert (_busy_models(warm), sorted(warm.scratch_repository.iterdir())) == ([], [])


@pytest.mark.triton
def test_the_warm_server_loads_the_copy_under_its_own_name_with_the_repository_config(warm, tmp_path):
    # given a repository whose config.pbtxt sets the batch size, and a probe of what Triton serves during the load
    repository = _repository(tmp_path / "repository")
    seen = {}

    def log(line: str) -> None:
        if line.startswith("Triton loaded model "):
            name = line.split()[3]
            with TritonClient(warm.process.http_url, api_key=warm.process.api_key) as client:
                seen[name] = client.model_config(name)

    # when
    _verify(warm, repository, label="v7-a2", log=log)

    # then the copy was loaded as <model>--<label>-<n> with the repository's configuration, taken as given
    [(name, config)] = seen.items()
    assert "--disable-auto-complete-config" in psutil.Process(warm.process.pid).cmdline()
    assert name == "orientation--v7-a2-1"
    assert (config["name"], config["max_batch_size"], config["backend"]) == (name, 4, "onnxruntime")
    assert [tensor["name"] for tensor in config["input"]] == ["x"]


@pytest.mark.triton
def test_the_warm_server_refuses_keyless_loads_and_gets_no_secret(warm, tmp_path, monkeypatch):
    # given Conch's secrets and storage credentials in the environment, and a probe run while a model is loaded
    for name, value in {**CONCH_SECRETS, "AWS_SECRET_ACCESS_KEY": "aws-secret-9f2e"}.items():
        monkeypatch.setenv(name, value)
    repository = _repository(tmp_path / "repository")
    seen: dict[str, object] = {}

    def log(line: str) -> None:
        if not line.startswith("Triton loaded model "):
            return
        process = warm.process
        load = f"/v2/repository/models/{line.split()[3]}/load"
        seen["keyless_load"] = _post_status(process.http_url, load, {})
        seen["keyless_index"] = _post_status(process.http_url, "/v2/repository/index", {})
        seen["keyed_index"] = _post_status(process.http_url, "/v2/repository/index", {API_KEY_HEADER: process.api_key})
        processes = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        seen["environments"] = {proc.name(): proc.environ() for proc in processes}

    # when
    outputs = _verify(warm, repository, log=log)

    # then
    assert (seen["keyless_load"], seen["keyless_index"], seen["keyed_index"]) == (403, 403, 200)
    assert sorted(seen["environments"]) == ["triton_python_backend_stub", "tritonserver"]
    for environment in seen["environments"].values():
        assert not {*CONCH_SECRETS, "AWS_SECRET_ACCESS_KEY"} & set(environment)
    assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)


@pytest.mark.triton
def test_a_killed_warm_server_is_replaced_by_the_next_verification(warm, tmp_path):
    # given a warm server that verified once and was then killed
    repository = _repository(tmp_path / "repository")
    _verify(warm, repository)
    killed = warm.process
    os.kill(killed.pid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: under load the process can take a moment to be gone
    deadline = time.monotonic() + 10
    while is_alive(killed.pid, killed.create_time) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines: list[str] = []

    # when the next verification runs
    outputs = _verify(warm, repository, log=lines.append)

    # then it ran on a fresh server, and said so
    assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)
    assert warm.process.pid != killed.pid and warm.process.server_id != killed.server_id
    assert not is_alive(killed.pid, killed.create_time)
    assert f"verify server {killed.server_id} (pid {killed.pid}) is replaced: it exited" in lines
    assert find_servers(killed.server_id) == []


@pytest.mark.triton
def test_a_warm_server_that_does_not_answer_is_replaced(warm, tmp_path, monkeypatch):
    # given a warm server that verified once and then hangs (stopped, not dead), and a short liveness check
    monkeypatch.setattr(smoke, "HEALTH_TIMEOUT_S", 1.0)
    repository = _repository(tmp_path / "repository")
    _verify(warm, repository)
    assert warm.wait_idle()
    hung = warm.process
    os.kill(hung.pid, signal.SIGSTOP)
    # A group stop completes only once every thread has stopped (one in uninterruptible sleep delays it, and the
    # others keep answering meanwhile): wait until the process as a whole is stopped.
    deadline = time.monotonic() + 30
    while not is_stopped(hung.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert is_stopped(hung.pid)
    lines: list[str] = []

    # when the next verification runs
    outputs = _verify(warm, repository, log=lines.append)

    # then the hung server was stopped and a fresh one verified the model
    assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)
    replaced = f"verify server {hung.server_id} (pid {hung.pid}) is replaced: it did not answer its liveness check"
    assert any(line.startswith(replaced) for line in lines), lines[:3]
    assert not is_alive(hung.pid, hung.create_time)
    assert warm.process.pid != hung.pid


@pytest.mark.triton
def test_a_model_that_fails_to_load_fails_its_verification_and_leaves_the_server_usable(warm, tmp_path):
    # given a repository holding a truncated copy of the classifier next to the real one
    repository = _repository(tmp_path / "repository")
    _repository(repository, name="broken", model_bytes=classifier().read_bytes()[:100_000])
    warm.start()
    server = warm.process
    lines: list[str] = []

    # when the broken model is verified, then the good one
    with pytest.raises(InvalidInput) as failure:
        _verify(warm, repository, name="broken", log=lines.append)
    outputs = _verify(warm, repository)
    assert warm.wait_idle()

    # then the first failed with Triton's reason and its log lines, and the second ran on the same server
    assert failure.value.field == "file"
    assert failure.value.detail.startswith("Triton could not load the model: ")
    assert "Protobuf parsing failed" in failure.value.detail
    assert any(line.startswith("triton: ") for line in lines)
    assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)
    assert warm.process == server
    assert (_busy_models(warm), sorted(warm.scratch_repository.iterdir())) == ([], [])


@pytest.mark.triton
def test_a_server_that_dies_during_a_verification_is_replaced_and_the_verification_retried_once(warm, tmp_path):
    # given a copy step that kills the server it copies for, the first time only
    repository = _repository(tmp_path / "repository")
    killed = []

    def stage(target: Path) -> None:
        shutil.copytree(repository / "orientation", target, dirs_exist_ok=True)
        if not killed:
            killed.append(warm.process)
            os.kill(warm.process.pid, signal.SIGKILL)

    lines: list[str] = []

    # when
    outputs = _verify(warm, repository, stage=stage, log=lines.append)

    # then the load failed on the dead server, and the second try ran on a fresh one
    assert np.allclose(outputs["fetch_name_0"], _expected(), atol=1e-4)
    assert warm.process.pid != killed[0].pid
    assert any("starting a fresh verify server and trying once more" in line for line in lines)


@pytest.mark.triton
def test_a_server_that_dies_twice_makes_the_verification_unavailable(warm, tmp_path):
    # given a copy step that kills the server every time
    repository = _repository(tmp_path / "repository")

    def stage(target: Path) -> None:
        shutil.copytree(repository / "orientation", target, dirs_exist_ok=True)
        os.kill(warm.process.pid, signal.SIGKILL)

    # when / then: a transient error (the build retries), not a verdict on the model
    with pytest.raises(Unavailable, match="failed twice in a row"):
        _verify(warm, repository, stage=stage)
    assert warm.process is None


@pytest.mark.triton
def test_a_warm_server_needs_a_local_folder_or_a_copy_step(warm):
    with pytest.raises(InvalidInput) as failure:
        _verify(warm, "s3://http://127.0.0.1:9/bucket/prefix")
    assert failure.value.field == "repository"


def test_a_forked_child_does_not_reuse_its_parents_warm_server(warm):
    # given the parent's server object (not started)
    parent = smoke.current_verify_server()
    assert parent is warm

    # when a child process forks and asks for the server with the same settings
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        own = smoke.get_verify_server(warm.settings)
        ok = smoke.current_verify_server() is own and own is not parent and own.owner_pid == os.getpid()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)

    # then it got its own, and the parent's is still the parent's
    assert os.waitstatus_to_exitcode(status) == 0
    assert smoke.current_verify_server() is warm


@pytest.mark.triton
def test_new_settings_replace_the_warm_server(warm, tmp_path):
    # given a started warm server
    first = warm.start()

    # when the settings change (another folder)
    other = smoke.get_verify_server(VerifyServerSettings(work_dir=tmp_path / "other", server_id_prefix="conchtest-x."))

    # then the old one is stopped and its scratch folder gone
    assert other is not warm and smoke.current_verify_server() is other
    assert not is_alive(first.pid, first.create_time)
    assert list((tmp_path / "work" / "verify").iterdir()) == []

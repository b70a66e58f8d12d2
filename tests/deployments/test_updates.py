"""Hot version updates: PATCH /api/v1/deployments/{id}/ {"model_version": id} moves a running deployment to another
built version of its model without restarting its Triton, and rolls back when a server refuses the new version.

Tasks run inline (eager Celery, on commit); deployments are real tritonserver processes (local runtime) serving
`adder`, whose version 1 adds 1 and version 2 adds 2, so an answer tells which version served it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from builds.services import latest_config_pbtxt, served_repository_prefix
from deployments import services
from deployments.models import Deployment
from deployments.runtimes.local import LocalServerState, triton_api_key
from deployments.services.requests import DeploymentRequest
from models_registry.choices import VersionStatus
from models_registry.storage import get_object_store
from tenancy.models import AuditEntry
from tests import real_models
from tests.deployments.conftest import write_adder_versions, write_built_version
from tests.flows import deploy_ready
from tests.tiny_models import add_constant
from tritonserving import server as triton_server
from tritonserving.client import TritonClient
from tritonserving.config import config_from_pbtxt
from tritonserving.versions import load_versions, wait_until_ready_again

pytestmark = pytest.mark.django_db

X = np.zeros((1, 4), np.float32)


@pytest.fixture
def adder_versions(alice, tmp_path):
    """Built versions 1 (y = x + 1) and 2 (y = x + 2) of model `adder`."""
    return write_adder_versions(alice.team, tmp_path)


def _patch(caller, deployment_id: int, body: dict, capture):
    with capture(execute=True):
        return caller.client.patch(f"/api/v1/deployments/{deployment_id}/", body, format="json")


def _server(row: Deployment) -> LocalServerState:
    row.refresh_from_db()
    return LocalServerState.from_state(row.runtime_state)


def _admin(row: Deployment) -> TritonClient:
    """A client of the deployment's Triton with its key (for the repository API)."""
    server = _server(row)
    return TritonClient(services.internal_url(row), timeout_s=60, api_key=triton_api_key(server.server_id))


def _repository_versions(row: Deployment) -> list[int]:
    key = f"{services.deployment_repository_prefix(row.pk)}/adder/config.pbtxt"
    config = config_from_pbtxt(get_object_store().read_bytes(key).decode())
    return list(config.version_policy.specific.versions)


@pytest.mark.e2e
def test_an_update_under_continuous_load_fails_no_request_and_restarts_nothing(
    alice, adder_versions, eager_tasks, django_capture_on_commit_callbacks
):
    # given version 1 deployed and ready, and a client sending inferences all the time
    v1, v2 = adder_versions
    d = deploy_ready(alice, django_capture_on_commit_callbacks, v1.pk)
    row = Deployment.objects.get(pk=d["id"])
    before = _server(row)
    answers: list[object] = []
    stop = threading.Event()

    def keep_inferring() -> None:
        with TritonClient(services.internal_url(row), timeout_s=60) as client:
            while not stop.is_set():
                try:
                    answers.append(float(client.infer_numpy("adder", {"x": X})["y"][0, 0]))
                except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                    answers.append(f"{type(exc).__name__}: {exc}")

    sender = threading.Thread(target=keep_inferring, daemon=True)
    sender.start()
    time.sleep(0.5)
    # when the deployment is moved to version 2
    response = _patch(alice, row.pk, {"model_version": v2.pk}, django_capture_on_commit_callbacks)
    time.sleep(0.5)
    stop.set()
    sender.join(timeout=60)
    # then it was accepted, no request failed, answers moved from version 1 to 2 once, on the same process
    assert response.status_code == 202, response.content
    failures = [a for a in answers if not isinstance(a, float)]
    assert failures == [] and len(answers) > 10
    assert [a for i, a in enumerate(answers) if i == 0 or answers[i - 1] != a] == [1.0, 2.0]
    after = _server(row)
    assert (after.pid, after.create_time) == (before.pid, before.create_time)
    # and the deployment records version 2, its build, and serves it alone, from its own repository too
    shown = alice.client.get(f"/api/v1/deployments/{row.pk}/").json()
    assert (shown["status"], shown["update_status"], shown["update_error"]) == ("ready", "succeeded", "")
    assert (shown["model_version"], shown["model_version_number"]) == (v2.pk, 2)
    assert shown["repository_prefix"] == served_repository_prefix(v2)
    assert shown["target_model_version"] is None
    updated = AuditEntry.objects.get(action="deployment.version_updated", object_id=str(row.pk))
    assert (updated.before["number"], updated.after["number"], updated.source) == (1, 2, "task")
    assert _admin(row).ready_versions("adder") == {2}
    assert _repository_versions(row) == [2]
    # and its repository's bytes, measured after the update, are what the store holds: both versions' files (version
    # 1's stay until the next update) and the configuration
    row.refresh_from_db()
    store = get_object_store()
    held = sum(store.size(key) for key in store.list_keys(f"{services.deployment_repository_prefix(row.pk)}/"))
    assert row.repository_bytes == held > v1.source_size_bytes + v2.source_size_bytes
    # when its Triton dies and reconcile restarts it
    os.kill(after.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while triton_server.is_alive(after.pid, after.create_time) and time.monotonic() < deadline:
        time.sleep(0.1)
    with django_capture_on_commit_callbacks(execute=True):
        services.reconcile_deployments()
    # then the new server serves version 2
    row.refresh_from_db()
    assert row.status == "ready", row.error
    assert _server(row).pid != after.pid
    admin = _admin(row)
    assert admin.ready_versions("adder") == {2}
    assert admin.infer_numpy("adder", {"x": X})["y"].tolist() == [[2.0] * 4]
    # when a server serves the old version (as a pod started mid-update would), reconcile moves it back to 2
    load_versions(admin, config_from_pbtxt(latest_config_pbtxt(v1)), [1])
    wait_until_ready_again(admin, timeout_s=30)
    assert admin.ready_versions("adder") == {1}
    services.reconcile_deployments()
    assert admin.ready_versions("adder") == {2}
    services.stop_deployment(deployment_id=row.pk)
    # and once stopped its repository no longer counts
    row.refresh_from_db()
    assert row.repository_bytes == 0


@pytest.mark.triton
def test_a_version_triton_refuses_rolls_back_and_the_old_one_keeps_serving(
    alice, adder_versions, eager_tasks, django_capture_on_commit_callbacks
):
    # given version 1 deployed, and a version 2 that built but whose model file Triton cannot load
    v1, v2 = adder_versions
    get_object_store().put_bytes(f"{served_repository_prefix(v2)}/adder/2/model.onnx", b"not onnx")
    d = deploy_ready(alice, django_capture_on_commit_callbacks, v1.pk)
    row = Deployment.objects.get(pk=d["id"])
    before = _server(row)
    # when the deployment is moved to version 2
    response = _patch(alice, row.pk, {"model_version": v2.pk}, django_capture_on_commit_callbacks)
    # then the request was accepted, the update failed naming the server and Triton's message
    assert response.status_code == 202, response.content
    shown = alice.client.get(f"/api/v1/deployments/{row.pk}/").json()
    assert (shown["status"], shown["update_status"]) == ("ready", "failed")
    assert shown["update_error"].startswith(f"Server {before.server_id} could not serve version 2: ")
    assert "version 2" in shown["update_error"] and "model.onnx" in shown["update_error"]
    # and the deployment still serves version 1 alone, on the same process, from an unchanged record
    assert (shown["model_version"], shown["repository_prefix"]) == (v1.pk, served_repository_prefix(v1))
    assert _server(row).pid == before.pid
    admin = _admin(row)
    assert admin.ready_versions("adder") == {1}
    assert admin.infer_numpy("adder", {"x": X})["y"].tolist() == [[1.0] * 4]
    assert _repository_versions(row) == [1]
    # and the audit log holds alice's request (through the API) and the failure (the update task's)
    entries = AuditEntry.objects.filter(object_id=str(row.pk), action__startswith="deployment.version_update")
    assert [(e.action, e.actor, e.source, e.source_detail) for e in entries.order_by("id")] == [
        ("deployment.version_update_requested", "alice", "api", f"PATCH /api/v1/deployments/{row.pk}/"),
        ("deployment.version_update_failed", "system", "task", "deployments.update_model_version"),
    ]
    services.stop_deployment(deployment_id=row.pk)


def _bad_requests(alice, adder_versions, tmp_path):
    other = write_built_version(alice.team, "other", add_constant(tmp_path / "o.onnx", 0.0))
    unbuilt = write_built_version(alice.team, "adder", add_constant(tmp_path / "v3.onnx", 3.0))
    unbuilt.status = VersionStatus.BUILDING
    unbuilt.save(update_fields=["status"])
    return {"other": other.pk, "unbuilt": unbuilt.pk}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model_version": "other"}, 400, "model_version"),
        ({"model_version": "unbuilt"}, 409, "model_version"),
        ({"model_version": 999999}, 404, "model_version"),
        ({"model_version": "two"}, 400, "model_version"),
        ({"model_version": None}, 400, "model_version"),
        ({"replicas": 2}, 400, "replicas"),
        ({}, 400, "request"),
    ],
)
def test_bad_updates_name_the_field(alice, adder_versions, tmp_path, body, status, field):
    # given a deployment of version 1 (not started) and versions it cannot move to
    v1, _ = adder_versions
    row = services.create_deployment(
        user=alice.user, request=DeploymentRequest(team_slug="acme", name="web", model_version_id=v1.pk)
    )
    ids = _bad_requests(alice, adder_versions, tmp_path)
    body = {key: ids.get(value, value) if isinstance(value, str) else value for key, value in body.items()}
    # when
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", body, format="json")
    # then
    assert response.status_code == status, response.content
    assert response.json()["field"] == field
    row.refresh_from_db()
    assert (row.model_version_id, row.update_status) == (v1.pk, "")


def test_an_update_of_a_deployment_that_is_not_ready_gets_409(alice, adder_versions):
    # given a deployment that has not started
    v1, v2 = adder_versions
    row = services.create_deployment(
        user=alice.user, request=DeploymentRequest(team_slug="acme", name="web", model_version_id=v1.pk)
    )
    # when
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": v2.pk}, format="json")
    # then
    assert response.status_code == 409
    assert response.json()["field"] == "model_version"
    assert "only a ready deployment" in response.json()["detail"]


def test_the_served_version_changes_nothing_and_other_teams_cannot_update(alice, bob, adder_versions):
    # given a deployment of version 1
    v1, v2 = adder_versions
    row = services.create_deployment(
        user=alice.user, request=DeploymentRequest(team_slug="acme", name="web", model_version_id=v1.pk)
    )
    # when it is asked for version 1 again, then nothing is queued
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": v1.pk}, format="json")
    assert response.status_code == 202
    assert response.json()["update_status"] == ""
    # when another team asks, then the deployment is not found
    response = bob.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": v2.pk}, format="json")
    assert response.status_code == 404
    # and a version of a model the classifier's team member cannot see is not found either
    foreign = write_built_version(bob.team, "adder", real_models.classifier())
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": foreign.pk}, format="json")
    assert (response.status_code, response.json()["field"]) == (404, "model_version")

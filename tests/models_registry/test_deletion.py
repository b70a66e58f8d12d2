"""Deleting models and versions: refused while deployments use them or builds run; otherwise their objects leave
the S3 store (a real S3 protocol server), their rows go and their storage is freed; a store failure half way leaves
them `deleting` for a retry or the sweeper."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.utils import timezone

from builds.models import BuildRepository, BuildStep
from builds.services import (
    current_build,
    latest_config_pbtxt,
    reset_steps,
    served_repository_prefix,
    sweep_stalled_versions,
)
from builds.services.storage import reserve_repository_storage
from conch.errors import Conflict, InUse
from deployments import services as deployments
from deployments.models import Deployment
from deployments.services.repository import deployment_repository_prefix, ensure_deployment_repository
from deployments.services.requests import DeploymentRequest
from models_registry import services as registry
from models_registry.deletion import delete_model_version, finish_stalled_deletions
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.storage import get_object_store
from tenancy.models import AuditEntry
from tenancy.quotas import set_quota, team_usage
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.tiny_models import add_constant, onnx_like

pytestmark = pytest.mark.django_db


@pytest.fixture
def s3(settings, s3_server, s3_bucket, s3_client):
    """Conch's object store is a bucket on the S3 protocol server; returns a function listing the bucket's keys."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key

    def keys(prefix: str = "") -> list[str]:
        listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"conch/{prefix}").get("Contents", [])
        return sorted(item["Key"][len("conch/") :] for item in listed)

    return keys


def _built(caller, tmp_path, name: str = "adder") -> ModelVersion:
    """A built version of `name` as a build leaves it: source, sample inputs, a repository (counted), step rows."""
    number = RegisteredModel.objects.filter(team=caller.team, name=name).first()
    number = number.versions.count() + 1 if number else 1
    version = write_built_version(caller.team, name, add_constant(tmp_path / f"{name}-{number}.onnx", float(number)))
    store = get_object_store()
    store.put_bytes(registry.sample_inputs_key(model_id=version.model_id, number=version.number), b"npz")
    size = version.source_size_bytes + len(latest_config_pbtxt(version).encode())
    reserve_repository_storage(version=version, attempt=1, prefix=served_repository_prefix(version), size_bytes=size)
    reset_steps(build=current_build(version))
    return version


def _storage_used(team) -> int:
    return next(line.used for line in team_usage(team=team) if line.field == "storage_bytes")


def _deploy(caller, version, name: str) -> Deployment:
    """A deployment of `version`, left `pending` (its start task is only queued, never run, in these tests)."""
    return deployments.create_deployment(
        user=caller.user, request=DeploymentRequest(team_slug=caller.team.slug, name=name, model_version_id=version.pk)
    )


def test_deleting_a_version_removes_its_objects_and_row_and_frees_its_storage(alice, s3, tmp_path):
    # given two built versions of one model in the S3 store, each with an upload, samples and a build repository
    first, second = _built(alice, tmp_path), _built(alice, tmp_path)
    root = f"models/{first.model_id}/versions/"
    assert s3(f"{root}1/") == [
        f"{served_repository_prefix(first)}/adder/1/model.onnx",
        f"{served_repository_prefix(first)}/adder/config.pbtxt",
        f"{root}1/source/model.onnx",
        f"{root}1/source/sample_inputs.npz",
    ]
    each = first.source_size_bytes * 2 + len(latest_config_pbtxt(first).encode())
    assert _storage_used(alice.team) == 2 * each
    # when the first is deleted
    response = alice.client.delete(f"/api/v1/versions/{first.pk}/")
    # then its objects are gone from the bucket, the other version's stay
    assert response.status_code == 204, response.content
    assert s3(f"{root}1/") == []
    assert len(s3(f"{root}2/")) == 4
    # and its rows (version, build steps, build repository) are gone, freeing its storage
    assert not ModelVersion.objects.filter(pk=first.pk).exists()
    assert not BuildStep.objects.filter(build__version_id=first.pk).exists()
    assert list(BuildRepository.objects.values_list("version_id", flat=True)) == [second.pk]
    assert _storage_used(alice.team) == each
    assert alice.client.get(f"/api/v1/versions/{first.pk}/").status_code == 404
    # and the audit log says who deleted it
    entry = AuditEntry.objects.get(action="version.deleted")
    assert (entry.actor, entry.object_id, entry.team_slug) == ("alice", str(first.pk), "acme")


def test_a_version_served_by_a_deployment_is_refused_with_409_naming_it(alice, s3, tmp_path):
    # given a version served by two deployments not stopped, and one stopped
    version = _built(alice, tmp_path)
    web = _deploy(alice, version, "web")
    batch = _deploy(alice, version, "batch")
    Deployment.objects.filter(pk=batch.pk).update(status="ready")
    old = _deploy(alice, version, "old")
    Deployment.objects.filter(pk=old.pk).update(status="stopped")
    # when
    response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
    # then
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"Model version {version.pk} (adder version 1) is used by 2 deployments not stopped: "
        f"'web' (id {web.pk}), 'batch' (id {batch.pk}). Stop them (DELETE /api/v1/deployments/{{id}}/), or move "
        "them to another version, then delete again.",
        "field": "deployments",
        "deployments": [{"id": web.pk, "name": "web"}, {"id": batch.pk, "name": "batch"}],
    }
    # and nothing was deleted
    version.refresh_from_db()
    assert version.status == "built"
    assert len(s3(f"models/{version.model_id}/")) == 4
    assert Deployment.objects.count() == 3


def test_a_version_whose_deployments_are_stopping_says_to_wait_for_them(alice, s3, tmp_path):
    # given a version whose only deployment was just told to stop
    version = _built(alice, tmp_path)
    web = _deploy(alice, version, "web")
    Deployment.objects.filter(pk=web.pk).update(status="stopping")
    # when it is deleted at once
    response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
    # then refused, saying the deployment is stopping and to delete again once it has stopped
    assert response.status_code == 409
    assert response.json()["detail"].endswith(
        f"used by 1 deployment not stopped: 'web' (id {web.pk}, stopping). They are stopping: delete again once "
        "they have stopped (a few seconds)."
    )


def test_a_version_a_deployment_is_being_updated_to_is_in_use(alice, s3, tmp_path):
    # given a deployment of version 1 whose hot update to version 2 is queued
    first, second = _built(alice, tmp_path), _built(alice, tmp_path)
    web = _deploy(alice, first, "web")
    Deployment.objects.filter(pk=web.pk).update(target_model_version=second, update_status="queued")
    # when
    response = alice.client.delete(f"/api/v1/versions/{second.pk}/")
    # then
    assert response.status_code == 409
    assert response.json()["deployments"] == [{"id": web.pk, "name": "web"}]


def test_stopped_deployments_of_a_version_go_with_it_repository_and_row(alice, s3, tmp_path):
    # given a stopped deployment of the version whose own repository copy was left in the store
    version = _built(alice, tmp_path)
    stopped = _deploy(alice, version, "gone")
    ensure_deployment_repository(deployment=stopped)
    Deployment.objects.filter(pk=stopped.pk).update(status="stopped", desired_state="stopped")
    assert len(s3(deployment_repository_prefix(stopped.pk) + "/")) == 2
    # when
    response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
    # then
    assert response.status_code == 204, response.content
    assert s3("deployments/") == []
    assert not Deployment.objects.filter(pk=stopped.pk).exists()
    assert s3() == []


def test_a_version_uploading_or_building_is_refused_with_409_saying_to_wait(alice, s3, tmp_path):
    version = _built(alice, tmp_path)
    for status, words in (("queued", "its build is queued"), ("building", "it is being built")):
        # given
        ModelVersion.objects.filter(pk=version.pk).update(status=status)
        # when
        response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
        # then
        assert response.status_code == 409
        assert response.json() == {
            "detail": f"Model version {version.pk} (adder version 1) cannot be deleted now: version 1 is "
            f"'{status}' and {words}; wait for the build to finish, then delete again.",
            "field": "status",
        }
    assert len(s3(f"models/{version.model_id}/")) == 4


def test_deleting_needs_the_developer_role_and_the_models_write_scope(alice, bob, s3, tmp_path):
    # given
    version = _built(alice, tmp_path)
    viewer = make_caller("vera", "acme", role="viewer")
    reader = make_caller("rita", "acme", scopes=["read", "deployments:write"])
    # when / then a viewer is refused, naming the role
    response = viewer.client.delete(f"/api/v1/versions/{version.pk}/")
    assert response.status_code == 403
    assert response.json()["detail"] == (
        "Deleting a model version needs the developer role in team 'acme'; you are a viewer."
    )
    response = viewer.client.delete(f"/api/v1/models/{version.model_id}/")
    assert response.status_code == 403
    assert "Deleting a model needs the developer role" in response.json()["detail"]
    # and a token without models:write, naming the scope
    response = reader.client.delete(f"/api/v1/versions/{version.pk}/")
    assert response.status_code == 403
    assert "needs a token with the 'models:write' scope" in response.json()["detail"]
    # and another team sees nothing
    assert bob.client.delete(f"/api/v1/versions/{version.pk}/").status_code == 404
    assert bob.client.delete(f"/api/v1/models/{version.model_id}/").status_code == 404
    assert ModelVersion.objects.get(pk=version.pk).status == "built"
    assert len(s3(f"models/{version.model_id}/")) == 4


def test_deleting_a_model_removes_every_version_and_frees_its_place_in_the_quota(alice, s3, tmp_path):
    # given a model with two versions and a stopped deployment, beside another model, under a limit of 2 models
    set_quota(team=alice.team, limits={"models": 2})
    first, _ = _built(alice, tmp_path), _built(alice, tmp_path)
    other = _built(alice, tmp_path, name="other")
    stopped = _deploy(alice, first, "gone")
    Deployment.objects.filter(pk=stopped.pk).update(status="stopped")
    refused = alice.client.post("/api/v1/models/", {"name": "third", "team": "acme"}, format="json")
    assert refused.status_code == 409
    # when
    response = alice.client.delete(f"/api/v1/models/{first.model_id}/")
    # then its objects, versions and deployments are gone; the other model is untouched
    assert response.status_code == 204, response.content
    assert s3(f"models/{first.model_id}/") == []
    assert len(s3(f"models/{other.model_id}/")) == 4
    assert list(RegisteredModel.objects.values_list("name", flat=True)) == ["other"]
    assert AuditEntry.objects.filter(action="model.deleted", object_id=str(first.model_id), actor="alice").exists()
    assert list(ModelVersion.objects.values_list("pk", flat=True)) == [other.pk]
    assert not Deployment.objects.exists()
    assert _storage_used(alice.team) == other.source_size_bytes * 2 + len(latest_config_pbtxt(other).encode())
    # and a model fits again
    assert alice.client.post("/api/v1/models/", {"name": "third", "team": "acme"}, format="json").status_code == 201


def test_a_model_with_a_version_in_use_is_refused_naming_the_deployment(alice, s3, tmp_path):
    # given
    _, second = _built(alice, tmp_path), _built(alice, tmp_path)
    web = _deploy(alice, second, "web")
    # when
    response = alice.client.delete(f"/api/v1/models/{second.model_id}/")
    # then
    assert response.status_code == 409
    assert response.json()["detail"].startswith(
        f"Model 'adder' is used by 1 deployment not stopped: 'web' (id {web.pk})."
    )
    assert response.json()["deployments"] == [{"id": web.pk, "name": "web"}]
    assert RegisteredModel.objects.get(pk=second.model_id).deletion_requested_at is None
    assert set(ModelVersion.objects.values_list("status", flat=True)) == {"built"}
    assert len(s3(f"models/{second.model_id}/")) == 8


def test_a_store_failure_leaves_the_version_deleting_and_a_retry_finishes_it(alice, s3, tmp_path, settings):
    # given a version, and an object store that fails (its bucket is not there)
    version = _built(alice, tmp_path)
    used = _storage_used(alice.team)
    real_url = settings.CONCH_STORAGE_URL
    settings.CONCH_STORAGE_URL = "s3://conch-missing-bucket/conch"
    # when
    response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
    # then the answer says what happened and what to do; the row stays, marked, still counted
    assert response.status_code == 503
    assert response.json()["detail"].startswith(f"Model version {version.pk} is marked 'deleting' but the object ")
    assert "send the DELETE again, or the sweeper finishes it" in response.json()["detail"]
    version.refresh_from_db()
    assert version.status == "deleting"
    assert _storage_used(alice.team) == used
    # and nothing new may use it meanwhile
    response = alice.client.post(
        "/api/v1/deployments/", {"team": "acme", "name": "late", "model_version": version.pk}, format="json"
    )
    assert (response.status_code, response.json()["field"]) == (409, "model_version")
    response = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild", format="json")
    assert response.status_code == 409
    # when the store is back and the DELETE is sent again
    settings.CONCH_STORAGE_URL = real_url
    response = alice.client.delete(f"/api/v1/versions/{version.pk}/")
    # then it is finished
    assert response.status_code == 204, response.content
    assert s3() == []
    assert not ModelVersion.objects.filter(pk=version.pk).exists()
    assert _storage_used(alice.team) == 0


def test_the_sweeper_finishes_a_model_deletion_the_store_interrupted(alice, s3, tmp_path, settings):
    # given a model whose deletion failed at the store
    version = _built(alice, tmp_path)
    real_url = settings.CONCH_STORAGE_URL
    settings.CONCH_STORAGE_URL = "s3://conch-missing-bucket/conch"
    assert alice.client.delete(f"/api/v1/models/{version.model_id}/").status_code == 503
    assert ModelVersion.objects.get(pk=version.pk).status == "deleting"
    # and no upload may start on it meanwhile
    settings.CONCH_STORAGE_URL = real_url
    response = alice.client.post(
        f"/api/v1/models/{version.model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"x" * 10))}
    )
    assert (response.status_code, response.json()["field"]) == (409, "model")
    # when the sweeper runs before the retry delay, nothing happens; after it, the deletion is finished
    assert finish_stalled_deletions(started_before=timezone.now() - timedelta(seconds=60)) == 0
    RegisteredModel.objects.filter(pk=version.model_id).update(
        deletion_requested_at=timezone.now() - timedelta(seconds=settings.CONCH_DELETION_RETRY_SECONDS + 1)
    )
    ModelVersion.objects.filter(pk=version.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    counts = sweep_stalled_versions()
    # then
    assert counts["finished_deletions"] == 1
    assert not RegisteredModel.objects.exists()
    assert s3() == []


def test_a_deleted_versions_number_is_never_given_again(alice, s3, tmp_path):
    # given versions 1 and 2, the latest deleted
    _, second = _built(alice, tmp_path), _built(alice, tmp_path)
    RegisteredModel.objects.filter(pk=second.model_id).update(last_version_number=2)
    assert alice.client.delete(f"/api/v1/versions/{second.pk}/").status_code == 204
    # when the next file is uploaded
    response = alice.client.post(
        f"/api/v1/models/{second.model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"x" * 10))}
    )
    # then it is version 3 (a deployment's repository may still hold version 2's folder)
    assert response.status_code == 201, response.content
    assert response.json()["number"] == 3


@pytest.mark.django_db(transaction=True)
def test_a_deletion_racing_a_new_deployment_waits_for_it_and_is_refused(tmp_path):
    # given a built version, and a deployment of it being created: its transaction holds the version's lock
    caller = make_caller("ada", "acme")
    version = write_built_version(caller.team, "adder", add_constant(tmp_path / "a.onnx", 1.0))
    outcome: list[object] = []

    def delete() -> None:
        try:
            delete_model_version(user=caller.user, version=version)
            outcome.append("deleted")
        except InUse as exc:
            outcome.append(exc.users)
        finally:
            connection.close()

    with transaction.atomic():
        web = _deploy(caller, version, "web")
        # when the version's deletion starts before that transaction commits
        racer = threading.Thread(target=delete)
        racer.start()
        racer.join(timeout=1.0)
        # then it waits on the version's row
        assert racer.is_alive()
    racer.join(timeout=30)
    # and, once the deployment is committed, sees it and is refused
    assert outcome == [[{"id": web.pk, "name": "web"}]]
    assert ModelVersion.objects.get(pk=version.pk).status == "built"


def test_lock_built_version_refuses_a_version_being_deleted(alice, tmp_path):
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "a.onnx", 1.0))
    with transaction.atomic():
        registry.lock_built_version(version_id=version.pk)
    ModelVersion.objects.filter(pk=version.pk).update(status="deleting")
    with pytest.raises(Conflict, match=f"Model version {version.pk} is 'deleting'; only a built version can be served"):
        with transaction.atomic():
            registry.lock_built_version(version_id=version.pk)

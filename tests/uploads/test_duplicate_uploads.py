"""A file that already is a live version of its model is refused with 409 naming `sha256` and the version, on every
upload path (the resumable start, its completion, the single-request upload, the worker's check of two identical
uploads completed at once), unless the client sends `allow_duplicate`. Folder storage; real PostgreSQL."""

from __future__ import annotations

import hashlib
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.services import current_options
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from tests.build_records import end_current_build, fail_current_build
from tests.conftest import make_caller
from tests.tiny_models import onnx_like
from uploads import services as uploads
from uploads.models import Upload

pytestmark = pytest.mark.django_db


def _model(caller, name: str = "dup") -> int:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _data(seed: bytes = b"a") -> bytes:
    return onnx_like(b"xx" + seed * 3000)


def _post_version(caller, model_id: int, data: bytes, **fields):
    return caller.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", data), **fields}
    )


def _start(caller, model_id: int, data: bytes, *, sha256: bool = True, **extra):
    body = {"filename": "model.onnx", "size_bytes": len(data), **extra}
    if sha256:
        body["sha256"] = hashlib.sha256(data).hexdigest()
    return caller.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")


def _send(caller, model_id: int, upload_id: str, data: bytes) -> None:
    response = caller.client.post(
        f"/api/v1/models/{model_id}/uploads/{upload_id}/parts/", {"numbers": [1]}, format="json"
    )
    (target,) = response.json()["parts"]
    put = caller.client.put(target["url"], data=data, content_type="application/octet-stream")
    assert put.status_code == 200, put.content


def _complete(caller, model_id: int, upload_id: str, **body):
    return caller.client.post(f"/api/v1/models/{model_id}/uploads/{upload_id}/complete", body, format="json")


def _assert_duplicate_of(response, version: ModelVersion) -> None:
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["field"] == "sha256"
    assert body["existing_version"] == {"id": version.pk, "number": version.number, "status": version.status}
    assert f"already is version {version.number} (id {version.pk}, {version.status})" in body["detail"]
    assert "allow_duplicate: true" in body["detail"]


def test_the_single_request_upload_of_a_file_that_is_a_version_is_refused_and_leaves_nothing(alice):
    # given a model whose version 1 is a file
    model_id = _model(alice)
    data = _data()
    first = _post_version(alice, model_id, data)
    assert first.status_code == 201, first.content
    version = ModelVersion.objects.get(pk=first.json()["id"])
    keys = get_object_store().list_keys("")
    # when the same file is uploaded again
    again = _post_version(alice, model_id, data)
    # then it is refused naming version 1, and what it stored is gone: no row, no object
    _assert_duplicate_of(again, version)
    assert "wait for its build" in again.json()["detail"]  # version 1 is queued
    assert list(ModelVersion.objects.filter(model_id=model_id).values_list("number", flat=True)) == [1]
    assert get_object_store().list_keys("") == keys


def test_the_single_request_upload_makes_another_version_with_allow_duplicate(alice):
    model_id = _model(alice)
    data = _data()
    assert _post_version(alice, model_id, data).status_code == 201
    again = _post_version(alice, model_id, data, allow_duplicate="true")
    assert again.status_code == 201, again.content
    assert again.json()["number"] == 2
    refused = _post_version(alice, model_id, data, allow_duplicate="maybe")
    assert refused.status_code == 400 and refused.json()["field"] == "allow_duplicate"


def test_the_advice_follows_the_existing_version_s_status(alice):
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    end_current_build(version, "built")
    built = _start(alice, model_id, data)
    assert f"deploy that version (POST /api/v1/deployments/ with version {version.pk})" in built.json()["detail"]
    fail_current_build(version, "verify failed", error_field="verify")
    failed = _start(alice, model_id, data)
    assert (
        f"rebuild it if its build failed for a reason since fixed (POST /api/v1/versions/{version.pk}/rebuild)"
        in (failed.json()["detail"])
    )
    assert failed.json()["existing_version"]["status"] == "failed"


def test_build_options_sent_with_a_duplicate_are_said_not_applied_with_the_rebuild_that_applies_them(
    alice, django_capture_on_commit_callbacks
):
    # given version 1 of a file, built with the default options
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    end_current_build(version, "built")
    version.refresh_from_db()
    # when the same file is uploaded again with max_batch_size 8, resumable or in one request
    resumable = _start(alice, model_id, data, build_options={"max_batch_size": 8})
    single = _post_version(alice, model_id, data, max_batch_size="8")
    # then both refusals say the options were not applied, and give the rebuild that applies them
    advice = (
        "The build options sent with it (max_batch_size=8) were not applied: version 1 keeps its own; to build it "
        f'with them, POST /api/v1/versions/{version.pk}/rebuild with {{"max_batch_size": 8}}.'
    )
    for refused in (resumable, single):
        _assert_duplicate_of(refused, version)
        assert refused.json()["detail"].endswith(advice), refused.json()["detail"]
    # and that rebuild, as given, builds version 1 with them
    with django_capture_on_commit_callbacks():
        rebuilt = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild", {"max_batch_size": 8}, format="json")
    assert rebuilt.status_code == 202, rebuilt.content
    version.refresh_from_db()
    assert current_options(version)["max_batch_size"] == 8
    # while a duplicate sent without options says nothing of them
    assert "build options" not in _start(alice, model_id, data).json()["detail"]


def test_a_resumable_start_with_the_sha256_of_a_version_is_refused_before_anything_is_reserved(alice):
    # given version 1 of the file
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    # when a resumable upload of the same file starts with its sha256
    refused = _start(alice, model_id, data)
    # then it is refused naming the version, and no upload was started
    _assert_duplicate_of(refused, version)
    assert not Upload.objects.exists()
    # and with allow_duplicate it starts, the upload keeping the choice
    allowed = _start(alice, model_id, data, allow_duplicate=True)
    assert allowed.status_code == 201, allowed.content
    assert allowed.json()["allow_duplicate"] is True


def test_a_completion_that_brings_the_sha256_of_a_version_is_refused_and_the_upload_stays_open(
    alice, django_capture_on_commit_callbacks
):
    # given version 1 of the file, and an upload of it started without its sha256, every part sent
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    upload = _start(alice, model_id, data, sha256=False).json()
    _send(alice, model_id, upload["id"], data)
    digest = hashlib.sha256(data).hexdigest()
    # when it is completed with the sha256
    refused = _complete(alice, model_id, upload["id"], sha256=digest)
    # then it is refused naming version 1, and the upload is still open with its part and no sha256 recorded
    _assert_duplicate_of(refused, version)
    kept = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()
    assert (kept["status"], kept["sha256"], [p["number"] for p in kept["parts"]]) == ("uploading", "", [1])
    # when it is completed again with allow_duplicate
    with django_capture_on_commit_callbacks():
        done = _complete(alice, model_id, upload["id"], sha256=digest, allow_duplicate=True)
        assert done.status_code == 202, done.content
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    # then version 2 is made from the same file
    made = Upload.objects.get(pk=upload["id"]).version
    assert (made.number, made.source_sha256) == (2, digest)


def test_a_refused_completion_can_be_aborted_instead(alice):
    model_id = _model(alice)
    data = _data()
    _post_version(alice, model_id, data)
    upload = _start(alice, model_id, data, sha256=False).json()
    _send(alice, model_id, upload["id"], data)
    assert _complete(alice, model_id, upload["id"], sha256=hashlib.sha256(data).hexdigest()).status_code == 409
    assert alice.client.delete(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").status_code == 204
    assert Upload.objects.get(pk=upload["id"]).status == "aborted"


def test_a_start_that_allowed_duplicates_completes_without_saying_so_again(alice, django_capture_on_commit_callbacks):
    model_id = _model(alice)
    data = _data()
    _post_version(alice, model_id, data)
    upload = _start(alice, model_id, data, allow_duplicate=True).json()
    _send(alice, model_id, upload["id"], data)
    with django_capture_on_commit_callbacks():
        assert _complete(alice, model_id, upload["id"]).status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    assert Upload.objects.get(pk=upload["id"]).version.number == 2


def test_of_two_identical_uploads_completed_at_once_the_first_wins(alice, django_capture_on_commit_callbacks):
    # given two uploads of the same file, both completed before either was checked by a worker
    model_id = _model(alice)
    data = _data()
    first = _start(alice, model_id, data, sha256=False).json()
    second = _start(alice, model_id, data, sha256=False).json()
    digest = hashlib.sha256(data).hexdigest()
    for upload in (first, second):
        _send(alice, model_id, upload["id"], data)
        with django_capture_on_commit_callbacks(execute=False):
            assert _complete(alice, model_id, upload["id"], sha256=digest).status_code == 202
    # when the worker checks them, one after the other
    with django_capture_on_commit_callbacks(execute=False):
        assert uploads.finish_upload(upload_id=first["id"]) == "completed"
        assert uploads.finish_upload(upload_id=second["id"]) == "failed"
    # then the first made version 1; the second failed naming sha256 and that version, its file deleted
    version = Upload.objects.get(pk=first["id"]).version
    lost = Upload.objects.get(pk=second["id"])
    assert (lost.status, lost.error_field, lost.version) == ("failed", "sha256", None)
    assert f"already is version 1 (id {version.pk}, queued)" in lost.error
    assert "this upload made no version and its file was deleted" in lost.error
    assert get_object_store().list_keys("") == [version.source_key]


def test_a_deleted_version_does_not_count(alice):
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    end_current_build(version, "built")
    assert alice.client.delete(f"/api/v1/versions/{version.pk}/").status_code == 204
    assert _start(alice, model_id, data).status_code == 201
    assert _post_version(alice, model_id, data).status_code == 201


def test_a_version_being_deleted_or_failed_on_its_sha256_does_not_count(alice):
    model_id = _model(alice)
    data = _data()
    version = ModelVersion.objects.get(pk=_post_version(alice, model_id, data).json()["id"])
    ModelVersion.objects.filter(pk=version.pk).update(status="deleting")
    assert _start(alice, model_id, data).status_code == 201
    # a version whose promised sha256 its file did not keep: the sha256 was never its file's
    fail_current_build(version, "sha256 mismatch", error_field="sha256")
    assert _post_version(alice, model_id, data).status_code == 201


def test_the_same_file_in_another_model_is_not_a_duplicate(alice):
    data = _data()
    assert _post_version(alice, _model(alice, "one"), data).status_code == 201
    other = _model(alice, "two")
    assert _start(alice, other, data).status_code == 201
    assert _post_version(alice, other, data).status_code == 201


def test_another_team_and_a_viewer_learn_nothing_of_the_version(alice, bob):
    model_id = _model(alice)
    data = _data()
    assert _post_version(alice, model_id, data).status_code == 201
    # bob's team cannot see the model at all
    for response in (_start(bob, model_id, data), _post_version(bob, model_id, data)):
        assert response.status_code == 404, response.content
        assert "existing_version" not in response.json()
    # a viewer of alice's team may not upload, and is told that before anything about the versions
    viewer = make_caller("victor", "acme", role="viewer")
    for response in (_start(viewer, model_id, data), _post_version(viewer, model_id, data)):
        assert response.status_code == 403, response.content
        assert "existing_version" not in response.json() and "already is" not in response.json()["detail"]


def test_the_schema_documents_allow_duplicate_and_existing_version(alice):
    schema = alice.client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    for name in ("StartUploadRequest", "CompleteUploadRequest", "UploadVersionRequest"):
        assert components[name]["properties"]["allow_duplicate"]["type"] == "boolean", name
    assert set(components["DuplicateVersionError"]["properties"]["existing_version"]["allOf"][0].values()) == {
        "#/components/schemas/ExistingVersion"
    }
    start = schema["paths"]["/api/v1/models/{model_id}/uploads/"]["post"]["responses"]["409"]
    assert start["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/DuplicateVersionError"}


def test_two_uploads_of_other_files_are_two_versions(alice):
    model_id = _model(alice)
    assert _post_version(alice, model_id, _data(b"a")).status_code == 201
    assert _post_version(alice, model_id, _data(b"b")).status_code == 201
    assert _start(alice, model_id, onnx_like(os.urandom(100))).status_code == 201

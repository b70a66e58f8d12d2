"""Resumable uploads through the REST API, on a real S3 protocol server (parts PUT to presigned URLs with plain
`requests`, so the bytes never pass through Conch) and on the folder store (parts PUT to Conch, streamed to disk):
start, resume, complete, the worker's check, failures, quota, expiry, other teams, and two starts at once."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import threading
import time
import tracemalloc
import uuid
import zlib
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from builds import services as builds
from builds.services import current_build, current_error, current_options
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from tenancy.models import AuditEntry
from tenancy.quotas import set_quota, team_usage
from tenancy.services import create_api_token, ensure_membership
from tests import real_models
from tests.build_records import end_current_build
from tests.conftest import make_caller
from uploads import services as uploads
from uploads.models import Upload
from uploads.services import checks
from uploads.tasks import finish_upload

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
PART = 5 * MIB


@pytest.fixture
def s3(settings, s3_server, s3_bucket, s3_client):
    """Conch's object store is a bucket of the S3 protocol server; returns a function telling what it holds."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key

    def held() -> dict[str, list]:
        keys = [item["Key"] for item in s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        pending = [item["Key"] for item in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
        return {"keys": keys, "pending": pending}

    held.endpoint = endpoint
    held.bucket = bucket
    return held


def _model(caller, name: str = "blob") -> int:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _start(caller, model_id: int, data: bytes, **extra):
    body = {"filename": "model.onnx", "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), **extra}
    return caller.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")


def _urls(caller, model_id: int, upload_id: str, numbers: list[int]) -> list[dict]:
    response = caller.client.post(
        f"/api/v1/models/{model_id}/uploads/{upload_id}/parts/", {"numbers": numbers}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()["parts"]


def _storage_used(team) -> int:
    return next(line.used for line in team_usage(team=team) if line.field == "storage_bytes")


def _usage_of_open_uploads(team) -> int:
    return uploads.count_team_upload_reservations(team)["bytes of storage"]


def test_a_file_goes_straight_to_the_bucket_then_becomes_a_version(alice, s3, django_capture_on_commit_callbacks):
    # given a 12 MiB file in parts of 5 MiB, and build options
    data = os.urandom(12 * MIB + 123)
    model_id = _model(alice)
    # when an upload starts
    started = _start(alice, model_id, data, part_size_bytes=PART, build_options={"max_batch_size": 4})
    # then it is an S3 multipart upload of three parts, the size reserved in the quota
    assert started.status_code == 201, started.content
    upload = started.json()
    assert {k: upload[k] for k in ("transport", "status", "part_size_bytes", "part_count", "parts", "version")} == {
        "transport": "s3",
        "status": "uploading",
        "part_size_bytes": PART,
        "part_count": 3,
        "parts": [],
        "version": None,
    }
    assert _storage_used(alice.team) == len(data)
    assert len(s3()["pending"]) == 1
    # when the client PUTs each part to its presigned URL with plain requests (no Conch credentials, not Conch's host)
    targets = _urls(alice, model_id, upload["id"], [1, 2, 3])
    etags = []
    for target in targets:
        assert target["method"] == "PUT" and target["url"].startswith(s3.endpoint + "/")
        start = (target["number"] - 1) * PART
        answer = requests.put(target["url"], data=data[start : start + PART], headers=target["headers"], timeout=30)
        assert answer.status_code == 200, answer.text
        etags.append(answer.headers["ETag"])
    # then GET lists the parts the bucket holds
    listed = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()["parts"]
    assert listed == [
        {"number": 1, "size_bytes": PART, "etag": etags[0]},
        {"number": 2, "size_bytes": PART, "etag": etags[1]},
        {"number": 3, "size_bytes": 2 * MIB + 123, "etag": etags[2]},
    ]
    # when the client completes it (naming the ETags it kept)
    with django_capture_on_commit_callbacks() as queued:
        completed = alice.client.post(
            f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete",
            {"parts": [{"number": n + 1, "etag": etag} for n, etag in enumerate(etags)]},
            format="json",
        )
    assert completed.status_code == 202, completed.content
    assert completed.json()["status"] == "completing"
    assert len(queued) == 1  # the worker's check
    # and the worker's check runs (its own build is only queued here)
    with django_capture_on_commit_callbacks() as build_queued:
        assert finish_upload.apply(args=(upload["id"],)).get() == "completed"
    assert len(build_queued) == 1
    # then the upload names its version, made as an ordinary upload makes one, its build queued
    done = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()
    assert done["status"] == "completed" and done["error"] == ""
    version = ModelVersion.objects.get(pk=done["version"])
    assert (version.number, version.status, current_build(version).attempt) == (1, "queued", 1)
    assert (version.source_filename, version.source_size_bytes) == ("model.onnx", len(data))
    assert (version.source_sha256, version.source_checked) == (hashlib.sha256(data).hexdigest(), False)
    assert version.source_key == f"models/{model_id}/uploads/{upload['id']}/model.onnx"
    assert current_options(version)["max_batch_size"] == 4
    assert get_object_store().read_bytes(version.source_key) == data
    assert s3() == {"keys": [f"conch/{version.source_key}"], "pending": []}
    # and the bytes are counted once: the version's, the reservation ended
    assert _storage_used(alice.team) == len(data)
    assert _usage_of_open_uploads(alice.team) == 0
    # and the steps are in the audit log
    actions = list(AuditEntry.objects.filter(team=alice.team).values_list("action", flat=True))
    assert {"upload.started", "upload.completion_requested", "upload.completed", "version.uploaded"} <= set(actions)
    # and a second run of the check (a duplicate message) changes nothing
    assert finish_upload.apply(args=(upload["id"],)).get() == "skipped"


def test_a_stopped_upload_resumes_where_it_stopped_through_conch_with_folder_storage(
    alice, django_capture_on_commit_callbacks
):
    # given a 11 MiB file in parts of 5 MiB on the folder store, its first part sent
    data = os.urandom(11 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    assert upload["transport"] == "conch"
    (first,) = _urls(alice, model_id, upload["id"], [1])
    assert first["url"] == f"http://testserver/api/v1/models/{model_id}/uploads/{upload['id']}/parts/1"
    sent = alice.client.put(first["url"], data=data[:PART], content_type="application/octet-stream")
    assert sent.status_code == 200, sent.content
    assert sent.json() == {"number": 1, "size_bytes": PART, "etag": hashlib.sha256(data[:PART]).hexdigest()}
    # when the client is run again: the same file is started again
    again = _start(alice, model_id, data, part_size_bytes=PART)
    # then it gets the open upload back, with the part it already sent
    assert again.status_code == 200, again.content
    assert again.json()["id"] == upload["id"]
    assert [part["number"] for part in again.json()["parts"]] == [1]
    assert Upload.objects.count() == 1
    # and the open uploads of the model are listed
    listed = alice.client.get(f"/api/v1/models/{model_id}/uploads/").json()
    assert listed["count"] == 1
    assert [item["id"] for item in listed["results"]] == [upload["id"]]
    # when it sends the rest and completes
    for target in _urls(alice, model_id, upload["id"], [2, 3]):
        start = (target["number"] - 1) * PART
        chunk = data[start : start + PART]
        assert alice.client.put(target["url"], data=chunk, content_type="application/octet-stream").status_code == 200
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    # then the joined file is the file, and the staging folder is gone
    version = Upload.objects.get(pk=upload["id"]).version
    assert get_object_store().read_bytes(version.source_key) == data
    root = get_object_store().root
    assert not any((root / ".conch-tmp-uploads").iterdir())
    assert get_object_store().list_keys("") == [version.source_key]


def test_a_part_of_the_wrong_size_is_refused_naming_the_part(alice):
    # given a folder-store upload of 8 MiB in parts of 5 MiB
    data = os.urandom(8 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    url = f"/api/v1/models/{model_id}/uploads/{upload['id']}/parts/2"
    # when the last part is sent with a byte too many
    response = alice.client.put(url, data=data[PART:] + b"x", content_type="application/octet-stream")
    # then
    assert response.status_code == 400, response.content
    assert response.json() == {
        "detail": f"Part 2 must be exactly {3 * MIB} bytes (bytes {PART} to {8 * MIB - 1} of the file); this "
        f"request sends {3 * MIB + 1} bytes. Send that slice of the file as the body, with its Content-Length.",
        "field": "size_bytes",
    }
    # and a part number past the last is refused too
    response = alice.client.put(url[:-1] + "3", data=b"x", content_type="application/octet-stream")
    assert response.status_code == 400
    assert response.json()["field"] == "number"
    assert "out of range: this upload has parts 1 to 2" in response.json()["detail"]
    assert get_object_store().list_parts(Upload.objects.get().object_key, Upload.objects.get().store_upload_id) == []


def test_completing_with_a_part_missing_names_the_first_missing_part(alice, s3):
    data = os.urandom(11 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    for target in _urls(alice, model_id, upload["id"], [1, 3]):
        start = (target["number"] - 1) * PART
        assert requests.put(target["url"], data=data[start : start + PART], timeout=30).status_code == 200
    # when
    response = alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete", {}, format="json")
    # then
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": "Part 2 of 3 is missing from the object store; send it (POST .../parts/ gives its URL), then "
        "complete again.",
        "field": "parts",
    }
    assert Upload.objects.get().status == "uploading"


def test_a_checksum_mismatch_fails_the_version_s_build_naming_sha256_and_a_rebuild_fails_the_same_way(
    alice, s3, django_capture_on_commit_callbacks
):
    # given an upload whose promised SHA-256 is not the file's
    data = os.urandom(6 * MIB)
    promised = hashlib.sha256(b"another file").hexdigest()
    got = hashlib.sha256(data).hexdigest()
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART, sha256=promised).json()
    for target in _urls(alice, model_id, upload["id"], [1, 2]):
        start = (target["number"] - 1) * PART
        assert requests.put(target["url"], data=data[start : start + PART], timeout=30).status_code == 200
    # when it completes and the worker joins it
    with django_capture_on_commit_callbacks() as queued:
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    # then the size matched: a version is made, queued, its promised SHA-256 not checked yet (the object was not
    # read back)
    done = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()
    assert (done["status"], done["error"]) == ("completed", "")
    version = ModelVersion.objects.get(pk=done["version"])
    assert (version.status, version.source_sha256, version.source_checked) == ("queued", promised, False)
    assert len(queued) == 2  # the check, then the build
    shown = alice.client.get(f"/api/v1/versions/{version.pk}/").json()["source"]
    assert (shown["sha256"], shown["sha256_checked"]) == (promised, False)
    # when its build runs
    assert builds.run_build(version_id=version.pk, attempt=1) == "failed"
    # then the version failed for good, naming sha256 with both values and what to do
    expected_error = (
        f"The uploaded file's SHA-256 is {got}, not the {promised} promised when its upload started (sha256): "
        f"expected {promised}, got {got}. The file changed during the upload or a part was sent wrongly, so this "
        f"version cannot be built. Delete this version (DELETE /api/v1/versions/{version.pk}/, or Delete on the "
        "model's page) and upload the file again (re-run `conch upload MODEL FILE`; check the file first with "
        "sha256sum FILE)."
    )
    failed = alice.client.get(f"/api/v1/versions/{version.pk}/").json()
    assert (failed["status"], failed["error_field"], failed["error"]) == ("failed", "sha256", expected_error)
    assert failed["source"]["sha256_checked"] is False
    # and the inspect step's log says why; nothing after it ran
    steps = {step["name"]: step for step in failed["steps"]}
    inspect_log = [line.split(" ", 1)[1] for line in steps["inspect"]["log"]]
    assert inspect_log[1:] == [
        f"checking sha256 of the uploaded file against {promised} (promised at upload)",
        f"FAILED: {expected_error}",
    ]
    assert steps["inspect"]["status"] == "failed"
    assert {steps[name]["status"] for name in ("configure", "write_repository", "verify")} == {"skipped"}
    # when it is rebuilt
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/versions/{version.pk}/rebuild").status_code == 202
    assert builds.run_build(version_id=version.pk, attempt=2) == "failed"
    # then it fails the same way (the check is not skipped the second time)
    again = ModelVersion.objects.get(pk=version.pk)
    assert (again.status, current_build(again).error_field, current_error(again), again.source_checked) == (
        "failed",
        "sha256",
        expected_error,
        False,
    )
    # and deleting the version, as the error says, removes the file and frees the quota
    assert _storage_used(alice.team) == len(data)
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.delete(f"/api/v1/versions/{version.pk}/").status_code == 204
    assert s3()["keys"] == []
    assert _storage_used(alice.team) == 0


def test_a_start_that_does_not_fit_the_quota_is_refused_before_anything_starts(alice, s3):
    set_quota(team=alice.team, limits={"storage_bytes": 10 * MIB})
    model_id = _model(alice)
    body = {"filename": "big.onnx", "size_bytes": 20 * MIB, "sha256": "a" * 64}
    # when
    response = alice.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")
    # then
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses 0 of {10 * MIB} bytes of storage; this upload needs "
        f"{20 * MIB}",
        "field": "storage_bytes",
        "quota": {"limit": 10 * MIB, "used": 0, "requested": 20 * MIB},
    }
    assert not Upload.objects.exists()
    assert s3() == {"keys": [], "pending": []}
    # and an open upload holds its reservation: a second one that fits alone does not fit beside it
    assert _start(alice, model_id, b"\1" * (6 * MIB)).status_code == 201
    refused = _start(alice, model_id, b"\2" * (6 * MIB))
    assert refused.status_code == 409
    assert refused.json()["quota"] == {"limit": 10 * MIB, "used": 6 * MIB, "requested": 6 * MIB}


def test_a_file_over_the_upload_limit_is_refused_naming_size_bytes(alice, settings):
    settings.CONCH_MAX_UPLOAD_BYTES = 10 * MIB
    model_id = _model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/",
        {"filename": "m.onnx", "size_bytes": 10 * MIB + 1, "sha256": "a" * 64},
        format="json",
    )
    assert response.status_code == 413, response.content
    assert response.json()["field"] == "size_bytes"
    assert "CONCH_MAX_UPLOAD_BYTES" in response.json()["detail"]
    assert not Upload.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sha256": "xyz" * 21 + "a"}, "sha256"),
        ({"part_size_bytes": MIB}, "part_size_bytes"),
        ({"size_bytes": 0}, "size_bytes"),
        ({"build_options": {"max_batch_size": -1}}, "build_options.max_batch_size"),
        (
            {"build_options": {"max_queue_delay_microseconds": 100, "max_batch_size": 0}},
            "build_options.max_queue_delay_microseconds",
        ),
        ({"filename": "../"}, "filename"),
        ({"build_options": {"output_dims": {"y": [-1, "x"]}}}, "build_options.output_dims"),
    ],
)
def test_bad_start_fields_are_refused_naming_them(alice, body, field):
    model_id = _model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/",
        {"filename": "m.onnx", "size_bytes": 10, "sha256": "a" * 64, **body},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not Upload.objects.exists()


@pytest.mark.parametrize(
    ("options", "field", "says"),
    [
        ({"max_batch_size": "lots"}, "build_options.max_batch_size", "must be a whole number such as 8"),
        ({"max_batch_size": -3}, "build_options.max_batch_size", "must be between 0 and 1024"),
        ({"max_batch": 4}, "build_options.max_batch", "build_options has no option 'max_batch'"),
        ([4], "build_options", "build_options is a JSON object of build options"),
    ],
)
def test_bad_build_options_of_a_start_get_the_builds_own_words(alice, options, field, says):
    # when a start sends build options the build would refuse (or a key that is no option)
    model_id = _model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/",
        {"filename": "m.onnx", "size_bytes": 10, "sha256": "a" * 64, "build_options": options},
        format="json",
    )
    # then refused as the version upload refuses them, naming the option inside build_options
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert says in response.json()["detail"]
    assert not Upload.objects.exists()


def test_the_sweeper_aborts_an_expired_upload_and_frees_its_quota(alice, s3):
    # given an upload with one part in the bucket, abandoned past its expiry
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    (target,) = _urls(alice, model_id, upload["id"], [1])
    assert requests.put(target["url"], data=data[:PART], timeout=30).status_code == 200
    Upload.objects.filter(pk=upload["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    # then its reservation ended with its expiry, and it takes no more parts
    assert _storage_used(alice.team) == 0
    refused = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/{upload['id']}/parts/", {"numbers": [2]}, format="json"
    )
    assert refused.status_code == 409
    assert refused.json()["field"] == "expires_at"
    assert "expired" in refused.json()["detail"] and "Start a new upload" in refused.json()["detail"]
    # when the sweeper runs
    counts = uploads.sweep_uploads()
    # then the multipart upload is aborted in the bucket and the upload says why
    assert counts["expired_uploads"] == 1
    assert s3() == {"keys": [], "pending": []}
    swept = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()
    assert (swept["status"], swept["error_field"]) == ("aborted", "expires_at")
    assert "CONCH_UPLOAD_EXPIRES_HOURS" in swept["error"]
    assert uploads.sweep_uploads()["expired_uploads"] == 0


def test_the_sweeper_queues_again_the_check_of_an_upload_whose_worker_stopped(
    alice, s3, settings, django_capture_on_commit_callbacks
):
    data = os.urandom(1000)
    model_id = _model(alice)
    upload = _start(alice, model_id, data).json()
    (target,) = _urls(alice, model_id, upload["id"], [1])
    assert requests.put(target["url"], data=data, timeout=30).status_code == 200
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
    # given a worker took the check, then stopped (no heartbeat for longer than CONCH_UPLOAD_STALE_SECONDS)
    assert uploads.claim_upload_check(upload_id=upload["id"], stale_before=timezone.now()) is not None
    long_ago = timezone.now() - timedelta(seconds=settings.CONCH_UPLOAD_STALE_SECONDS + 1)
    Upload.objects.filter(pk=upload["id"]).update(heartbeat_at=long_ago)
    # when the sweeper runs
    with django_capture_on_commit_callbacks() as queued:
        counts = uploads.sweep_uploads()
    # then the check is queued again, and the next worker finishes it
    assert counts["requeued_upload_checks"] == 1
    assert len(queued) == 1
    with django_capture_on_commit_callbacks():
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    assert Upload.objects.get(pk=upload["id"]).version.source_size_bytes == 1000


def test_a_client_can_abort_its_upload(alice, s3):
    model_id = _model(alice)
    upload = _start(alice, model_id, os.urandom(100)).json()
    assert alice.client.delete(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").status_code == 204
    assert Upload.objects.get().status == "aborted"
    assert s3() == {"keys": [], "pending": []}
    assert _storage_used(alice.team) == 0
    assert alice.client.get(f"/api/v1/models/{model_id}/uploads/").json()["results"] == []
    assert AuditEntry.objects.filter(action="upload.aborted").count() == 1


def test_parts_of_an_upload_to_the_bucket_are_not_taken_by_conch(alice, s3):
    model_id = _model(alice)
    upload = _start(alice, model_id, b"x" * 100).json()
    response = alice.client.put(
        f"/api/v1/models/{model_id}/uploads/{upload['id']}/parts/1", data=b"x" * 100, content_type="application/json"
    )
    assert response.status_code == 404
    assert response.json()["field"] == "number"


def test_another_team_and_a_narrow_token_are_kept_out(alice, bob, s3):
    model_id = _model(alice)
    upload = _start(alice, model_id, b"x" * 100).json()
    base = f"/api/v1/models/{model_id}/uploads/"
    # another team's member sees nothing of it
    for method, url, body in [
        ("get", base, None),
        ("post", base, {"filename": "m.onnx", "size_bytes": 100, "sha256": "a" * 64}),
        ("get", f"{base}{upload['id']}/", None),
        ("delete", f"{base}{upload['id']}/", None),
        ("post", f"{base}{upload['id']}/parts/", {"numbers": [1]}),
        ("put", f"{base}{upload['id']}/parts/1", None),
        ("post", f"{base}{upload['id']}/complete", {}),
    ]:
        response = getattr(bob.client, method)(url, body, format="json") if body else getattr(bob.client, method)(url)
        assert response.status_code == 404, (method, url, response.content)
    # a token of alice's team without models:write reads, but may not write
    reader = make_caller("reader", "acme-readers")
    ensure_membership(team=alice.team, user=reader.user, role="developer")
    narrow = create_api_token(user=reader.user, team=alice.team, name="read", scopes=["read"]).secret
    reader.client.credentials(HTTP_AUTHORIZATION=f"Bearer {narrow}")
    assert reader.client.get(f"{base}{upload['id']}/").status_code == 200
    refused = reader.client.post(f"{base}{upload['id']}/parts/", {"numbers": [1]}, format="json")
    assert refused.status_code == 403
    assert "models:write" in refused.json()["detail"]
    assert Upload.objects.get().status == "uploading"


@pytest.mark.parametrize("filename", ["model.ckpt", "pytorch_model.bin", "notes.docx"])
def test_a_start_for_a_file_conch_cannot_build_is_refused_naming_filename_before_anything_starts(alice, s3, filename):
    model_id = _model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/",
        {"filename": filename, "size_bytes": 20 * MIB, "sha256": "a" * 64},
        format="json",
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "filename"
    assert body["detail"].startswith(f"{filename!r} is not a model file Conch builds: Conch builds ONNX model")
    assert not Upload.objects.exists()
    assert _storage_used(alice.team) == 0
    assert s3() == {"keys": [], "pending": []}


@pytest.mark.parametrize(
    ("head", "detail"),
    [
        (b"hello, these are my notes\n", "This is not an ONNX model: it looks like a text file (it starts with 'hello"),
        (b"PK\x03\x04" + b"\0" * 60, "This is not an ONNX model: it looks like a ZIP archive"),
    ],
)
def test_a_start_whose_first_bytes_are_not_an_onnx_model_is_refused_naming_head_before_anything_starts(
    alice, s3, head, detail
):
    # given a file named .onnx whose first bytes (sent base64 as `head`, no sha256 yet) show another format
    model_id = _model(alice)
    body = {"filename": "notmodel.onnx", "size_bytes": 20 * MIB, "head": base64.b64encode(head).decode()}
    # when the upload is started
    response = alice.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")
    # then it is refused naming head, and nothing is reserved or started
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "head"
    assert response.json()["detail"].startswith(detail)
    assert not Upload.objects.exists()
    assert _storage_used(alice.team) == 0
    assert s3() == {"keys": [], "pending": []}


@pytest.mark.parametrize(
    ("head", "detail"),
    [("not base64!", "head must be base64"), (base64.b64encode(b"\x08" * 513).decode(), "head must hold 1 to 512")],
)
def test_a_head_that_is_not_base64_of_at_most_512_bytes_is_refused_naming_it(alice, s3, head, detail):
    model_id = _model(alice)
    body = {"filename": "model.onnx", "size_bytes": 20 * MIB, "head": head}
    response = alice.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "head"
    assert detail in response.json()["detail"]
    assert not Upload.objects.exists()


def test_a_start_whose_first_bytes_are_an_onnx_models_goes_on(alice, s3):
    model_id = _model(alice)
    head = real_models.classifier().read_bytes()[:512]
    body = {"filename": "model.onnx", "size_bytes": 20 * MIB, "head": base64.b64encode(head).decode()}
    response = alice.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")
    assert response.status_code == 201, response.content
    assert Upload.objects.get().status == "uploading"


def test_the_sha256_may_come_with_the_completion_and_a_start_that_sends_it_takes_the_open_upload_over(
    alice, s3, django_capture_on_commit_callbacks
):
    # given an upload started without its sha256 (the client hashes while the parts go), one 6 MiB part sent
    data = os.urandom(6 * MIB)
    digest = hashlib.sha256(data).hexdigest()
    model_id = _model(alice)
    body = {"filename": "model.onnx", "size_bytes": len(data)}
    started = alice.client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json")
    assert started.status_code == 201, started.content
    upload = started.json()
    assert upload["sha256"] == ""
    (target,) = _urls(alice, model_id, upload["id"], [1])
    assert requests.put(target["url"], data=data, headers=target["headers"], timeout=30).status_code == 200
    complete = f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete"
    # when it is completed without the sha256: refused naming it
    refused = alice.client.post(complete, {}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "sha256"
    # when the client starts again with the sha256 (a re-run after a crash): it gets that upload back
    again = alice.client.post(f"/api/v1/models/{model_id}/uploads/", {**body, "sha256": digest}, format="json")
    assert again.status_code == 200, again.content
    assert (again.json()["id"], again.json()["sha256"]) == (upload["id"], digest)
    # and a completion with another sha256 is refused, naming it
    other = alice.client.post(complete, {"sha256": "0" * 64}, format="json")
    assert other.status_code == 400 and other.json()["field"] == "sha256"
    # and with the same one the upload becomes a version carrying it
    with django_capture_on_commit_callbacks(execute=False):
        assert alice.client.post(complete, {"sha256": digest}, format="json").status_code == 202
    with django_capture_on_commit_callbacks(execute=False):
        assert finish_upload.apply(args=(upload["id"],)).get() == "completed"
    version = ModelVersion.objects.get(upload__id=upload["id"])
    assert (version.source_sha256, version.source_checked) == (digest, False)
    assert Upload.objects.count() == 1


def test_an_open_upload_is_found_by_name_size_and_first_bytes_and_another_file_of_that_name_and_size_is_not(alice, s3):
    # given an upload started with its first bytes and without its sha256 (as the wizard starts one)
    model_id = _model(alice)
    uploads = f"/api/v1/models/{model_id}/uploads/"
    ours = b"\x08\x07" + os.urandom(6 * MIB - 2)
    other = b"\x08\x07" + os.urandom(6 * MIB - 2)  # same name and size, other bytes
    head = {name: data[:512] for name, data in (("ours", ours), ("other", other))}
    body = {"filename": "model.onnx", "size_bytes": len(ours), "head": base64.b64encode(head["ours"]).decode()}
    started = alice.client.post(uploads, body, format="json")
    assert started.status_code == 201, started.content
    upload = started.json()
    assert upload["head_sha256"] == hashlib.sha256(head["ours"]).hexdigest()
    # when the model's uploads are listed for this file: that upload
    query = {"filename": "model.onnx", "size_bytes": len(ours)}
    found = alice.client.get(uploads, {**query, "head_sha256": hashlib.sha256(head["ours"]).hexdigest().upper()})
    assert found.status_code == 200, found.content
    assert [item["id"] for item in found.json()["results"]] == [upload["id"]]
    # and for another file of the same name and size: none
    missed = alice.client.get(uploads, {**query, "head_sha256": hashlib.sha256(head["other"]).hexdigest()})
    assert missed.status_code == 200 and missed.json()["results"] == []
    # and the same for a file of another name or size
    assert alice.client.get(uploads, {"filename": "other.onnx"}).json()["results"] == []
    assert alice.client.get(uploads, {"size_bytes": len(ours) + 1}).json()["results"] == []
    # and a start of the other file with its sha256 does not take the open upload over: a new one
    other_body = {
        **body,
        "head": base64.b64encode(head["other"]).decode(),
        "sha256": hashlib.sha256(other).hexdigest(),
    }
    second = alice.client.post(uploads, other_body, format="json")
    assert second.status_code == 201, second.content
    assert second.json()["id"] != upload["id"]
    assert Upload.objects.get(pk=upload["id"]).sha256 == ""


@pytest.mark.parametrize(
    ("query", "field"),
    [({"head_sha256": "abc"}, "head_sha256"), ({"size_bytes": "big"}, "size_bytes"), ({"size_bytes": 0}, "size_bytes")],
)
def test_a_bad_filter_of_the_uploads_list_is_refused_naming_it(alice, s3, query, field):
    model_id = _model(alice)
    response = alice.client.get(f"/api/v1/models/{model_id}/uploads/", query)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


def test_an_upload_started_without_its_sha256_gets_it_at_completion(alice, s3, django_capture_on_commit_callbacks):
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    started = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/", {"filename": "model.onnx", "size_bytes": len(data)}, format="json"
    ).json()
    # a second start without a sha256 never takes an open upload over: nothing says it is the same file
    second = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/", {"filename": "model.onnx", "size_bytes": len(data)}, format="json"
    )
    assert second.status_code == 201 and second.json()["id"] != started["id"]
    (target,) = _urls(alice, model_id, started["id"], [1])
    assert requests.put(target["url"], data=data, headers=target["headers"], timeout=30).status_code == 200
    digest = hashlib.sha256(data).hexdigest()
    completed = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/{started['id']}/complete", {"sha256": digest.upper()}, format="json"
    )
    assert completed.status_code == 202, completed.content
    assert completed.json()["sha256"] == digest


def test_an_unreachable_store_is_a_503_and_leaves_no_reservation(alice, settings):
    settings.CONCH_STORAGE_URL = "s3://nowhere/conch"
    settings.CONCH_S3_ENDPOINT_URL = "http://127.0.0.1:9"  # the discard port: nothing listens
    settings.CONCH_S3_ACCESS_KEY_ID, settings.CONCH_S3_SECRET_ACCESS_KEY = "k", "s"
    model_id = _model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/uploads/",
        {"filename": "m.onnx", "size_bytes": 100, "sha256": "a" * 64},
        format="json",
    )
    assert response.status_code == 503, response.content
    assert "object store" in response.json()["detail"]
    assert Upload.objects.get().status == "aborted"
    assert _storage_used(alice.team) == 0


def test_the_parts_of_a_long_upload_are_listed_past_one_page(s3_store, s3_client):
    # given an S3 multipart upload holding 1,001 parts (ListParts answers 1,000 a page)
    key = f"models/1/uploads/{uuid.uuid4()}/model.onnx"
    upload_id = s3_store.start_multipart(key)
    for number in range(1, 1002):
        s3_client.upload_part(
            Bucket=s3_store.bucket, Key=f"conch/{key}", UploadId=upload_id, PartNumber=number, Body=b"p"
        )
    # when
    parts = s3_store.list_parts(key, upload_id)
    # then
    assert [part.number for part in parts] == list(range(1, 1002))
    s3_store.abort_multipart(key, upload_id)
    s3_store.abort_multipart(key, upload_id)  # an upload already gone is fine


@pytest.mark.django_db(transaction=True)
def test_two_starts_against_a_quota_that_fits_one_give_exactly_one_upload():
    # given room for one 6 MiB upload
    caller = make_caller("ada", "acme")
    set_quota(team=caller.team, limits={"storage_bytes": 10 * MIB})
    model_id = _model(caller)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def start(name: str) -> None:
        try:
            client = make_client(caller.token)
            barrier.wait()
            body = {"filename": name, "size_bytes": 6 * MIB, "sha256": "b" * 64}
            statuses.append(client.post(f"/api/v1/models/{model_id}/uploads/", body, format="json").status_code)
        finally:
            connection.close()

    # when two clients start different files at the same time
    threads = [threading.Thread(target=start, args=(name,)) for name in ("a.onnx", "b.onnx")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then exactly one started
    assert sorted(statuses) == [201, 409]
    assert Upload.objects.filter(status="uploading").count() == 1


def make_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _completed_version(caller, model_id: int, data: bytes, capture) -> ModelVersion:
    upload = _start(caller, model_id, data).json()
    (target,) = _urls(caller, model_id, upload["id"], [1])
    assert requests.put(target["url"], data=data, timeout=30).status_code == 200
    with capture():
        assert caller.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    return Upload.objects.get(pk=upload["id"]).version


def test_deleting_a_version_made_from_an_upload_deletes_its_file(alice, s3, django_capture_on_commit_callbacks):
    model_id = _model(alice)
    version = _completed_version(alice, model_id, os.urandom(2000), django_capture_on_commit_callbacks)
    end_current_build(version, "built")  # its build is not run here
    # when
    assert alice.client.delete(f"/api/v1/versions/{version.pk}/").status_code == 204
    # then its file, kept where the upload joined it, is gone with it
    assert s3() == {"keys": [], "pending": []}
    assert _storage_used(alice.team) == 0


def test_deleting_a_model_aborts_its_open_uploads_in_the_store(alice, s3):
    model_id = _model(alice)
    data = os.urandom(6 * MIB)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    (target,) = _urls(alice, model_id, upload["id"], [1])
    assert requests.put(target["url"], data=data[:PART], timeout=30).status_code == 200
    # when
    assert alice.client.delete(f"/api/v1/models/{model_id}/").status_code == 204
    # then no part is left stored (and billed) in the bucket, and the rows are gone with the model
    assert s3() == {"keys": [], "pending": []}
    assert not Upload.objects.exists()
    assert _storage_used(alice.team) == 0


def test_a_part_sent_again_with_other_bytes_after_complete_fails_the_size_check(
    alice, s3, django_capture_on_commit_callbacks
):
    # given a 6 MiB upload whose two parts are in the bucket and whose completion was accepted
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART).json()
    targets = _urls(alice, model_id, upload["id"], [1, 2])
    for target in targets:
        start = (target["number"] - 1) * PART
        assert requests.put(target["url"], data=data[start : start + PART], timeout=30).status_code == 200
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
    # when a client sends part 2 again, a byte longer, before the worker joins the parts
    assert requests.put(targets[1]["url"], data=data[PART:] + b"!", timeout=30).status_code == 200
    with django_capture_on_commit_callbacks() as queued:
        assert uploads.finish_upload(upload_id=upload["id"]) == "failed"
    # then the joined object's size (HeadObject) does not match: the upload fails naming size_bytes, no version
    failed = Upload.objects.get(pk=upload["id"])
    assert (failed.status, failed.error_field) == ("failed", "size_bytes")
    assert failed.error == (
        f"The joined file is {6 * MIB + 1} bytes, not the {6 * MIB} bytes promised (size_bytes): expected {6 * MIB}, "
        f"got {6 * MIB + 1}. Check the file and upload it again."
    )
    assert queued == [] and not ModelVersion.objects.exists()
    assert s3() == {"keys": [], "pending": []}
    assert _storage_used(alice.team) == 0


def test_the_bucket_cors_rule_of_the_readme_lets_a_browser_put_parts_and_read_the_etag(alice, s3, s3_client):
    # given the bucket configured with the rule docs/uploads.md documents, for the console's origin
    uploads_doc = (Path(__file__).resolve().parents[2] / "docs" / "uploads.md").read_text()
    rule = json.loads(uploads_doc.split('```json\n{"CORSRules"', 1)[1].split("```", 1)[0].join(['{"CORSRules"', ""]))
    origin = rule["CORSRules"][0]["AllowedOrigins"][0]
    s3_client.put_bucket_cors(Bucket=s3.bucket, CORSConfiguration=rule)
    model_id = _model(alice)
    upload = _start(alice, model_id, b"m" * 100).json()
    (target,) = _urls(alice, model_id, upload["id"], [1])
    # when a browser on the console's origin asks before its PUT (the preflight), then PUTs
    preflight = requests.options(
        target["url"], headers={"Origin": origin, "Access-Control-Request-Method": "PUT"}, timeout=30
    )
    put = requests.put(target["url"], data=b"m" * 100, headers={"Origin": origin}, timeout=30)
    # then both are allowed, and the ETag header is exposed to the page's script
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == origin
    assert put.status_code == 200
    assert put.headers["Access-Control-Allow-Origin"] == origin
    assert "ETag" in put.headers["Access-Control-Expose-Headers"].split(", ")
    assert put.headers["ETag"]


class _GeneratedBody:
    """A request body of `size` bytes made as it is read (a repeated 1 MiB block), so the test holds no copy."""

    def __init__(self, size: int) -> None:
        self.block = os.urandom(MIB)
        self.left = size
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        out = (self.block * (size // MIB + 1))[:size] if size > MIB else self.block[:size]
        self.left -= len(out)
        self.sha256.update(out)
        return out

    def readline(self, size: int = -1) -> bytes:  # a WSGI input stream has one; a raw body is never read by lines
        raise AssertionError("the part's body was read by lines")


def test_a_part_through_conch_streams_to_disk_without_holding_the_part(alice):
    # given a 32 MiB part of a folder-store upload, its bytes made only as the server reads them
    model_id = _model(alice)
    upload = _start(alice, model_id, b"z" * (40 * MIB), part_size_bytes=32 * MIB).json()
    body = _GeneratedBody(32 * MIB)
    url = f"/api/v1/models/{model_id}/uploads/{upload['id']}/parts/1"
    # when it is PUT, memory allocated by Python is traced
    tracemalloc.start()
    try:
        response = alice.client.put(
            url,
            data=b"",
            content_type="application/octet-stream",
            CONTENT_LENGTH=str(32 * MIB),
            **{"wsgi.input": body},
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # then the part went to disk a megabyte at a time: the peak is a few MiB, not the part's 32
    assert response.status_code == 200, response.content
    assert peak < 8 * MIB, peak
    assert body.left == 0
    assert response.json() == {"number": 1, "size_bytes": 32 * MIB, "etag": body.sha256.hexdigest()}


def test_completing_with_an_unknown_part_number_or_another_etag_is_refused_naming_the_part(alice):
    data = os.urandom(100)
    model_id = _model(alice)
    upload = _start(alice, model_id, data).json()
    url = f"/api/v1/models/{model_id}/uploads/{upload['id']}/"
    sent = alice.client.put(f"{url}parts/1", data=data, content_type="application/octet-stream").json()
    # when the client names a part the upload does not have
    unknown = alice.client.post(f"{url}complete", {"parts": [{"number": 2, "etag": "x"}]}, format="json")
    # then
    assert unknown.status_code == 400
    assert unknown.json() == {
        "detail": "parts names part 2, which this upload does not have: its parts are 1 to 1. Send the numbers and "
        "ETags of those parts, or no `parts` at all.",
        "field": "parts",
    }
    # and an ETag other than the stored part's is refused, naming the part
    other = alice.client.post(f"{url}complete", {"parts": [{"number": 1, "etag": "0" * 64}]}, format="json")
    assert other.status_code == 409
    assert other.json()["detail"].startswith(f"Part 1 in the object store has ETag {sent['etag']}, not {'0' * 64}")
    assert Upload.objects.get().status == "uploading"


@pytest.mark.triton
def test_a_real_model_sent_straight_to_the_bucket_is_built_like_an_ordinary_upload(
    alice, s3, eager_tasks, django_capture_on_commit_callbacks
):
    # given the demo classifier, in parts of 5 MiB, with build options
    data = real_models.classifier().read_bytes()
    model_id = _model(alice, "classifier")
    upload = _start(alice, model_id, data, part_size_bytes=PART, build_options={"max_batch_size": 8}).json()
    targets = _urls(alice, model_id, upload["id"], list(range(1, upload["part_count"] + 1)))
    for target in targets:
        start = (target["number"] - 1) * PART
        assert requests.put(target["url"], data=data[start : start + PART], timeout=30).status_code == 200
    # when it completes, and the check and then the build run inline (eager Celery, on commit)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete")
    assert response.status_code == 202, response.content
    # then the upload made a version, built from the bytes that went to the bucket
    done = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/").json()
    assert done["status"] == "completed", done["error"]
    version = alice.client.get(f"/api/v1/versions/{done['version']}/").json()
    assert version["status"] == "built", version["error"]
    assert version["source"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert version["source"]["sha256_checked"] is True
    # and its inspect step checked the promised SHA-256 on the file it downloaded
    inspect_log = [line.split(" ", 1)[1] for line in version["steps"][0]["log"]]
    assert inspect_log[1:3] == [
        f"checking sha256 of the uploaded file against {hashlib.sha256(data).hexdigest()} (promised at upload)",
        "checking sha256 … ok",
    ]
    assert "max_batch_size: 8" in version["config_pbtxt"]


@pytest.mark.parametrize(
    ("size_bytes", "planned"),
    [
        (1, (16 * MIB, 1)),
        (2**30, (16 * MIB, 64)),  # 1 GiB: 64 parts of 16 MiB
        (2**30 + 1, (16 * MIB, 65)),
        (200 * 2**30, (21 * MIB, 9753)),  # past 10,000 parts of 16 MiB: the next whole MiB that fits
    ],
)
def test_without_a_part_size_conch_plans_16_mib_parts_or_the_least_whole_mib_under_10000_parts(size_bytes, planned):
    assert uploads.plan_parts(size_bytes=size_bytes) == planned


# --- Per-part CRC32 (part_checksum_algorithm) ---------------------------------------------------------------------


def _crc32(data: bytes) -> str:
    """`x-amz-checksum-crc32` of `data`: base64 of the 4 big-endian bytes of its CRC32."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _sign(caller, model_id: int, upload_id: str, body: dict):
    return caller.client.post(f"/api/v1/models/{model_id}/uploads/{upload_id}/parts/", body, format="json")


def test_a_crc32_upload_to_the_bucket_signs_each_part_s_checksum_and_the_object_gets_a_composite_crc32(
    alice, s3, s3_client, django_capture_on_commit_callbacks
):
    # given a 12 MiB file in parts of 5 MiB, started with part_checksum_algorithm CRC32
    data = os.urandom(12 * MIB + 7)
    chunks = [data[start : start + PART] for start in range(0, len(data), PART)]
    model_id = _model(alice)
    started = _start(alice, model_id, data, part_size_bytes=PART, part_checksum_algorithm="CRC32")
    # then the upload says so, and the bucket's multipart upload declares CRC32
    assert started.status_code == 201, started.content
    upload = started.json()
    assert upload["part_checksum_algorithm"] == "CRC32"
    assert Upload.objects.get().part_checksum_algorithm == "CRC32"
    (pending,) = s3_client.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]
    assert pending["ChecksumAlgorithm"] == "CRC32"
    # when part URLs are asked for without a checksum for each
    refused = _sign(alice, model_id, upload["id"], {"numbers": [1, 2]})
    # then none is given: 400 naming the first part without one, saying what to send
    assert refused.status_code == 400, refused.content
    assert refused.json() == {
        "detail": "This upload checks each part's CRC32 (part_checksum_algorithm CRC32): send checksums "
        f'{{"1": "<base64 of the 4 big-endian bytes of the CRC32 of bytes 0 to {PART - 1} of the file>"}}, 8 '
        'characters (Python: base64.b64encode(zlib.crc32(part).to_bytes(4, "big"))); got none.',
        "field": "checksums.1",
    }
    partial = _sign(alice, model_id, upload["id"], {"numbers": [1, 2], "checksums": {"1": _crc32(chunks[0])}})
    assert (partial.status_code, partial.json()["field"]) == (400, "checksums.2")
    malformed = _sign(alice, model_id, upload["id"], {"numbers": [1], "checksums": {"1": "not-a-crc"}})
    assert (malformed.status_code, malformed.json()["field"]) == (400, "checksums.1")
    assert malformed.json()["detail"].endswith("got 'not-a-crc'.")
    stray = _sign(
        alice, model_id, upload["id"], {"numbers": [1], "checksums": {"1": _crc32(chunks[0]), "3": "AAAAAA=="}}
    )
    assert (stray.status_code, stray.json()["field"]) == (400, "checksums.3")
    # when they are asked for with each part's CRC32
    checksums = {str(n): _crc32(chunk) for n, chunk in enumerate(chunks, start=1)}
    signed = _sign(alice, model_id, upload["id"], {"numbers": [1, 2, 3], "checksums": checksums})
    assert signed.status_code == 200, signed.content
    # then each URL signs the checksum headers (botocore's SigV4 query signing) and `headers` carries them
    for target in signed.json()["parts"]:
        crc = checksums[str(target["number"])]
        assert target["headers"] == {"x-amz-checksum-crc32": crc, "x-amz-sdk-checksum-algorithm": "CRC32"}
        query = parse_qs(urlsplit(target["url"]).query)
        assert query["X-Amz-SignedHeaders"] == ["host;x-amz-checksum-crc32;x-amz-sdk-checksum-algorithm"]
    # and a PUT of the part's bytes with exactly those headers is stored. (moto checks neither the signature of a
    # presigned URL nor the CRC32's value; AWS S3 and MinIO answer 403 SignatureDoesNotMatch to a PUT without the
    # signed headers and 400 BadDigest to bytes with another CRC32, which the folder store's test shows Conch doing.)
    for target, chunk in zip(signed.json()["parts"], chunks, strict=True):
        answer = requests.put(target["url"], data=chunk, headers=target["headers"], timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-amz-checksum-crc32"] == checksums[str(target["number"])]
    # when it is completed and the worker joins the parts
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    # then the object holds the file, with S3's COMPOSITE CRC32: the CRC32 of the parts' CRC32s, not of the bytes
    # (AWS S3 appends "-<part count>" and says ChecksumType COMPOSITE; moto's HeadObject does neither when the
    # upload declared no ChecksumType, CRC32's default)
    version = Upload.objects.get(pk=upload["id"]).version
    assert get_object_store().read_bytes(version.source_key) == data
    head = s3_client.head_object(Bucket=s3.bucket, Key=f"conch/{version.source_key}", ChecksumMode="ENABLED")
    composite = _crc32(b"".join(zlib.crc32(chunk).to_bytes(4, "big") for chunk in chunks))
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-checksum-algorithm"] == "CRC32"
    assert head["ChecksumCRC32"].split("-")[0] == composite != _crc32(data)
    assert head.get("ChecksumType", "COMPOSITE") == "COMPOSITE"


def test_a_folder_store_refuses_a_part_whose_bytes_do_not_match_its_crc32_naming_it_and_takes_it_again(
    alice, django_capture_on_commit_callbacks
):
    # given a folder-store upload with CRC32 of 11 MiB in parts of 5 MiB, part 1 stored
    data = os.urandom(11 * MIB)
    chunks = [data[start : start + PART] for start in range(0, len(data), PART)]
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART, part_checksum_algorithm="CRC32").json()
    assert (upload["transport"], upload["part_checksum_algorithm"]) == ("conch", "CRC32")
    checksums = {str(n): _crc32(chunk) for n, chunk in enumerate(chunks, start=1)}
    targets = _sign(alice, model_id, upload["id"], {"numbers": [1, 2, 3], "checksums": checksums}).json()["parts"]
    # then each part's headers carry its CRC32
    assert [t["headers"] for t in targets] == [
        {"Content-Type": "application/octet-stream", "x-amz-checksum-crc32": checksums[str(n)]} for n in (1, 2, 3)
    ]

    def put(number: int, body: bytes, headers: dict):
        extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
        return alice.client.put(targets[number - 1]["url"], data=body, content_type="application/octet-stream", **extra)

    crc_header = {"x-amz-checksum-crc32": checksums["1"]}
    assert put(1, chunks[0], crc_header).status_code == 200
    # when part 2 arrives damaged (one byte changed on the way), with its CRC32
    damaged = chunks[1][:100] + bytes([chunks[1][100] ^ 1]) + chunks[1][101:]
    refused = put(2, damaged, {"x-amz-checksum-crc32": checksums["2"]})
    # then it is refused naming the part and saying to send it again; nothing is kept of it, part 1 stays
    assert refused.status_code == 400, refused.content
    assert refused.json() == {
        "detail": f"Part 2's {PART} bytes have CRC32 {_crc32(damaged)}, not the {checksums['2']} its "
        "x-amz-checksum-crc32 header gives: they changed on the way. This copy was not kept (the parts already stored "
        "are); send part 2 again.",
        "field": "parts[2]",
    }
    stored = get_object_store().list_parts(Upload.objects.get().object_key, Upload.objects.get().store_upload_id)
    assert [part.number for part in stored] == [1]
    # and a part without the header is refused naming its checksum
    missing = put(3, chunks[2], {})
    assert (missing.status_code, missing.json()["field"]) == (400, "checksums.3")
    assert missing.json()["detail"].startswith("Part 3 needs the x-amz-checksum-crc32 header its part URL gave")
    # when part 2 is sent again whole, and part 3 with its CRC32, and the upload completes
    assert put(2, chunks[1], {"x-amz-checksum-crc32": checksums["2"]}).status_code == 200
    assert put(3, chunks[2], {"x-amz-checksum-crc32": checksums["3"]}).status_code == 200
    with django_capture_on_commit_callbacks():
        assert alice.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete").status_code == 202
        assert uploads.finish_upload(upload_id=upload["id"]) == "completed"
    # then the version holds the file
    assert get_object_store().read_bytes(Upload.objects.get().version.source_key) == data


def test_a_stored_part_survives_a_damaged_copy_of_it_sent_again(alice):
    # given a folder-store CRC32 upload whose part 1 is stored
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART, part_checksum_algorithm="CRC32").json()
    url = f"/api/v1/models/{model_id}/uploads/{upload['id']}/parts/1"
    crc = _crc32(data[:PART])
    first = alice.client.put(
        url, data=data[:PART], content_type="application/octet-stream", HTTP_X_AMZ_CHECKSUM_CRC32=crc
    )
    assert first.status_code == 200
    # when a damaged copy of part 1 comes again
    again = alice.client.put(
        url, data=b"x" + data[1:PART], content_type="application/octet-stream", HTTP_X_AMZ_CHECKSUM_CRC32=crc
    )
    # then it is refused and the stored copy is still there, unchanged
    assert (again.status_code, again.json()["field"]) == (400, "parts[1]")
    (part,) = get_object_store().list_parts(Upload.objects.get().object_key, Upload.objects.get().store_upload_id)
    assert (part.number, part.etag) == (1, hashlib.sha256(data[:PART]).hexdigest())


@pytest.mark.parametrize("value", ["MD5", "crc32", "", 32])
def test_a_part_checksum_algorithm_other_than_crc32_is_refused_naming_it(alice, s3, value):
    data = os.urandom(1000)
    model_id = _model(alice)
    response = _start(alice, model_id, data, part_checksum_algorithm=value)
    assert response.status_code == 400, response.content
    assert response.json() == {
        "detail": 'part_checksum_algorithm: must be "CRC32" (each part sent with its CRC32) or null (parts without '
        f'checksums); got "{value}".',
        "field": "part_checksum_algorithm",
    }
    assert not Upload.objects.exists() and s3() == {"keys": [], "pending": []}


def test_an_upload_without_the_algorithm_takes_parts_as_before_and_no_checksums(alice, s3, s3_client):
    # given an upload started with part_checksum_algorithm null (as a client from before it)
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data, part_size_bytes=PART, part_checksum_algorithm=None).json()
    # then it has none, and neither has the bucket's multipart upload
    assert upload["part_checksum_algorithm"] is None
    (pending,) = s3_client.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]
    assert "ChecksumAlgorithm" not in pending
    # and its part URLs come without checksum headers, signing none
    (target,) = _urls(alice, model_id, upload["id"], [1])
    assert target["headers"] == {}
    assert parse_qs(urlsplit(target["url"]).query)["X-Amz-SignedHeaders"] == ["host"]
    # and checksums sent for it are refused naming them
    refused = _sign(alice, model_id, upload["id"], {"numbers": [1], "checksums": {"1": _crc32(data[:PART])}})
    assert (refused.status_code, refused.json()["field"]) == (400, "checksums")
    assert "started without part_checksum_algorithm" in refused.json()["detail"]


def test_a_start_with_crc32_resumes_an_open_upload_without_it_but_not_the_other_way(alice, s3):
    data = os.urandom(6 * MIB)
    model_id = _model(alice)
    # given an open upload started without the algorithm
    plain = _start(alice, model_id, data, part_size_bytes=PART).json()
    # when the same file is started with CRC32 (a newer client resuming)
    resumed = _start(alice, model_id, data, part_size_bytes=PART, part_checksum_algorithm="CRC32")
    # then it gets that upload back, as it is: its parts go without checksums
    assert (resumed.status_code, resumed.json()["id"]) == (200, plain["id"])
    assert resumed.json()["part_checksum_algorithm"] is None
    # given an open upload of another file started with CRC32
    other = os.urandom(6 * MIB)
    with_crc = _start(alice, model_id, other, part_size_bytes=PART, part_checksum_algorithm="CRC32").json()
    # when that file is started without it (a client that cannot send checksums)
    fresh = _start(alice, model_id, other, part_size_bytes=PART)
    # then it gets a new upload, not the one it could not finish
    assert fresh.status_code == 201, fresh.content
    assert fresh.json()["id"] != with_crc["id"] and fresh.json()["part_checksum_algorithm"] is None


def _completing_upload(caller, data: bytes, capture=contextlib.nullcontext) -> tuple[int, str]:
    """A folder-store upload of `data` in one part, completed by its client: `completing`, its check not run
    (`capture` keeps it from the queue; in a transactional test it goes to the broker, which no worker reads)."""
    model_id = _model(caller)
    upload = _start(caller, model_id, data).json()
    (target,) = _urls(caller, model_id, upload["id"], [1])
    assert caller.client.put(target["url"], data=data, content_type="application/octet-stream").status_code == 200
    with capture():  # the check is queued, not run
        completed = caller.client.post(f"/api/v1/models/{model_id}/uploads/{upload['id']}/complete")
    assert completed.status_code == 202 and completed.json()["status"] == "completing"
    return model_id, upload["id"]


def test_a_get_that_waits_for_a_check_nobody_runs_answers_completing_when_its_time_is_up_without_polling(
    alice, django_capture_on_commit_callbacks, monkeypatch
):
    from django.test.utils import CaptureQueriesContext

    model_id, upload_id = _completing_upload(alice, os.urandom(MIB), django_capture_on_commit_callbacks)
    url = f"/api/v1/models/{model_id}/uploads/{upload_id}/"
    # when a GET waits 1 s for a check nobody runs
    with CaptureQueriesContext(connection) as queries:
        answer = alice.client.get(url, {"wait": "1"})
    # then it answers `completing` when its time is up, having read the upload's row a fixed number of times (it
    # waited for a notification, not in a loop of queries)
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "completing"
    reads = [query["sql"] for query in queries.captured_queries if '"uploads_upload"' in query["sql"]]
    assert len(reads) <= 4, reads
    # and a wait longer than the server holds a request is cut to MAX_WAIT_S: the answer still comes
    monkeypatch.setattr(checks, "MAX_WAIT_S", 0.1)
    answer = alice.client.get(url, {"wait": "3600"})
    assert answer.status_code == 200 and answer.json()["status"] == "completing"


def test_a_get_that_waits_answers_at_once_for_an_upload_that_is_not_completing(alice, monkeypatch):
    data = os.urandom(MIB)
    model_id = _model(alice)
    upload = _start(alice, model_id, data).json()
    monkeypatch.setattr(checks.time, "sleep", lambda pause: pytest.fail(f"waited {pause} s on an open upload"))
    answer = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/", {"wait": "10"})
    assert answer.status_code == 200 and answer.json()["status"] == "uploading"


@pytest.mark.django_db(transaction=True)
def test_a_get_that_waits_answers_as_soon_as_the_worker_s_check_ends():
    caller = make_caller("alice", "acme")
    data = os.urandom(MIB)
    model_id, upload_id = _completing_upload(caller, data)

    def worker() -> None:  # the worker's check, on another connection, once the GET below waits
        try:
            time.sleep(0.3)
            assert uploads.finish_upload(upload_id=upload_id) == "completed"  # its version's build is queued
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    answer = caller.client.get(f"/api/v1/models/{model_id}/uploads/{upload_id}/", {"wait": "60"})
    thread.join()
    assert answer.status_code == 200, answer.content
    done = answer.json()
    assert done["status"] == "completed" and done["version"] == Upload.objects.get(pk=upload_id).version_id


@pytest.mark.parametrize(("wait", "says"), [("-1", "greater than or equal to 0"), ("soon", "valid number")])
def test_a_bad_wait_is_refused_naming_it(alice, wait, says):
    model_id = _model(alice)
    upload = _start(alice, model_id, os.urandom(MIB)).json()
    answer = alice.client.get(f"/api/v1/models/{model_id}/uploads/{upload['id']}/", {"wait": wait})
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == "wait" and says in answer.json()["detail"]


def test_the_file_check_answers_with_the_upload_starts_rules_and_stores_nothing(alice):
    # given the first bytes of a real ONNX model, of a ZIP file, and a name Conch does not build
    onnx_head = real_models.classifier().read_bytes()[:512]

    def check(filename: str, head: bytes, **extra):
        body = {"filename": filename, "head": base64.b64encode(head).decode(), **extra}
        return alice.client.post("/api/v1/uploads/check/", body, format="json")

    # when each is checked
    good = check("model.onnx", onnx_head, size_bytes=123456)
    zipped = check("model.onnx", b"PK\x03\x04" + os.urandom(60))
    named = check("weights.safetensors", onnx_head)
    empty = check("model.onnx", b"")
    # then the ONNX file is built as onnx; the others are refused with the start's own messages, naming the field
    assert (good.status_code, good.json()) == (
        200,
        {"format": "onnx", "title": "ONNX model", "served_as": "onnxruntime", "conversion": None},
    )
    assert zipped.status_code == 400 and zipped.json()["field"] == "head"
    assert zipped.json()["detail"].startswith("This is not an ONNX model: it looks like a ZIP archive")
    assert named.status_code == 400 and named.json()["field"] == "filename"
    assert "a .safetensors file is usually a weights file" in named.json()["detail"]
    assert empty.status_code == 400 and empty.json()["field"] == "head"
    # and nothing was reserved or stored; a caller without credentials is refused
    assert not Upload.objects.exists()
    assert APIClient().post("/api/v1/uploads/check/", {}, format="json").status_code == 401

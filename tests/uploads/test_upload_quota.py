"""Uploads against the team's storage quota, on the S3 store (a real S3 protocol server): refused before any byte
is read when the declared body cannot fit, as soon as the streamed bytes pass what is free, and again under the
team's lock once stored."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.verification import MAX_SAMPLE_INPUTS_BYTES
from conch.errors import QuotaExceeded
from conch.upload_handlers import MULTIPART_SLACK_BYTES
from models_registry import services as registry
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.storage import StoredObject
from tenancy.quotas import set_quota
from tests.tiny_models import onnx_like

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024


@pytest.fixture
def s3(settings, s3_server, s3_bucket, s3_client):
    """Conch's object store is a bucket on the S3 protocol server; returns a function telling what it holds."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key

    def held() -> dict[str, list]:
        keys = [item["Key"] for item in s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        pending = [item["Key"] for item in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
        return {"keys": keys, "pending": pending}

    return held


def _model(caller) -> int:
    response = caller.client.post("/api/v1/models/", {"name": "blob", "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_a_declared_body_that_cannot_fit_is_refused_before_any_byte_is_read(alice, s3):
    # given 1000 bytes of storage, and a request declaring a body 5000 bytes past all it may hold besides the file
    set_quota(team=alice.team, limits={"storage_bytes": 1000})
    model_id = _model(alice)
    declared = MULTIPART_SLACK_BYTES + MAX_SAMPLE_INPUTS_BYTES + 5000
    # when (the body sent is much shorter than declared: were it read, the parser would fail on it)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/",
        data=b"--x\r\n",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(declared),
    )
    # then
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": "Storage quota exceeded: team 'acme' uses 0 of 1000 bytes of storage; this upload needs at least "
        "5000",
        "field": "storage_bytes",
        "quota": {"limit": 1000, "used": 0, "requested": 5000},
    }
    assert not ModelVersion.objects.exists()
    assert s3() == {"keys": [], "pending": []}


def test_a_streamed_file_is_stopped_once_it_passes_what_is_free_leaving_nothing(alice, s3):
    # given 5 MiB free, and a 12 MiB file in a body too small to tell (within the multipart slack)
    set_quota(team=alice.team, limits={"storage_bytes": 5 * MIB})
    model_id = _model(alice)
    # when
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"\1" * (12 * MIB)))}
    )
    # then it stopped at the first 2 MiB chunk past the room (the parser's chunks start after the part's headers)
    assert response.status_code == 409, response.content
    received = response.json()["quota"]["requested"]
    assert 5 * MIB < received <= 6 * MIB
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses 0 of {5 * MIB} bytes of storage; this upload needs at "
        f"least {received}",
        "field": "storage_bytes",
        "quota": {"limit": 5 * MIB, "used": 0, "requested": received},
    }
    assert not ModelVersion.objects.exists()
    assert s3() == {"keys": [], "pending": []}
    # and a file that fits goes through
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"\2" * (4 * MIB)))}
    )
    assert response.status_code == 201, response.content


def test_the_stored_size_is_checked_again_under_the_lock_when_the_upload_completes(alice, s3):
    # given room for 100 bytes when an upload starts
    set_quota(team=alice.team, limits={"storage_bytes": 100})
    model = RegisteredModel.objects.create(team=alice.team, name="blob")
    version = registry.reserve_version(model=model, user=alice.user)
    assert registry.check_upload_room(model=model, declared_bytes=80).free == 100
    # and another upload of 60 bytes completing first
    other = registry.reserve_version(model=model, user=alice.user)
    registry.complete_upload(
        version=other, stored=StoredObject(other.source_key, 60, "0" * 64), filename="a.onnx", build_options={}
    )
    # when the first completes with its 80 bytes
    with pytest.raises(QuotaExceeded) as refused:
        registry.complete_upload(
            version=version, stored=StoredObject(version.source_key, 80, "1" * 64), filename="b.onnx", build_options={}
        )
    # then
    assert refused.value.quota == {"limit": 100, "used": 60, "requested": 80}
    assert ModelVersion.objects.get(pk=version.pk).status == "uploading"

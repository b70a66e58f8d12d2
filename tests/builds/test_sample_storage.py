"""Sample inputs (the `.npz` a version's verify step and a hot update's warm-up send as test inferences) in the team's
storage quota: stored beside the uploaded file, they count with it, are refused past the limit with the storage
quota's answer, are counted in place of the old ones when a rebuild replaces them, and are freed with the version.
On a bucket of the S3 protocol server (moto)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from models_registry.models import ModelVersion
from tenancy.quotas import set_quota
from tests.build_records import end_current_build
from tests.tiny_models import onnx_like

pytestmark = pytest.mark.django_db

MODEL = onnx_like(b"\1" * 4000)


@pytest.fixture
def s3(settings, s3_server, s3_bucket, s3_client):
    """Conch's object store is a bucket on the S3 protocol server; returns a function listing {key: size} under a
    prefix of Conch's."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key

    def held(prefix: str = "") -> dict[str, int]:
        listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"conch/{prefix}").get("Contents", [])
        return {item["Key"][len("conch/") :]: item["Size"] for item in listed}

    return held


def _npz(rows: int) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.arange(rows * 4, dtype=np.float32).reshape(rows, 4))
    return buffer.getvalue()


def _storage(caller) -> int:
    response = caller.client.get(f"/api/v1/teams/{caller.team.slug}/usage")
    assert response.status_code == 200, response.content
    return next(line for line in response.json()["quotas"] if line["field"] == "storage_bytes")["used"]


def _model(caller) -> int:
    response = caller.client.post("/api/v1/models/", {"name": "adder", "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _upload(caller, model_id: int, samples: bytes):
    # The build is queued on commit, which the test's transaction never reaches: nothing is built.
    return caller.client.post(
        f"/api/v1/models/{model_id}/versions/",
        {"file": SimpleUploadedFile("m.onnx", MODEL), "sample_inputs": SimpleUploadedFile("s.npz", samples)},
    )


def test_sample_inputs_count_in_storage_until_their_version_is_deleted(alice, s3):
    # given
    model_id = _model(alice)
    samples = _npz(2)
    # when a version is uploaded with sample inputs
    response = _upload(alice, model_id, samples)
    # then the bucket holds them beside the file, and the team's storage counts both
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    root = f"models/{model_id}/versions/{version.number}/source/"
    assert s3(root) == {f"{root}model.onnx": len(MODEL), f"{root}sample_inputs.npz": len(samples)}
    assert version.samples_size_bytes == len(samples)
    assert _storage(alice) == len(MODEL) + len(samples)
    # when the version is deleted (its build failed: nothing serves it)
    end_current_build(version, "failed")
    assert alice.client.delete(f"/api/v1/versions/{version.pk}/").status_code == 204
    # then the samples left the bucket with the file, and the storage is free
    assert s3(f"models/{model_id}/") == {}
    assert _storage(alice) == 0


def test_an_upload_whose_sample_inputs_do_not_fit_is_refused_like_any_storage_refusal(alice, s3):
    # given room for the file, and for its sample inputs but one byte
    model_id = _model(alice)
    samples = _npz(2)
    limit = len(MODEL) + len(samples) - 1
    set_quota(team=alice.team, limits={"storage_bytes": limit})
    # when
    response = _upload(alice, model_id, samples)
    # then the storage quota's answer, and nothing is kept
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses 0 of {limit} bytes of storage; this upload with its "
        f"sample inputs needs {len(MODEL) + len(samples)}",
        "field": "storage_bytes",
        "quota": {"limit": limit, "used": 0, "requested": len(MODEL) + len(samples)},
    }
    assert not ModelVersion.objects.exists()
    assert s3() == {}
    # and with one byte more it goes through
    set_quota(team=alice.team, limits={"storage_bytes": limit + 1})
    assert _upload(alice, model_id, samples).status_code == 201


def test_a_rebuild_s_new_sample_inputs_count_in_place_of_the_old_ones(alice, s3):
    # given a version with small sample inputs, its build failed
    model_id = _model(alice)
    small, large = _npz(1), _npz(64)
    version = ModelVersion.objects.get(pk=_upload(alice, model_id, small).json()["id"])
    end_current_build(version, "failed")
    key = f"models/{model_id}/versions/{version.number}/source/sample_inputs.npz"
    # and room for the larger samples but one byte, once the small ones are given back
    limit = len(MODEL) + len(large) - 1
    set_quota(team=alice.team, limits={"storage_bytes": limit})
    # when a rebuild sends the larger samples
    url = f"/api/v1/versions/{version.pk}/rebuild/"
    response = alice.client.post(url, {"sample_inputs": SimpleUploadedFile("s.npz", large)})
    # then refused as storage, the old samples kept and counted, the new ones not left in the bucket
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses {len(MODEL)} of {limit} bytes of storage; these sample "
        f"inputs needs {len(large)}",
        "field": "storage_bytes",
        "quota": {"limit": limit, "used": len(MODEL), "requested": len(large)},
    }
    assert s3(f"models/{model_id}/versions/{version.number}/source/") == {
        f"models/{model_id}/versions/{version.number}/source/model.onnx": len(MODEL),
        key: len(small),
    }
    assert _storage(alice) == len(MODEL) + len(small)
    # when there is room
    set_quota(team=alice.team, limits={"storage_bytes": limit + 1})
    response = alice.client.post(url, {"sample_inputs": SimpleUploadedFile("s.npz", large)})
    # then the new samples replace the old ones, in the bucket and in the count
    assert response.status_code == 202, response.content
    assert s3(key) == {key: len(large)}
    assert _storage(alice) == len(MODEL) + len(large)


def test_sample_inputs_stored_before_they_were_counted_are_measured_by_the_sweep(alice, s3):
    from builds.services import sweep_stalled_versions

    # given a version whose sample inputs are stored but counted as 0 (as in a database from before Conch counted
    # them)
    model_id = _model(alice)
    samples = _npz(3)
    version = ModelVersion.objects.get(pk=_upload(alice, model_id, samples).json()["id"])
    ModelVersion.objects.filter(pk=version.pk).update(samples_size_bytes=0)
    assert _storage(alice) == len(MODEL)
    # when the periodic sweep runs
    counts = sweep_stalled_versions()
    # then their size is recorded and counts in the team's storage
    version.refresh_from_db()
    assert counts["measured_samples"] == 1
    assert version.samples_size_bytes == len(samples)
    assert _storage(alice) == len(MODEL) + len(samples)

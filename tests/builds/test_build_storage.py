"""Build outputs in the storage quota: a build reserves its repository's bytes before writing it (and fails, saying
so, when they do not fit); they count until the repository is deleted."""

from __future__ import annotations

import onnx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.models import Build, BuildRepository
from builds.services import collect_repository_garbage, current_build, served_repository_prefix
from builds.services.storage import reserve_repository_storage
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from tenancy.quotas import set_quota, team_usage
from tests.deployments.conftest import write_built_version
from tests.tiny_models import add_constant

pytestmark = pytest.mark.django_db


def _storage_used(team) -> int:
    return next(line.used for line in team_usage(team=team) if line.field == "storage_bytes")


def _upload(caller, data: bytes, capture) -> dict:
    model_id = caller.client.post("/api/v1/models/", {"name": "adder", "team": "acme"}, format="json").json()["id"]
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{model_id}/versions/",
            {"file": SimpleUploadedFile("m.onnx", data), "max_batch_size": "4"},
        )
    assert response.status_code == 201, response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


@pytest.mark.triton
def test_a_build_records_its_repository_size_and_it_counts_in_storage(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given
    data = add_constant(tmp_path / "adder.onnx", 1.0).read_bytes()
    # when the upload is built (verified on a real Triton)
    version = _upload(alice, data, django_capture_on_commit_callbacks)
    # then
    assert version["status"] == "built", version["error"]
    repository_bytes = len(data) + len(version["config_pbtxt"].encode())
    row = BuildRepository.objects.get(version_id=version["id"])
    assert (row.attempt, row.prefix, row.size_bytes) == (1, version["repository_prefix"], repository_bytes)
    store = get_object_store()
    assert sum(store.size(key) for key in store.list_keys(row.prefix + "/")) == repository_bytes
    assert _storage_used(alice.team) == len(data) + repository_bytes
    write_log = next(step["log"] for step in version["steps"] if step["name"] == "write_repository")
    assert write_log[0].endswith(f"({repository_bytes} bytes)")


def test_a_build_whose_repository_does_not_fit_fails_saying_so_and_writes_nothing(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given room for the upload but not for its build's copy
    data = add_constant(tmp_path / "adder.onnx", 1.0).read_bytes()
    set_quota(team=alice.team, limits={"storage_bytes": len(data) + 10})
    # when
    version = _upload(alice, data, django_capture_on_commit_callbacks)
    # then
    assert version["status"] == "failed"
    needed = len(data) + len(version["config_pbtxt"].encode())
    assert version["error"] == (
        f"Storage quota exceeded: team 'acme' uses {len(data)} of {len(data) + 10} bytes of storage; this build's "
        f"repository needs {needed}. Delete versions the team no longer needs (DELETE /api/v1/versions/{{id}}/) or "
        "ask a platform admin for more storage, then rebuild."
    )
    assert version["error_field"] == "storage_bytes"
    assert {step["name"]: step["status"] for step in version["steps"]} == {
        "inspect": "succeeded",
        "configure": "succeeded",
        "write_repository": "failed",
        "verify": "skipped",
    }
    assert get_object_store().list_keys(f"models/{version['model']}/versions/1/repository/") == []
    assert not BuildRepository.objects.exists()
    assert _storage_used(alice.team) == len(data)


def test_a_redelivered_attempt_reserves_in_place_of_its_own_reservation(alice, tmp_path):
    # given an attempt that reserved its repository, and a limit it exactly fills
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "a.onnx", 1.0))
    set_quota(team=alice.team, limits={"storage_bytes": version.source_size_bytes + 500})
    reserve_repository_storage(version=version, attempt=1, prefix=served_repository_prefix(version), size_bytes=500)
    # when the same attempt runs again (a redelivered task)
    reserve_repository_storage(version=version, attempt=1, prefix=served_repository_prefix(version), size_bytes=500)
    # then it is counted once
    assert BuildRepository.objects.count() == 1
    assert _storage_used(alice.team) == version.source_size_bytes + 500


def test_collecting_an_unused_attempt_repository_frees_its_storage(alice, tmp_path):
    # given a version built twice: attempt 1's repository is no longer current
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "a.onnx", 1.0))
    store = get_object_store()
    old_prefix = served_repository_prefix(version)
    new_prefix = old_prefix.replace("attempt-1", "attempt-2")
    for key in store.list_keys(old_prefix + "/"):
        store.copy(key, new_prefix + key[len(old_prefix) :])
    reserve_repository_storage(version=version, attempt=1, prefix=old_prefix, size_bytes=300)
    reserve_repository_storage(version=version, attempt=2, prefix=new_prefix, size_bytes=300)
    Build.objects.create(version=version, attempt=2, status="succeeded", repository_prefix=new_prefix)
    assert _storage_used(alice.team) == version.source_size_bytes + 600
    # when the garbage collector runs
    assert collect_repository_garbage(keep=[], grace_seconds=0) == 1
    # then attempt 1 no longer counts
    assert store.list_keys(old_prefix + "/") == []
    assert list(BuildRepository.objects.values_list("attempt", flat=True)) == [2]
    assert _storage_used(alice.team) == version.source_size_bytes + 300


@pytest.fixture
def s3_storage(settings, s3_server, s3_bucket, s3_client):
    """Conch's object store is a bucket of the S3 protocol server; returns a function listing every key in it."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key
    return lambda: sorted(item["Key"] for item in s3_client.list_objects_v2(Bucket=bucket).get("Contents", []))


def _batch_mixing_model() -> bytes:
    """y = x - mean(x over axis 0), x FP32 [batch, 4]: each answer depends on the other requests of the batch, so
    verify (a real Triton) refuses the max_batch_size asked for, after the build wrote its repository."""
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            onnx.helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        "batch_mixing",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.triton
def test_a_failed_build_frees_its_repository_keeps_the_upload_and_deleting_the_version_frees_the_rest(
    alice, eager_tasks, django_capture_on_commit_callbacks, s3_storage, tmp_path
):
    # given a model whose build writes its repository, then fails at verify (on S3 storage)
    data = _batch_mixing_model()
    # when it is uploaded and built
    version = _upload(alice, data, django_capture_on_commit_callbacks)
    # then the build failed after writing the repository
    assert (version["status"], version["error_field"]) == ("failed", "max_batch_size"), version["error"]
    assert {step["name"]: step["status"] for step in version["steps"]} == {
        "inspect": "succeeded",
        "configure": "succeeded",
        "write_repository": "succeeded",
        "verify": "failed",
    }
    # and that repository is gone from the bucket and from the storage count: only the uploaded file is stored
    source = f"conch/{version['source']['key']}"
    assert s3_storage() == [source]
    assert not BuildRepository.objects.exists()
    assert _storage_used(alice.team) == len(data)
    shown = alice.client.get(f"/api/v1/teams/{alice.team.slug}/usage/").json()["quotas"]
    assert next(line for line in shown if line["field"] == "storage_bytes")["used"] == len(data)
    # and the upload is kept, so the version can be built again: a rebuild (failing the same way) frees its own too
    with django_capture_on_commit_callbacks(execute=True):
        rebuild = alice.client.post(f"/api/v1/versions/{version['id']}/rebuild", {}, format="json")
    assert rebuild.status_code == 202, rebuild.content
    assert alice.client.get(f"/api/v1/versions/{version['id']}/").json()["status"] == "failed"
    assert current_build(ModelVersion.objects.get(pk=version["id"])).attempt == 2
    assert s3_storage() == [source] and not BuildRepository.objects.exists()
    # when the failed version is deleted
    assert alice.client.delete(f"/api/v1/versions/{version['id']}/").status_code == 204
    # then nothing of it is stored or counted any more
    assert s3_storage() == []
    assert _storage_used(alice.team) == 0


@pytest.mark.triton
def test_a_configuration_rewritten_by_verify_is_counted_as_stored(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a model that verify proves unsafe to batch: it rewrites config.pbtxt without batching
    data = _batch_mixing_model()
    model_id = alice.client.post("/api/v1/models/", {"name": "mixer", "team": "acme"}, format="json").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", data)}
        )
    version = alice.client.get(f"/api/v1/versions/{response.json()['id']}/").json()
    assert version["status"] == "built", version["error"]
    assert "max_batch_size: 0" in version["config_pbtxt"] or "max_batch_size" not in version["config_pbtxt"]
    # then the repository counts exactly the bytes stored under its prefix
    row = BuildRepository.objects.get(version_id=version["id"])
    store = get_object_store()
    stored = sum(store.size(key) for key in store.list_keys(row.prefix + "/"))
    assert row.size_bytes == stored == len(data) + len(version["config_pbtxt"].encode())
    assert _storage_used(alice.team) == len(data) + stored

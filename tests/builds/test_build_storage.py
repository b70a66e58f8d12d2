"""Build outputs in the storage quota: a build reserves its repository's bytes before writing it (and fails, saying
so, when they do not fit); they count until the repository is deleted."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.models import BuildRepository
from builds.services import collect_repository_garbage
from builds.services.storage import reserve_repository_storage
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
    reserve_repository_storage(version=version, attempt=1, prefix=version.repository_prefix, size_bytes=500)
    # when the same attempt runs again (a redelivered task)
    reserve_repository_storage(version=version, attempt=1, prefix=version.repository_prefix, size_bytes=500)
    # then it is counted once
    assert BuildRepository.objects.count() == 1
    assert _storage_used(alice.team) == version.source_size_bytes + 500


def test_collecting_an_unused_attempt_repository_frees_its_storage(alice, tmp_path):
    # given a version built twice: attempt 1's repository is no longer current
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "a.onnx", 1.0))
    store = get_object_store()
    old_prefix = version.repository_prefix
    new_prefix = old_prefix.replace("attempt-1", "attempt-2")
    for key in store.list_keys(old_prefix + "/"):
        store.copy(key, new_prefix + key[len(old_prefix) :])
    reserve_repository_storage(version=version, attempt=1, prefix=old_prefix, size_bytes=300)
    reserve_repository_storage(version=version, attempt=2, prefix=new_prefix, size_bytes=300)
    version.repository_prefix, version.build_attempt = new_prefix, 2
    version.save()
    assert _storage_used(alice.team) == version.source_size_bytes + 600
    # when the garbage collector runs
    assert collect_repository_garbage(keep=[], grace_seconds=0) == 1
    # then attempt 1 no longer counts
    assert store.list_keys(old_prefix + "/") == []
    assert list(BuildRepository.objects.values_list("attempt", flat=True)) == [2]
    assert _storage_used(alice.team) == version.source_size_bytes + 300

"""A deployment's own repository (its copy of the build's files) in the team's storage quota: reserved when the
deployment is created or a hot update is asked for, measured once written, refused past the limit, and freed when
the deployment stops. On a bucket of the S3 protocol server (moto), where the copy is made server-side."""

from __future__ import annotations

import re

import pytest

from builds.services import served_repository_prefix
from deployments import services
from deployments.models import Deployment
from deployments.services.repository import collect_deployment_repositories
from models_registry.storage import get_object_store
from tenancy.quotas import set_quota
from tests.deployments.conftest import write_adder_versions

pytestmark = pytest.mark.django_db


@pytest.fixture
def s3(settings, s3_server, s3_bucket):
    """Conch's object store is a bucket on the S3 protocol server."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key


def _storage(caller) -> dict:
    """The team's storage line as the usage API reports it."""
    response = caller.client.get(f"/api/v1/teams/{caller.team.slug}/usage")
    assert response.status_code == 200, response.content
    return next(line for line in response.json()["quotas"] if line["field"] == "storage_bytes")


def _shown_on_team_page(client, caller) -> int:
    """The storage used as the console's team page shows it (its meter's value)."""
    client.force_login(caller.user)
    html = client.get(f"/teams/{caller.team.slug}/").content.decode()
    return int(re.search(r'id="quota-storage_bytes"[^>]*value="(\d+)"', html).group(1))


def _stored(deployment_id: int) -> int:
    store = get_object_store()
    return sum(store.size(key) for key in store.list_keys(f"deployments/{deployment_id}/"))


def _deploy(caller, version, name: str = "web"):
    body = {"name": name, "team": caller.team.slug, "model_version": version.pk, "runtime": "local"}
    return caller.client.post("/api/v1/deployments/", body, format="json")


def test_a_deployment_s_repository_counts_in_storage_until_it_is_stopped(
    alice, client, s3, tmp_path, eager_tasks, django_capture_on_commit_callbacks
):
    # given a built version: its uploaded file is all the team stores (no build repository row in this set-up)
    v1, _ = write_adder_versions(alice.team, tmp_path)
    uploads = v1.source_size_bytes * 2
    assert _storage(alice)["used"] == uploads
    # when it is deployed (the start task is not run: its repository is only reserved)
    response = _deploy(alice, v1)
    assert response.status_code == 201, response.content
    row = Deployment.objects.get(pk=response.json()["id"])
    reserved = row.repository_bytes
    # then the copy's bytes count at once: the model file and its configuration
    assert reserved > v1.source_size_bytes
    assert _storage(alice)["used"] == uploads + reserved
    # when its repository is written in the bucket
    services.ensure_deployment_repository(deployment=row)
    # then what counts is what the bucket holds, which is what was reserved
    row.refresh_from_db()
    assert row.repository_bytes == _stored(row.pk) == reserved
    assert _storage(alice)["used"] == _shown_on_team_page(client, alice) == uploads + reserved
    # when it is stopped
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.delete(f"/api/v1/deployments/{row.pk}/").status_code == 202
    # then its repository is gone from the bucket, and from the team's storage
    row.refresh_from_db()
    assert row.status == "stopped"
    assert (_stored(row.pk), row.repository_bytes) == (0, 0)
    assert _storage(alice)["used"] == _shown_on_team_page(client, alice) == uploads


def test_a_deployment_whose_repository_does_not_fit_is_refused_like_any_storage_refusal(alice, s3, tmp_path):
    # given room for one deployment's repository beside the uploads, less one byte for a second
    v1, _ = write_adder_versions(alice.team, tmp_path)
    uploads = v1.source_size_bytes * 2
    first = Deployment.objects.get(pk=_deploy(alice, v1, "one").json()["id"])
    size = first.repository_bytes
    set_quota(team=alice.team, limits={"storage_bytes": uploads + 2 * size - 1})
    # when a second deployment is asked for
    response = _deploy(alice, v1, "two")
    # then it is refused with the storage quota's answer, and nothing is written
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses {uploads + size} of {uploads + 2 * size - 1} bytes of "
        f"storage; this deployment needs {size}",
        "field": "storage_bytes",
        "quota": {"limit": uploads + 2 * size - 1, "used": uploads + size, "requested": size},
    }
    assert list(Deployment.objects.values_list("name", flat=True)) == ["one"]
    # and the deploy form's check says the same
    check = alice.client.post(
        "/api/v1/deployments/check",
        {"name": "two", "team": "acme", "model_version": v1.pk, "runtime": "local"},
        format="json",
    )
    assert check.status_code == 409
    assert check.json()["field"] == "storage_bytes"
    # and with one byte more, it fits
    set_quota(team=alice.team, limits={"storage_bytes": uploads + 2 * size})
    assert _deploy(alice, v1, "two").status_code == 201


def test_a_deployment_whose_build_files_are_gone_fails_for_good_and_frees_its_repository_at_once(alice, s3, tmp_path):
    # given a deployment whose repository is reserved and half written (a copy that stopped), and its build's files
    # deleted from the bucket since
    v1, _ = write_adder_versions(alice.team, tmp_path)
    uploads = v1.source_size_bytes * 2
    row = Deployment.objects.get(pk=_deploy(alice, v1).json()["id"])
    assert row.repository_bytes > 0
    store = get_object_store()
    store.put_bytes(f"deployments/{row.pk}/repository/{row.model_name}/1/model.onnx.part", b"half a copy")
    store.delete_prefix(served_repository_prefix(v1) + "/")
    # when it is started
    assert services.ensure_deployment_started(deployment_id=row.pk) == "failed"
    # then it failed for good (nothing would restart it), saying what to do, and what it had written is gone
    # from the bucket and from the team's storage, without waiting for a stop
    row.refresh_from_db()
    assert (row.status, row.permanent_failure) == ("failed", True)
    assert "rebuild the version" in row.error
    assert (_stored(row.pk), row.repository_bytes) == (0, 0)
    assert _storage(alice)["used"] == uploads


def test_a_hot_update_reserves_the_next_version_s_files_and_a_stop_frees_them(alice, s3, tmp_path):
    # given a ready deployment of version 1 with its repository written
    v1, v2 = write_adder_versions(alice.team, tmp_path)
    uploads = v1.source_size_bytes + v2.source_size_bytes
    row = Deployment.objects.get(pk=_deploy(alice, v1).json()["id"])
    services.ensure_deployment_repository(deployment=row)
    Deployment.objects.filter(pk=row.pk).update(status="ready")
    row.refresh_from_db()
    size = row.repository_bytes
    # and no room for version 2's model file beside it
    set_quota(team=alice.team, limits={"storage_bytes": uploads + size + v2.source_size_bytes - 1})
    # when it is asked to serve version 2
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": v2.pk}, format="json")
    # then the copy of version 2's files is refused as storage, and nothing changes
    assert response.status_code == 409, response.content
    assert response.json() == {
        "detail": f"Storage quota exceeded: team 'acme' uses {uploads + size} of "
        f"{uploads + size + v2.source_size_bytes - 1} bytes of storage; this version's files needs "
        f"{v2.source_size_bytes}",
        "field": "storage_bytes",
        "quota": {
            "limit": uploads + size + v2.source_size_bytes - 1,
            "used": uploads + size,
            "requested": v2.source_size_bytes,
        },
    }
    row.refresh_from_db()
    assert (row.update_status, row.repository_bytes) == ("", size)
    # when there is room, the update is accepted and the files it will copy count at once
    set_quota(team=alice.team, limits={"storage_bytes": uploads + size + v2.source_size_bytes})
    response = alice.client.patch(f"/api/v1/deployments/{row.pk}/", {"model_version": v2.pk}, format="json")
    assert response.status_code == 202, response.content
    row.refresh_from_db()
    assert row.repository_bytes == size + v2.source_size_bytes
    assert _storage(alice)["used"] == uploads + size + v2.source_size_bytes
    # when the deployment is stopped without its stop task, then garbage collection deletes its repository
    Deployment.objects.filter(pk=row.pk).update(status="stopped", desired_state="stopped")
    assert collect_deployment_repositories() == 1
    # and its bytes no longer count
    row.refresh_from_db()
    assert (_stored(row.pk), row.repository_bytes) == (0, 0)
    assert _storage(alice)["used"] == uploads


def test_a_serving_repository_written_before_it_was_counted_is_measured_by_the_periodic_collection(alice, s3, tmp_path):
    # given a ready deployment whose repository is written but counted as 0 (as in a database from before Conch
    # counted repositories), and a stopped one
    v1, _ = write_adder_versions(alice.team, tmp_path)
    row = Deployment.objects.get(pk=_deploy(alice, v1).json()["id"])
    services.ensure_deployment_repository(deployment=row)
    Deployment.objects.filter(pk=row.pk).update(status="ready", repository_bytes=0)
    stopped = Deployment.objects.get(pk=_deploy(alice, v1, "old").json()["id"])
    Deployment.objects.filter(pk=stopped.pk).update(status="stopped", repository_bytes=0)
    before = _storage(alice)["used"]
    # when the periodic repository collection runs
    services.collect_repository_garbage()
    # then the serving one counts what its repository holds, the stopped one nothing
    row.refresh_from_db()
    stopped.refresh_from_db()
    assert row.repository_bytes == _stored(row.pk) > 0
    assert stopped.repository_bytes == 0
    assert _storage(alice)["used"] == before + row.repository_bytes

"""No stuck versions: heartbeats, the sweeper, rebuilds of stalled builds, immutable attempt repositories and their GC.

A worker that "died" is simulated the way it looks in the database: the version is `building` with an old
heartbeat and no task runs it. Builds the sweeper queues run inline (eager Celery) with a real Triton verify.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from builds.choices import StepName, StepStatus
from builds.models import Build, BuildRepository, BuildStep
from builds.services import (
    BuildHeartbeat,
    collect_repository_garbage,
    current_build,
    reset_steps,
    run_build,
    served_repository_prefix,
    sweep_stalled_versions,
)
from builds.services.state import record_build_heartbeat, record_build_result
from builds.services.storage import reserve_repository_storage
from conch.errors import Conflict
from models_registry import services as registry
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.storage import get_object_store
from tests import real_models

pytestmark = [pytest.mark.django_db]

LONG_AGO = timedelta(hours=2)
NOTHING_DONE = {
    "requeued": 0,
    "failed": 0,
    "requeued_unclaimed": 0,
    "aborted_uploads": 0,
    "finished_deletions": 0,
    "measured_samples": 0,
}


def _queued_version(caller, capture, *, name: str = "classifier") -> ModelVersion:
    """Upload the classifier through the API without running its build: the version waits `queued`."""
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=False) as queued:
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/",
            {"file": SimpleUploadedFile("model.onnx", real_models.classifier().read_bytes())},
        )
    assert response.status_code == 201, response.content
    assert len(queued) == 1  # the build was queued, not run
    return ModelVersion.objects.get(pk=response.json()["id"])


def _set_build(version: ModelVersion, *, status: str | None = None, **fields) -> Build:
    """Set fields of `version`'s current build attempt (and, given `status`, the attempt's and the version's status,
    as `builds.services.state` keeps them together); returns the attempt."""
    build = current_build(version)
    assert build is not None
    if status is not None:
        fields["status"] = {"built": "succeeded"}.get(status, status)
        ModelVersion.objects.filter(pk=version.pk).update(status=status)
    Build.objects.filter(pk=build.pk).update(**fields)
    return current_build(version)


def _worker_died_during(version: ModelVersion, step: str, *, lost_attempts: int = 0) -> None:
    """Leave `version` as a worker killed during `step` leaves it: building, step running, heartbeat old."""
    build = _set_build(
        version, status=VersionStatus.BUILDING, heartbeat_at=timezone.now() - LONG_AGO, lost_attempts=lost_attempts
    )
    reset_steps(build=build)
    for done in BuildStep.objects.filter(
        build=build, position__lt=BuildStep.objects.get(build=build, name=step).position
    ):
        BuildStep.objects.filter(pk=done.pk).update(status=StepStatus.SUCCEEDED)
    BuildStep.objects.filter(build=build, name=step).update(status=StepStatus.RUNNING, log=["12:00:00 started"])


def _steps(version: ModelVersion) -> dict[str, str]:
    """The steps of the version's current attempt, by name."""
    return dict(BuildStep.objects.filter(build=current_build(version)).values_list("name", "status"))


# --- the sweeper -----------------------------------------------------------------------------------------------


@pytest.mark.triton
def test_build_whose_worker_died_is_requeued_by_the_sweeper_and_ends_built(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a build whose worker died during verify
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _worker_died_during(version, StepName.VERIFY)
    # when the sweeper runs (the build it queues runs inline)
    with django_capture_on_commit_callbacks(execute=True):
        counts = sweep_stalled_versions()
    # then the next attempt was queued and built, into its own repository
    assert counts == {**NOTHING_DONE, "requeued": 1}
    version.refresh_from_db()
    build = current_build(version)
    assert (version.status, build.error) == ("built", "")
    assert (build.attempt, build.lost_attempts) == (2, 1)
    assert build.repository_prefix.endswith("/repository/attempt-2")
    assert set(_steps(version).values()) == {StepStatus.SUCCEEDED}
    inspect_log = BuildStep.objects.get(build=build, name=StepName.INSPECT).log
    # and the history keeps the lost attempt, with the step it died in
    lost = Build.objects.get(version=version, attempt=1)
    assert lost.status == "lost"
    assert BuildStep.objects.get(build=lost, name=StepName.VERIFY).status == StepStatus.FAILED
    assert "attempt 2: the worker running the previous attempt stopped mid-build" in inspect_log[0]
    # and the dead worker's attempt, were it delivered again, is skipped
    assert run_build(version_id=version.pk, attempt=1) == "skipped"


def test_build_whose_worker_died_too_often_fails_with_a_message(alice, settings, django_capture_on_commit_callbacks):
    # given a build whose worker died during verify, for the last allowed time
    settings.CONCH_BUILD_MAX_ATTEMPTS = 3
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _worker_died_during(version, StepName.VERIFY, lost_attempts=2)
    # (the lost attempt had written its repository, counted in storage)
    prefix = registry.repository_prefix(model_id=version.model_id, number=version.number, attempt=1)
    get_object_store().put_bytes(f"{prefix}/classifier/config.pbtxt", b"name: 'classifier'")
    reserve_repository_storage(version=version, attempt=1, prefix=prefix, size_bytes=18)
    # when the sweeper runs
    with django_capture_on_commit_callbacks(execute=False) as queued:
        counts = sweep_stalled_versions()
    # then nothing is queued and the version failed, saying what happened and that rebuild retries
    assert counts == {**NOTHING_DONE, "failed": 1}
    assert queued == []
    version.refresh_from_db()
    build = current_build(version)
    assert (version.status, build.attempt, build.lost_attempts, build.status) == ("failed", 1, 3, "failed")
    assert build.error == (
        "The worker stopped during the build at step 'verify' (no heartbeat for 60 s), 3 times in a row: the worker "
        "was killed or restarted, or the model exhausts it (memory). Start the build again with rebuild."
    )
    assert _steps(version) == {
        "inspect": "succeeded",
        "configure": "succeeded",
        "write_repository": "succeeded",
        "verify": "failed",
    }
    verify_log = BuildStep.objects.get(build=build, name=StepName.VERIFY).log
    assert verify_log[-1].endswith("the worker stopped during this step; the build gave up")
    # and what the lost attempt wrote is deleted and no longer counted; the uploaded file stays
    assert get_object_store().list_keys(prefix + "/") == []
    assert not BuildRepository.objects.filter(version=version).exists()
    assert get_object_store().exists(version.source_key)
    # and a second sweep leaves it alone
    assert sweep_stalled_versions() == NOTHING_DONE


@pytest.mark.triton
def test_queued_build_whose_message_was_lost_is_queued_again_and_ends_built(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a version queued long ago that no worker ever claimed (its message was lost)
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _set_build(version, heartbeat_at=timezone.now() - LONG_AGO)
    # when the sweeper runs
    with django_capture_on_commit_callbacks(execute=True):
        counts = sweep_stalled_versions()
    # then the attempt was sent again and built; a lost message is not a lost attempt
    assert counts == {**NOTHING_DONE, "requeued_unclaimed": 1}
    version.refresh_from_db()
    build = current_build(version)
    assert (version.status, build.attempt, build.lost_attempts) == ("built", 1, 0)
    # and the first message, should it turn up after all, is skipped
    assert run_build(version_id=version.pk, attempt=1) == "skipped"


def test_sweeper_leaves_live_work_alone(alice, django_capture_on_commit_callbacks):
    # given a build with a fresh heartbeat, a version just queued, and an upload receiving bytes
    building = _queued_version(alice, django_capture_on_commit_callbacks, name="building")
    _set_build(building, status=VersionStatus.BUILDING, heartbeat_at=timezone.now())
    queued = _queued_version(alice, django_capture_on_commit_callbacks, name="queued")
    uploading = registry.reserve_version(model=queued.model, user=alice.user)
    # when
    with django_capture_on_commit_callbacks(execute=False) as sent:
        counts = sweep_stalled_versions()
    # then
    assert counts == NOTHING_DONE
    assert sent == []
    assert dict(
        ModelVersion.objects.filter(pk__in=[building.pk, queued.pk, uploading.pk]).values_list("pk", "status")
    ) == {building.pk: "building", queued.pk: "queued", uploading.pk: "uploading"}


def test_duplicate_message_does_not_start_a_second_build_beside_a_live_one(alice, django_capture_on_commit_callbacks):
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _set_build(version, status=VersionStatus.BUILDING, heartbeat_at=timezone.now())

    assert run_build(version_id=version.pk, attempt=1) == "skipped"
    version.refresh_from_db()
    assert (version.status, current_build(version).attempt) == ("building", 1)
    assert not BuildStep.objects.filter(build__version=version).exists()


def test_stale_upload_is_aborted_row_object_and_multipart_upload(
    alice, settings, s3_server, s3_bucket, s3_client, django_capture_on_commit_callbacks
):
    # given an S3 object store
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key
    store = get_object_store()
    model = RegisteredModel.objects.create(team=alice.team, name="classifier")
    # and an upload whose web worker was killed: a multipart upload left open, and an object it had committed
    dead = registry.reserve_version(model=model, user=alice.user)
    store.put_bytes(dead.source_key, b"committed before the worker died")
    abandoned = store.open_writer(dead.source_key)
    abandoned.write(b"\0" * (9 * 1024 * 1024))  # past one 8 MiB part: a multipart upload is open
    ModelVersion.objects.filter(pk=dead.pk).update(heartbeat_at=timezone.now() - LONG_AGO)
    # and a live upload beside it
    live = registry.reserve_version(model=model, user=alice.user)
    live_writer = store.open_writer(live.source_key)
    live_writer.write(b"\1" * (9 * 1024 * 1024))
    # when the sweeper runs
    counts = sweep_stalled_versions()
    # then the dead upload is gone: row, object and multipart upload
    assert counts == {**NOTHING_DONE, "aborted_uploads": 1}
    assert not ModelVersion.objects.filter(pk=dead.pk).exists()
    assert store.exists(dead.source_key) is False
    pending = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [upload["Key"] for upload in pending] == [f"conch/{live.source_key}"]
    # and the live one carries on
    stored = live_writer.commit()
    assert (stored.key, stored.size_bytes) == (live.source_key, 9 * 1024 * 1024)
    assert ModelVersion.objects.get(pk=live.pk).status == "uploading"


def test_finishing_an_upload_the_sweeper_gave_up_is_a_conflict_naming_the_file(alice):
    model = RegisteredModel.objects.create(team=alice.team, name="classifier")
    version = registry.reserve_version(model=model, user=alice.user)
    stored = get_object_store().put_bytes(version.source_key, b"late bytes")
    ModelVersion.objects.filter(pk=version.pk).update(heartbeat_at=timezone.now() - LONG_AGO)
    assert registry.abort_stale_uploads(stale_before=timezone.now()) == 1

    with pytest.raises(Conflict, match="no bytes arrived for too long") as raised:
        registry.complete_upload(version=version, stored=stored, filename="model.onnx", build_options={})
    assert raised.value.field == "file"


def test_upload_heartbeat_moves_only_while_uploading(alice):
    model = RegisteredModel.objects.create(team=alice.team, name="classifier")
    version = registry.reserve_version(model=model, user=alice.user)
    old = timezone.now() - LONG_AGO
    ModelVersion.objects.filter(pk=version.pk).update(heartbeat_at=old)

    registry.touch_upload(version_id=version.pk)
    version.refresh_from_db()
    assert version.heartbeat_at > old

    ModelVersion.objects.filter(pk=version.pk).update(status=VersionStatus.FAILED, heartbeat_at=old)
    registry.touch_upload(version_id=version.pk)
    version.refresh_from_db()
    assert version.heartbeat_at == old


@pytest.mark.django_db(transaction=True)
def test_build_heartbeat_beats_from_its_thread_and_stops_when_superseded(alice):
    # given a version a worker is building, its heartbeat long ago
    model = RegisteredModel.objects.create(team=alice.team, name="classifier")
    old = timezone.now() - LONG_AGO
    version = ModelVersion.objects.create(model=model, number=1, status=VersionStatus.BUILDING)
    first = Build.objects.create(version=version, attempt=1, status="building", heartbeat_at=old)
    with BuildHeartbeat(version_id=version.pk, attempt=1, interval_s=0.05) as heartbeat:
        # when the build runs, its heartbeat moves without the build doing anything
        deadline = time.monotonic() + 30
        while Build.objects.get(pk=first.pk).heartbeat_at == old:
            assert time.monotonic() < deadline, "no heartbeat was written"
            time.sleep(0.05)
        # and once a rebuild supersedes the attempt, the thread stops by itself
        Build.objects.filter(pk=first.pk).update(status="superseded")
        Build.objects.create(version=version, attempt=2, status="queued", heartbeat_at=old)
        heartbeat._thread.join(timeout=30)
        assert not heartbeat._thread.is_alive()
    # then the superseded attempt no longer beats
    stopped_at = Build.objects.get(pk=first.pk).heartbeat_at
    assert record_build_heartbeat(version_id=version.pk, attempt=1) is False
    assert Build.objects.get(pk=first.pk).heartbeat_at == stopped_at
    assert Build.objects.get(version=version, attempt=2).heartbeat_at == old


# --- rebuild of a stalled build ----------------------------------------------------------------------------------


def test_rebuild_of_a_building_version_is_refused_while_its_worker_beats(alice, django_capture_on_commit_callbacks):
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _set_build(version, status=VersionStatus.BUILDING, heartbeat_at=timezone.now())

    response = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "This version is already building; wait for its build to finish. If no heartbeat from its "
        "worker for 60 s, it has stalled: rebuild is then allowed.",
        "field": None,
    }


@pytest.mark.triton
def test_rebuild_of_a_building_version_whose_heartbeat_stopped_is_allowed(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a build whose worker died
    version = _queued_version(alice, django_capture_on_commit_callbacks)
    _worker_died_during(version, StepName.INSPECT, lost_attempts=1)
    # when the user rebuilds it
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild")
    # then the next attempt is queued and built, with the lost-attempt count reset
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "queued"
    version.refresh_from_db()
    build = current_build(version)
    assert (version.status, build.attempt, build.lost_attempts) == ("built", 2, 0)
    # and the stalled attempt is kept in the history as superseded, and can no longer record anything
    assert Build.objects.get(version=version, attempt=1).status == "superseded"
    assert record_build_result(version_id=version.pk, attempt=1, succeeded=False, error="late") is False


# --- immutable attempt repositories and their garbage collection --------------------------------------------------


def _version_with_attempts(
    team,
    name: str,
    attempts: list[int],
    source: bytes = b"onnx",
    *,
    builds: dict[int, str],
    served: int | None = None,
    served_prefix: str | None = None,
    heartbeat_at=None,
    **fields,
) -> ModelVersion:
    """A version row, its source file, a tiny repository (config.pbtxt) under each of `attempts`' prefixes, and its
    build attempts (`builds`: attempt -> status, last changed at `heartbeat_at`); attempt `served` succeeded and
    names its repository (or `served_prefix`)."""
    model = RegisteredModel.objects.create(team=team, name=name)
    store = get_object_store()
    for attempt in attempts:
        prefix = registry.repository_prefix(model_id=model.pk, number=1, attempt=attempt)
        store.put_bytes(f"{prefix}/{name}/config.pbtxt", f"attempt {attempt}".encode())
    source_key = registry.source_key(model_id=model.pk, number=1)
    store.put_bytes(source_key, source)
    version = ModelVersion.objects.create(model=model, number=1, source_key=source_key, **fields)
    for attempt, status in builds.items():
        prefix = ""
        if attempt == served:
            prefix = served_prefix or registry.repository_prefix(model_id=model.pk, number=1, attempt=attempt)
        Build.objects.create(
            version=version, attempt=attempt, status=status, repository_prefix=prefix, heartbeat_at=heartbeat_at
        )
    return version


def _attempt(version: ModelVersion, attempt: int) -> str:
    return registry.repository_prefix(model_id=version.model_id, number=version.number, attempt=attempt)


def _repository_keys(version: ModelVersion) -> list[str]:
    root = registry.repositories_root(model_id=version.model_id, number=version.number)
    return get_object_store().list_keys(root + "/")


def test_failed_rebuild_keeps_the_previous_repository(alice, eager_tasks, django_capture_on_commit_callbacks):
    # given a version built by attempt 1, deployed from that repository
    old = timezone.now() - LONG_AGO
    version = _version_with_attempts(
        alice.team,
        "classifier",
        [1],
        source=real_models.classifier().read_bytes(),
        status="built",
        builds={1: "succeeded"},
        served=1,
        heartbeat_at=old,
    )
    before = {key: get_object_store().read_bytes(key) for key in _repository_keys(version)}
    # when a rebuild fails (its options no longer fit the model)
    Build.objects.filter(version=version).update(options={"max_batch_size": -3})
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client.post(f"/api/v1/versions/{version.pk}/rebuild").status_code == 202
    # then the version failed but still names attempt 1's repository, which is untouched
    version.refresh_from_db()
    assert (version.status, current_build(version).attempt) == ("failed", 2)
    assert current_build(version).error_field == "max_batch_size"
    assert served_repository_prefix(version) == _attempt(version, 1)
    assert {key: get_object_store().read_bytes(key) for key in _repository_keys(version)} == before


def test_garbage_collection_keeps_current_pinned_and_building_attempts(alice):
    old = timezone.now() - LONG_AGO
    # given a version whose attempt 3 is current, 1 is pinned by a deployment, 2 and 4 are unused
    rebuilt = _version_with_attempts(
        alice.team,
        "rebuilt",
        [1, 2, 3, 4],
        status="failed",
        builds={1: "succeeded", 2: "succeeded", 3: "succeeded", 4: "failed"},
        served=3,
        heartbeat_at=old,
    )
    # and a version rebuilding as attempt 3 (current 1, 2 failed)
    building = _version_with_attempts(
        alice.team,
        "building",
        [1, 2, 3],
        status="building",
        builds={1: "succeeded", 2: "failed", 3: "building"},
        served=1,
        heartbeat_at=old,
    )
    # and a version rebuilt a moment ago (within the grace period)
    recent = _version_with_attempts(
        alice.team,
        "recent",
        [1, 2],
        status="built",
        builds={1: "succeeded", 2: "succeeded"},
        served=2,
        heartbeat_at=timezone.now(),
    )
    # and a version built before attempt prefixes existed, whose model is named like an attempt folder
    legacy = _version_with_attempts(alice.team, "attempt-1", [], status="built", builds={}, heartbeat_at=old)
    legacy_root = registry.repositories_root(model_id=legacy.model_id, number=1)
    get_object_store().put_bytes(f"{legacy_root}/attempt-1/config.pbtxt", b"legacy")
    Build.objects.create(version=legacy, attempt=1, status="succeeded", repository_prefix=legacy_root, heartbeat_at=old)

    # when
    deleted = collect_repository_garbage(keep={_attempt(rebuilt, 1) + "/"}, grace_seconds=600)

    # then only the unused attempts of settled versions are gone
    assert deleted == 3
    assert _repository_keys(rebuilt) == [f"{_attempt(rebuilt, n)}/rebuilt/config.pbtxt" for n in (1, 3)]
    assert _repository_keys(building) == [f"{_attempt(building, n)}/building/config.pbtxt" for n in (1, 3)]
    assert _repository_keys(recent) == [f"{_attempt(recent, n)}/recent/config.pbtxt" for n in (1, 2)]
    assert _repository_keys(legacy) == [f"{legacy_root}/attempt-1/config.pbtxt"]
    # and uploaded sources are never touched
    assert get_object_store().exists(rebuilt.source_key)
    # and a second run finds nothing more
    assert collect_repository_garbage(keep={_attempt(rebuilt, 1)}, grace_seconds=600) == 0
    # and once the pin is dropped, attempt 1 goes too
    assert collect_repository_garbage(keep=set(), grace_seconds=600) == 1
    assert _repository_keys(rebuilt) == [f"{_attempt(rebuilt, 3)}/rebuilt/config.pbtxt"]

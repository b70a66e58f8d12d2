"""Build attempts and their state: every status change of a build (and of its version's `status`) happens here,
under row locks.

A version's builds are `Build` rows, one per attempt. Each change locks the version's row first, then works on
the attempt, so that a rebuild, a worker's claim, its result and the sweeper take turns. The pipeline
(`builds.services.pipeline`) walks an attempt through its steps and reports here; the sweeper
(`builds.services.recovery`) decides when an attempt has stalled and calls `recover_stalled_build` or
`requeue_unclaimed_build`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Max, Prefetch, Q, QuerySet
from django.utils import timezone

from builds.choices import BuildStatus
from builds.models import Build
from conch.errors import Conflict
from models_registry import services as registry
from models_registry.choices import VersionStatus
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tenancy.quotas import reserve_quota

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

#: The attribute `with_builds` fills: a version's builds, newest attempt first.
HISTORY_ATTR = "build_history"


def with_builds(versions: QuerySet[ModelVersion], *, steps: bool = True) -> QuerySet[ModelVersion]:
    """`versions` with each one's builds (newest attempt first) fetched in one more query, and with `steps` their
    steps in another, for `current_build`, `served_build` and the steps to read without queries per version."""
    attempts = Build.objects.order_by("-attempt")
    history = Prefetch(
        "builds", queryset=attempts.prefetch_related("steps") if steps else attempts, to_attr=HISTORY_ATTR
    )
    return versions.prefetch_related(history)


def _history(version: ModelVersion) -> list[Build]:
    """The version's builds, newest first: those `with_builds` fetched, else read now (not kept on the instance, so
    a version read again after a change sees its builds as they are)."""
    prefetched = getattr(version, HISTORY_ATTR, None)
    if prefetched is not None:
        return prefetched
    return list(builds_of(version_id=version.pk))


def read_history_once(version: ModelVersion) -> ModelVersion:
    """Read the version's builds and their steps now and keep them on this instance (as `with_builds` does for a
    queryset), for a caller about to ask several questions of one version it will not change; returns `version`."""
    if getattr(version, HISTORY_ATTR, None) is None:
        setattr(version, HISTORY_ATTR, list(builds_of(version_id=version.pk).prefetch_related("steps")))
    return version


def current_build(version: ModelVersion) -> Build | None:
    """The version's latest build attempt (what its `status` sums up), or None before its upload finished."""
    history = _history(version)
    return history[0] if history else None


def served_build(version: ModelVersion) -> Build | None:
    """The version's latest `succeeded` build: the repository a deployment of the version serves. None when no
    attempt succeeded. A failed rebuild leaves the previous success in place (its repository is kept)."""
    return next((build for build in _history(version) if build.status == BuildStatus.SUCCEEDED), None)


def custom_backends_of(version: ModelVersion, *, repository_prefix: str | None = None) -> dict[str, str]:
    """The custom backends the version's model needs: name -> the object-store prefix of its files
    (`Build.backend`), from the build whose repository is `repository_prefix` (a deployment's pinned one), else the
    `served_build`. {} for a model of Triton's own backends."""
    builds = _history(version)
    chosen = next((b for b in builds if repository_prefix and b.repository_prefix == repository_prefix), None)
    chosen = chosen or served_build(version)
    if chosen is None or not chosen.backend:
        return {}
    return {str(chosen.backend["name"]): str(chosen.backend["files_prefix"])}


def gpu_requirement(version: ModelVersion) -> tuple[str, str] | None:
    """(gpu_product, tensorrt_version) the model a version serves (its `served_build`'s) runs only on: for a
    TensorRT plan, what its upload declared (build options `gpu_product`, `tensorrt_version`); None for a model
    that runs anywhere."""
    served = served_build(version)
    if served is None or served.source_format != "tensorrt_plan":
        return None
    options = served.options or {}
    return str(options.get("gpu_product") or ""), str(options.get("tensorrt_version") or "")


def latest_config_pbtxt(version: ModelVersion) -> str:
    """The Triton model configuration the version's latest configured attempt generated ("" before any did): what
    the version's page shows as its configuration. The repository a deployment serves has `served_build`'s."""
    return next((build.config_pbtxt for build in _history(version) if build.config_pbtxt), "")


def served_repository_prefix(version: ModelVersion) -> str:
    """Object-store prefix of the repository the version serves (its `served_build`'s), "" while none succeeded."""
    served = served_build(version)
    return served.repository_prefix if served is not None else ""


def served_config_pbtxt(version: ModelVersion) -> str:
    """The Triton model configuration (text) of the repository the version serves, "" while no build succeeded:
    what a deployment of the version starts from."""
    served = served_build(version)
    return served.config_pbtxt if served is not None else ""


def current_error(version: ModelVersion) -> str:
    """Why the version's current build attempt failed ("" when it did not)."""
    build = current_build(version)
    return build.error if build is not None else ""


def current_options(version: ModelVersion) -> dict[str, Any]:
    """The build options of the version's current attempt ({} before its upload finished): what a rebuild keeps
    unless told otherwise."""
    build = current_build(version)
    return dict(build.options) if build is not None else {}


def builds_of(*, version_id: int) -> QuerySet[Build]:
    """Every build attempt of a version, newest first (its history)."""
    return Build.objects.filter(version_id=version_id).order_by("-attempt")


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _set_status(version: ModelVersion, status: str) -> None:
    registry.set_version_status(version_id=version.pk, status=status)
    version.status = status


def _new_attempt(version: ModelVersion, *, options: dict[str, Any], lost_attempts: int = 0) -> Build:
    """Add the next build attempt of `version` (whose row the caller locked), `queued`, and set the version `queued`."""
    last = Build.objects.filter(version_id=version.pk).aggregate(top=Max("attempt"))["top"] or 0
    now = timezone.now()
    build = Build.objects.create(
        version=version,
        attempt=last + 1,
        status=BuildStatus.QUEUED,
        options=options,
        lost_attempts=lost_attempts,
        queued_at=now,
        heartbeat_at=now,
    )
    _set_status(version, VersionStatus.QUEUED)
    setattr(version, HISTORY_ATTR, None)
    return build


def open_first_build(*, version: ModelVersion, options: dict[str, Any]) -> Build:
    """Start build attempt 1 of a version whose upload just finished (`queued`), inside the caller's transaction,
    which queues it (`builds.services.submission.queue_build`). `options`: the validated build options."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("open_first_build must run inside the transaction that queues the build")
    return _new_attempt(version, options=dict(options))


def mark_rebuild(
    *,
    version: ModelVersion,
    building_stale_before: datetime | None = None,
    queued_stale_before: datetime | None = None,
    build_options: dict[str, Any] | None = None,
    samples_size_bytes: int | None = None,
) -> Build:
    """Start a new build attempt of a stored version (`queued`, the next attempt number) and return it.

    `build_options`, when given, are the new attempt's (already validated) options, e.g. with sample inputs
    added; otherwise it takes the current attempt's. `samples_size_bytes`, when given, is the size of new sample
    inputs that replace the version's (the caller writes them once this returns, in the same transaction):
    reserved in the team's storage quota in place of the old ones. Raises Conflict while the upload has not
    finished, while the version is being deleted, or while a build is queued or running, unless that build has
    stalled: `building` with a heartbeat before `building_stale_before` (its worker stopped), or `queued` since
    before `queued_stale_before` (its message was lost); the stalled attempt is then `superseded`. Raises
    QuotaExceeded (field `storage_bytes`) when the new sample inputs do not fit. The caller queues the build in
    the same transaction.
    """
    with transaction.atomic():
        locked = registry.lock_version(version_id=version.pk)
        if locked is None:
            raise Conflict("This version was deleted.", field=None)
        version = locked
        if version.status == VersionStatus.UPLOADING:
            raise Conflict("The upload of this version has not finished.", field=None)
        if version.status == VersionStatus.DELETING:
            raise Conflict("This version is being deleted.", field=None)
        previous = version.status
        current = current_build(version)
        if current is not None and current.is_open:
            bound = building_stale_before if current.status == BuildStatus.BUILDING else queued_stale_before
            if bound is None or not _heartbeat_before(current, bound):
                raise Conflict(_still_busy_message(version, bound), field=None)
            log.warning(
                "version.rebuild_stalled",
                extra={"version_id": version.pk, "status": current.status, "attempt": current.attempt},
            )
            _end(current, BuildStatus.SUPERSEDED)
        if samples_size_bytes is not None:
            reserve_quota(
                team=version.model.team,
                requested={"storage_bytes": samples_size_bytes},
                released={"storage_bytes": version.samples_size_bytes},
                what="these sample inputs",
            )
            registry.set_samples_size(version_id=version.pk, size_bytes=samples_size_bytes)
            version.samples_size_bytes = samples_size_bytes
        options = build_options if build_options is not None else dict(current.options if current else {})
        build = _new_attempt(version, options=options)
        record_audit(
            action=AuditAction.VERSION_REBUILD_REQUESTED,
            team=version.model.team,
            target=version,
            before={"status": previous},
            after={"status": version.status, "attempt": build.attempt},
        )
    return build


def _heartbeat_before(build: Build, bound: datetime) -> bool:
    return build.heartbeat_at is None or build.heartbeat_at < bound


def _still_busy_message(version: ModelVersion, bound: datetime | None) -> str:
    message = f"This version is already {version.status}; wait for its build to finish."
    if bound is not None:
        wait_s = (timezone.now() - bound).total_seconds()
        what = "heartbeat from its worker" if version.status == VersionStatus.BUILDING else "worker claims it"
        message += f" If no {what} for {wait_s:.0f} s, it has stalled: rebuild is then allowed."
    return message


def _end(build: Build, status: str, *, error: str = "", error_field: str = "") -> None:
    now = timezone.now()
    build.status, build.finished_at, build.heartbeat_at = status, now, now
    build.error, build.error_field = error, error_field
    build.save(update_fields=["status", "finished_at", "heartbeat_at", "error", "error_field"])


def _locked_attempt(version_id: int, attempt: int) -> tuple[ModelVersion, Build] | None:
    """Lock the version, then its build `attempt`; None unless that attempt is the version's latest and open."""
    version = registry.lock_version(version_id=version_id)
    if version is None:
        return None
    build = Build.objects.select_for_update().filter(version_id=version_id).order_by("-attempt").first()
    if build is None or build.attempt != attempt or not build.is_open:
        return None
    return version, build


def claim_build(*, version_id: int, attempt: int, stale_before: datetime | None = None) -> Build | None:
    """Mark build `attempt` of a version as taken by this worker (`building`, heartbeat now) and return it, with its
    version (and the version's model and team) loaded.

    Returns None when the attempt is stale (a newer attempt exists) or already over, and when another worker is
    building it (its heartbeat is at or after `stale_before`): a duplicate message must not run a second build
    beside the first. A redelivered task claims a `building` attempt whose heartbeat stopped and redoes it
    (builds are idempotent).
    """
    with transaction.atomic():
        locked = _locked_attempt(version_id, attempt)
        if locked is None:
            return None
        version, build = locked
        if build.status == BuildStatus.BUILDING and stale_before and not _heartbeat_before(build, stale_before):
            log.warning("build.claim.busy", extra={"version_id": version_id, "attempt": attempt})
            return None
        previous = version.status
        now = timezone.now()
        build.status, build.heartbeat_at, build.started_at, build.worker = (
            BuildStatus.BUILDING,
            now,
            now,
            _worker_name(),
        )
        build.save(update_fields=["status", "heartbeat_at", "started_at", "worker"])
        _set_status(version, VersionStatus.BUILDING)
        build.version = version
        record_audit(
            action=AuditAction.BUILD_STARTED,
            team=version.model.team,
            target=version,
            before={"status": previous},
            after={"status": version.status, "attempt": attempt},
        )
    return build


def record_build_heartbeat(*, version_id: int, attempt: int) -> bool:
    """Record that the worker running build `attempt` is alive; return False once that attempt is over or
    superseded (a rebuild or the sweeper started a newer attempt). The build should then stop; whatever it records
    is ignored anyway."""
    updated = Build.objects.filter(version_id=version_id, attempt=attempt, status=BuildStatus.BUILDING).update(
        heartbeat_at=timezone.now()
    )
    return updated == 1


def release_build(*, version_id: int, attempt: int) -> None:
    """Put build `attempt` back to `queued` (heartbeat now): it waits for a retry, no worker has it."""
    with transaction.atomic():
        locked = _locked_attempt(version_id, attempt)
        if locked is None or locked[1].status != BuildStatus.BUILDING:
            return
        version, build = locked
        build.status, build.heartbeat_at, build.worker = BuildStatus.QUEUED, timezone.now(), ""
        build.save(update_fields=["status", "heartbeat_at", "worker"])
        _set_status(version, VersionStatus.QUEUED)


def record_build_artifacts(
    *,
    version_id: int,
    attempt: int,
    signature: dict[str, Any] | None = None,
    config_pbtxt: str | None = None,
    source_format: str | None = None,
    conversion: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
) -> None:
    """Store what a build step produced; an argument left as None is not written.

    `signature` is the inspected model's signature as `ModelSignature.to_dict()` returns it (inputs/outputs with
    name, datatype, dims): it describes the file, so it goes on the version. `config_pbtxt` is the Triton model
    configuration text build `attempt` generated, `source_format` the uploaded file's format key and `conversion`
    its conversion report (`Build.conversion`), `environment` a Python model's execution environment
    (`Build.environment`), on that attempt. Ids that match no row write nothing.
    """
    if signature is not None:
        registry.record_signature(version_id=version_id, signature=signature)
    fields: dict[str, Any] = {}
    if config_pbtxt is not None:
        fields["config_pbtxt"] = config_pbtxt
    if source_format is not None:
        fields["source_format"] = source_format
    if conversion is not None:
        fields["conversion"] = conversion
    if environment is not None:
        fields["environment"] = environment
    if fields:
        Build.objects.filter(version_id=version_id, attempt=attempt).update(**fields)


def record_build_result(
    *,
    version_id: int,
    attempt: int,
    succeeded: bool,
    error: str = "",
    error_field: str = "",
    repository_prefix: str = "",
) -> bool:
    """Store the outcome of build `attempt` (`succeeded` or `failed`, the version `built` or `failed`); a stale
    attempt (a newer one exists, or it is over) is ignored. Returns whether the result was recorded.

    A success records `repository_prefix` (where the attempt wrote its repository): the version now serves it. A
    failure keeps the repository of the version's latest successful build (`served_build`).
    """
    with transaction.atomic():
        locked = _locked_attempt(version_id, attempt)
        if locked is None:
            return False
        version, build = locked
        previous = version.status
        if succeeded:
            build.repository_prefix = repository_prefix
            build.save(update_fields=["repository_prefix"])
        _end(build, BuildStatus.SUCCEEDED if succeeded else BuildStatus.FAILED, error=error, error_field=error_field)
        _set_status(version, VersionStatus.BUILT if succeeded else VersionStatus.FAILED)
        record_audit(
            action=AuditAction.BUILD_SUCCEEDED if succeeded else AuditAction.BUILD_FAILED,
            team=version.model.team,
            target=version,
            before={"status": previous},
            after={"status": version.status, "attempt": attempt, "error": error.splitlines()[0] if error else ""},
        )
    return True


def stalled_builds(*, status: str, stale_before: datetime) -> list[tuple[int, int]]:
    """(version id, attempt) of the build attempts in `status` whose heartbeat is before `stale_before` (or
    missing), oldest heartbeat first."""
    stalled = Build.objects.filter(status=status).filter(
        Q(heartbeat_at__lt=stale_before) | Q(heartbeat_at__isnull=True)
    )
    return list(stalled.order_by("heartbeat_at", "pk").values_list("version_id", "attempt"))


def recover_stalled_build(
    *, version_id: int, attempt: int, stale_before: datetime, max_attempts: int, error: str
) -> Build | None:
    """Recover build `attempt` of a version, `building` but whose worker stopped (heartbeat before `stale_before`).

    The attempt is `lost`. While fewer than `max_attempts` attempts were lost in a row, the next attempt starts
    (`queued`, same options, `lost_attempts` one more) for the caller to queue in the same transaction, and is
    returned; otherwise the attempt `failed` with `error`, the version too, and that attempt is returned. Returns
    None when the attempt is no longer stalled (it finished, was superseded, or its heartbeat came back).
    """
    with transaction.atomic():
        locked = _locked_attempt(version_id, attempt)
        if locked is None:
            return None
        version, build = locked
        if build.status != BuildStatus.BUILDING or not _heartbeat_before(build, stale_before):
            return None
        lost = build.lost_attempts + 1
        if lost >= max_attempts:
            build.lost_attempts = lost
            build.save(update_fields=["lost_attempts"])
            _end(build, BuildStatus.FAILED, error=error)
            _set_status(version, VersionStatus.FAILED)
            result = build
        else:
            _end(build, BuildStatus.LOST)
            result = _new_attempt(version, options=build.options, lost_attempts=lost)
        failed = version.status == VersionStatus.FAILED
        record_audit(
            action=AuditAction.BUILD_FAILED if failed else AuditAction.BUILD_REQUEUED,
            team=version.model.team,
            target=version,
            before={"status": VersionStatus.BUILDING},
            after={
                "status": version.status,
                "attempt": result.attempt,
                "lost_attempts": lost,
                "error": error.splitlines()[0] if failed else "",
            },
        )
    return result


def requeue_unclaimed_build(*, version_id: int, attempt: int, queued_before: datetime) -> Build | None:
    """Restart the wait of build `attempt`, `queued` since before `queued_before` with no worker claiming it.

    Its task message was probably lost (kombu's filesystem transport deletes a message when a worker reads it,
    and a worker killed before claiming it takes it along); the caller sends the same attempt again in the same
    transaction. If the first message was only slow (a deep queue), whichever arrives second finds the attempt
    building or over and is skipped (`claim_build`). Returns the attempt, or None when it is no longer unclaimed.
    """
    with transaction.atomic():
        locked = _locked_attempt(version_id, attempt)
        if locked is None:
            return None
        build = locked[1]
        if build.status != BuildStatus.QUEUED or not _heartbeat_before(build, queued_before):
            return None
        build.heartbeat_at = timezone.now()
        build.save(update_fields=["heartbeat_at"])
    return build


def versions_with_builds() -> QuerySet[ModelVersion]:
    """Versions that have build attempts (so may have repositories in the object store), with their builds but not
    their steps (`with_builds`), leaving out versions being uploaded or deleted."""
    versions = registry.versions_past_upload().filter(builds__isnull=False).distinct().order_by("pk")
    return with_builds(versions, steps=False)


def last_change(builds: Iterable[Build]) -> datetime | None:
    """When the latest of `builds` last changed (its heartbeat: queued, beat, or ended); None without any."""
    beats = [build.heartbeat_at for build in builds if build.heartbeat_at is not None]
    return max(beats) if beats else None


def history(version: ModelVersion) -> list[Build]:
    """The version's builds, newest attempt first (prefetched by `with_builds`, else read now)."""
    return list(_history(version))


__all__ = [
    "builds_of",
    "claim_build",
    "current_build",
    "current_error",
    "current_options",
    "latest_config_pbtxt",
    "history",
    "last_change",
    "mark_rebuild",
    "open_first_build",
    "read_history_once",
    "record_build_artifacts",
    "record_build_heartbeat",
    "record_build_result",
    "recover_stalled_build",
    "release_build",
    "requeue_unclaimed_build",
    "served_build",
    "served_config_pbtxt",
    "served_repository_prefix",
    "stalled_builds",
    "versions_with_builds",
    "with_builds",
]

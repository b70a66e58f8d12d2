"""Recovery and clean-up: requeue builds whose worker stopped, abort stale uploads, delete unused repositories."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from builds.choices import BuildStatus, StepStatus
from builds.models import BuildStep
from builds.services import state
from builds.services.pipeline import finish_step, skip_remaining_steps
from builds.services.storage import discard_attempt_repositories, forget_repository
from builds.services.submission import building_stale_before, queue_build, queued_stale_before
from conch.errors import ConchError
from models_registry import services as registry
from models_registry.deletion import finish_stalled_deletions
from models_registry.storage import get_object_store

log = logging.getLogger(__name__)

_ATTEMPT_SEGMENT = re.compile(r"attempt-[0-9]+")


def sweep_stalled_versions() -> dict[str, int]:
    """Recover versions stuck in `building`, `queued` or `uploading`; return what was done, by kind.

    Run periodically (task `builds.sweep_stalled_versions`); it is what makes recovery true on every
    broker, kombu's filesystem transport included (it deletes a message when a worker reads it, so a
    late ack protects nothing):

    - `building` with no heartbeat for CONCH_BUILD_STALE_SECONDS: the worker stopped mid-build. The next
      attempt is queued, until CONCH_BUILD_MAX_ATTEMPTS attempts were lost that way; then the version
      fails with a message saying so and that rebuild retries. (`requeued`, `failed`)
    - `queued` for CONCH_BUILD_QUEUED_STALE_SECONDS with no worker claiming it: the message was lost, or
      waits in a deep queue. The same attempt is sent again (a duplicate is skipped by whichever copy comes
      second); this does not count as a lost attempt. (`requeued_unclaimed`)
    - `uploading` with no bytes for CONCH_UPLOAD_STALE_SECONDS: the row, the stored object and any open
      multipart upload are removed. (`aborted_uploads`; resumable uploads have their own sweeper,
      `uploads.sweep_uploads`)
    - models and versions whose deletion started CONCH_DELETION_RETRY_SECONDS ago and did not end (the object
      store failed, or the process died): the deletion is finished. (`finished_deletions`)
    - sample inputs stored before Conch counted them in storage: their size is recorded
      (`measured_samples`, `models_registry.services.measure_unmeasured_samples`).
    """
    counts = {"requeued": 0, "failed": 0, "requeued_unclaimed": 0, "aborted_uploads": 0, "finished_deletions": 0}
    building_before = building_stale_before()
    max_attempts = settings.CONCH_BUILD_MAX_ATTEMPTS
    stale_s = settings.CONCH_BUILD_STALE_SECONDS
    for version_id, attempt in state.stalled_builds(status=BuildStatus.BUILDING, stale_before=building_before):
        step = (
            BuildStep.objects.filter(build__version_id=version_id, build__attempt=attempt, status=StepStatus.RUNNING)
            .order_by("position")
            .first()
        )
        where = f" at step '{step.name}'" if step else ""
        error = (
            f"The worker stopped during the build{where} (no heartbeat for {stale_s:.0f} s), "
            f"{max_attempts} times in a row: the worker was killed or restarted, or the model exhausts it (memory). "
            "Start the build again with rebuild."
        )
        with transaction.atomic():
            build = state.recover_stalled_build(
                version_id=version_id,
                attempt=attempt,
                stale_before=building_before,
                max_attempts=max_attempts,
                error=error,
            )
            if build is None:
                continue
            failed = build.status == BuildStatus.FAILED
            if failed:
                _close_lost_steps(version_id, attempt, "the worker stopped during this step; the build gave up")
            else:
                _close_lost_steps(
                    version_id,
                    attempt,
                    f"the worker stopped during this step; queued again as attempt {build.attempt} "
                    f"({build.lost_attempts} of {max_attempts} lost)",
                )
                queue_build(version_id=version_id, attempt=build.attempt)
        if failed:
            counts["failed"] += 1
            log.warning("build.worker_lost.failed", extra={"version_id": version_id})
            # Once committed: what the lost attempts wrote serves nothing (none of them succeeded).
            lost = range(build.attempt - build.lost_attempts + 1, build.attempt + 1)
            _discard_lost_attempts(version_id, list(lost))
            continue
        counts["requeued"] += 1
        log.warning(
            "build.worker_lost.requeued",
            extra={"version_id": version_id, "attempt": build.attempt, "lost_attempts": build.lost_attempts},
        )
    queued_before = queued_stale_before()
    for version_id, attempt in state.stalled_builds(status=BuildStatus.QUEUED, stale_before=queued_before):
        with transaction.atomic():
            build = state.requeue_unclaimed_build(version_id=version_id, attempt=attempt, queued_before=queued_before)
            if build is None:
                continue
            queue_build(version_id=version_id, attempt=build.attempt)
        counts["requeued_unclaimed"] += 1
        log.warning("build.unclaimed.requeued", extra={"version_id": version_id, "attempt": build.attempt})
    counts["aborted_uploads"] = registry.abort_stale_uploads(
        stale_before=timezone.now() - timedelta(seconds=settings.CONCH_UPLOAD_STALE_SECONDS)
    )
    counts["finished_deletions"] = finish_stalled_deletions(
        started_before=timezone.now() - timedelta(seconds=settings.CONCH_DELETION_RETRY_SECONDS)
    )
    counts["measured_samples"] = registry.measure_unmeasured_samples()
    return counts


def _discard_lost_attempts(version_id: int, attempts: list[int]) -> None:
    """Delete what the lost attempts of a version that gave up wrote; a failing store leaves it to the garbage
    collection."""
    try:
        discard_attempt_repositories(version_id=version_id, attempts=attempts)
    except ConchError as error:
        log.warning("build.repository.discard_failed", extra={"version_id": version_id, "error": error.detail})


def _close_lost_steps(version_id: int, attempt: int, line: str) -> None:
    """Mark the step a dead worker was running in build `attempt` as failed (with `line` in its log) and skip the
    rest."""
    stamp = timezone.now().strftime("%H:%M:%S")
    running = BuildStep.objects.filter(build__version_id=version_id, build__attempt=attempt, status=StepStatus.RUNNING)
    for step in running:
        step.log.append(f"{stamp} {line}")
        finish_step(step, StepStatus.FAILED)
    skip_remaining_steps(version_id=version_id, attempt=attempt)


def collect_repository_garbage(*, keep: Iterable[str], grace_seconds: float | None = None) -> int:
    """Delete build repositories nothing uses; return how many attempt prefixes were deleted.

    A version's attempt prefix (`.../repository/attempt-<k>`) is deleted unless it is the repository of the
    version's served build (`state.served_build`), of an attempt now queued or building, or in `keep` (the
    prefixes deployments pin; the deployments app passes them), or lies inside or around one of those. Only
    versions whose builds last changed longer ago than `grace_seconds` (default CONCH_REPOSITORY_GC_GRACE_SECONDS)
    are touched, so a deployment that read the previous served repository just before a rebuild finished can still
    pin it. Object-store errors propagate (Unavailable); what was deleted before stays deleted.
    """
    grace = settings.CONCH_REPOSITORY_GC_GRACE_SECONDS if grace_seconds is None else grace_seconds
    settled_before = timezone.now() - timedelta(seconds=grace)
    kept = {prefix.strip("/") for prefix in keep if prefix}
    store = get_object_store()
    deleted = 0
    for version in state.versions_with_builds():
        builds = state.history(version)
        changed = state.last_change(builds)
        if changed is not None and changed > settled_before:
            continue
        protected = set(kept)
        served = state.served_build(version)
        if served is not None and served.repository_prefix:
            protected.add(served.repository_prefix.strip("/"))
        for build in builds:
            if build.is_open:
                building = registry.repository_prefix(
                    model_id=version.model_id, number=version.number, attempt=build.attempt
                )
                protected.add(building)
        root = registry.repositories_root(model_id=version.model_id, number=version.number)
        attempts = {
            key[len(root) + 1 :].split("/", 1)[0] for key in store.list_keys(root + "/") if key.startswith(root + "/")
        }
        for segment in sorted(attempts):
            prefix = f"{root}/{segment}"
            if not _ATTEMPT_SEGMENT.fullmatch(segment) or any(_overlaps(prefix, other) for other in protected):
                continue
            store.delete_prefix(prefix + "/")
            forget_repository(version_id=version.pk, prefix=prefix)
            deleted += 1
            log.info("build.repository.collected", extra={"version_id": version.pk, "prefix": prefix})
    return deleted


def _overlaps(prefix: str, other: str) -> bool:
    """Whether folder `prefix` is `other`, inside it, or holds it."""
    return prefix == other or other.startswith(prefix + "/") or prefix.startswith(other + "/")

"""Celery tasks of the builds app: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from builds import services
from conch.errors import Unavailable


@shared_task(
    name="builds.build_version",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=4,
)
def build_version(self, version_id: int, attempt: int) -> str:
    """Build attempt `attempt` of model version `version_id` (see builds.services.run_build)."""
    try:
        return services.run_build(version_id=version_id, attempt=attempt)
    except Unavailable as exc:
        if self.request.retries >= self.max_retries:
            services.fail_build_after_retries(version_id=version_id, attempt=attempt, detail=exc.detail)
            return "failed"
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from exc


@shared_task(name="builds.sweep_stalled_versions")
def sweep_stalled_versions() -> dict[str, int]:
    """Periodic: recover builds whose worker stopped or whose message was lost; abort stale uploads."""
    return services.sweep_stalled_versions()


@shared_task(
    name="builds.finish_upload",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=4,
)
def finish_upload(self, upload_id: str) -> str:
    """Check a completed resumable upload and make its version (see builds.services.finish_upload)."""
    try:
        return services.finish_upload(upload_id=upload_id)
    except Unavailable as exc:
        if self.request.retries >= self.max_retries:
            # The check was given back: the sweeper queues it again once the store answers.
            return "released"
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from exc

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
    """Periodic: recover builds whose worker stopped or whose message was lost; abort stale version uploads."""
    return services.sweep_stalled_versions()

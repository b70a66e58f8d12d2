"""Celery tasks of the uploads app: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from conch.errors import Unavailable
from uploads import services


@shared_task(
    # The name it had under the builds app, kept: messages queued before the move still find it.
    name="builds.finish_upload",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=4,
)
def finish_upload(self, upload_id: str) -> str:
    """Check a completed resumable upload and make its version (see uploads.services.finish_upload)."""
    try:
        return services.finish_upload(upload_id=upload_id)
    except Unavailable as exc:
        if self.request.retries >= self.max_retries:
            # The check was given back: the sweeper queues it again once the store answers.
            return "released"
        raise self.retry(exc=exc, countdown=min(60, 5 * 2**self.request.retries)) from exc


@shared_task(name="uploads.sweep_uploads")
def sweep_uploads() -> dict[str, int]:
    """Periodic: abort resumable uploads past their expiry; queue again the checks whose worker stopped."""
    return services.sweep_uploads()

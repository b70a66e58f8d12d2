"""The Celery application: configuration from Django settings (CELERY_*) and the beat schedule."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")

app = Celery("conch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The heartbeat task and the signal handlers that let probes tell a stuck worker or beat (conch.liveness).
from conch import liveness  # noqa: E402


@app.on_after_configure.connect
def _install_beat_schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        settings.CONCH_RECONCILE_INTERVAL_SECONDS,
        sender.signature("deployments.reconcile_deployments"),
        name="reconcile local deployments",
    )
    sender.add_periodic_task(
        settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS,
        sender.signature("deployments.scrape_metrics"),
        name="scrape Triton metrics",
    )
    sender.add_periodic_task(
        300.0,
        sender.signature("deployments.prune_metric_samples"),
        name="prune old metric samples",
    )
    # Beat's own pulse (conch.liveness): keeps beat publishing, and some worker running a heartbeat, at a
    # known period whatever the other intervals are.
    sender.add_periodic_task(
        settings.CONCH_HEARTBEAT_INTERVAL_SECONDS,
        sender.signature(liveness.HEARTBEAT_TASK, expires=settings.CONCH_HEARTBEAT_INTERVAL_SECONDS),
        name="heartbeat",
    )

"""The Celery application: configuration from Django settings (CELERY_*), queues, routes and the beat schedule.

Two queues: `celery` (builds, deployment starts and stops: minutes long) and `periodic` (the beat tasks:
reconcile, metrics, the sweepers of stuck builds and uploads). Periodic tasks go to their own queue and
expire after about one period, so they never pile up behind a long build, and a worker that was away
does not run a backlog of stale copies. Every worker consumes both (`-Q celery,periodic`, which is also
what a worker started without `-Q` consumes, since both queues are declared here).

Each pool process of a (prefork) worker keeps a warm Triton for the build's verify step: started in the
background when the process starts (`worker_process_init`), stopped when it ends (`worker_process_shutdown`).
Other pools (solo, threads) start it with their first build.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES

# `filesystem://` is kombu's filesystem transport with messages that appear whole (conch.broker): set before any
# connection resolves the name.
TRANSPORT_ALIASES["filesystem"] = "conch.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")

DEFAULT_QUEUE = "celery"
PERIODIC_QUEUE = "periodic"
#: Tasks the beat schedule sends; they are routed to PERIODIC_QUEUE.
PERIODIC_TASKS = (
    "deployments.reconcile_deployments",
    "deployments.scrape_metrics",
    "deployments.prune_metric_samples",
    "builds.sweep_stalled_versions",
    "uploads.sweep_uploads",
    "deployments.collect_repository_garbage",
    "deployments.advance_tensorrt_plans",
    "conch.heartbeat",  # conch.liveness.HEARTBEAT_TASK
)

app = Celery("conch")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = DEFAULT_QUEUE
app.conf.task_queues = (
    Queue(DEFAULT_QUEUE, routing_key=DEFAULT_QUEUE),
    Queue(PERIODIC_QUEUE, routing_key=PERIODIC_QUEUE),
)
app.conf.task_routes = {name: {"queue": PERIODIC_QUEUE} for name in PERIODIC_TASKS}
app.autodiscover_tasks()

# The heartbeat task and the signal handlers that let probes tell a stuck worker or beat (conch.liveness).
from conch import liveness  # noqa: E402


@app.on_after_configure.connect
def _install_beat_schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    schedule = (
        (settings.CONCH_RECONCILE_INTERVAL_SECONDS, "deployments.reconcile_deployments", "reconcile local deployments"),
        (settings.CONCH_METRICS_SCRAPE_INTERVAL_SECONDS, "deployments.scrape_metrics", "scrape Triton metrics"),
        (300.0, "deployments.prune_metric_samples", "prune old metric samples"),
        (settings.CONCH_SWEEP_INTERVAL_SECONDS, "builds.sweep_stalled_versions", "recover stuck builds and uploads"),
        (
            settings.CONCH_SWEEP_INTERVAL_SECONDS,
            "uploads.sweep_uploads",
            "expire resumable uploads, requeue their checks",
        ),
        (settings.CONCH_PLAN_POLL_INTERVAL_SECONDS, "deployments.advance_tensorrt_plans", "follow TensorRT plan Jobs"),
        (900.0, "deployments.collect_repository_garbage", "delete repositories no build or deployment uses"),
        # Beat's own pulse (conch.liveness): keeps beat publishing, and some worker running a heartbeat, at a
        # known period whatever the other intervals are.
        (settings.CONCH_HEARTBEAT_INTERVAL_SECONDS, liveness.HEARTBEAT_TASK, "heartbeat"),
    )
    for period_s, task_name, title in schedule:
        # A copy not started within one period is dropped (the next one is already on its way).
        sender.add_periodic_task(
            period_s,
            sender.signature(task_name),
            name=title,
            expires=period_s,
            queue=PERIODIC_QUEUE,
        )


@worker_process_init.connect
def _warm_up_verify_server(**_: object) -> None:
    """Each pool process starts its warm verify Triton in the background, ahead of its first build."""
    from builds.services import warm_up_verify_server

    warm_up_verify_server()


@worker_process_shutdown.connect
def _stop_verify_server(**_: object) -> None:
    # Pool processes leave through os._exit, which skips atexit; this is their last word.
    from builds.services import stop_warm_verify_server

    stop_warm_verify_server()

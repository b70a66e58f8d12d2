"""Celery wiring: periodic tasks go to their own queue and expire, so they never pile up behind a long build."""

from __future__ import annotations

from conch.celery import DEFAULT_QUEUE, PERIODIC_QUEUE, PERIODIC_TASKS, app


def test_every_beat_entry_expires_within_its_period_on_the_periodic_queue(settings):
    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule

    assert sorted(entry["task"] for entry in schedule.values()) == sorted(PERIODIC_TASKS)
    for entry in schedule.values():
        period_s = entry["schedule"]
        assert entry["options"] == {"expires": period_s, "queue": PERIODIC_QUEUE}, entry
    assert "builds.sweep_stalled_versions" in {entry["task"] for entry in schedule.values()}
    assert "uploads.sweep_uploads" in {entry["task"] for entry in schedule.values()}


def test_the_upload_check_keeps_its_task_name_after_moving_to_the_uploads_app():
    # messages queued before the move name the task as the builds app registered it
    app.loader.import_default_modules()
    assert app.tasks["builds.finish_upload"].__module__ == "uploads.tasks"


def test_periodic_tasks_route_to_their_queue_and_builds_to_the_default_one():
    router = app.amqp.router
    for name in PERIODIC_TASKS:
        assert router.route({}, name)["queue"].name == PERIODIC_QUEUE
    assert router.route({}, "builds.build_version")["queue"].name == DEFAULT_QUEUE
    assert router.route({}, "deployments.start_deployment")["queue"].name == DEFAULT_QUEUE
    # a worker started without -Q consumes both queues (besides its own direct queue, `<node>.dq2`, for
    # liveness heartbeats, which workers started earlier in this process have added)
    assert sorted(q.name for q in app.conf.task_queues) == sorted([DEFAULT_QUEUE, PERIODIC_QUEUE])
    assert {name for name in app.amqp.queues if not name.endswith(".dq2")} == {DEFAULT_QUEUE, PERIODIC_QUEUE}

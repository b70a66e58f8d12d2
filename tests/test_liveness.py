"""Liveness probes of worker and beat (conch.liveness, manage.py worker_health / beat_health).

A real Celery worker (threads, in this process) consumes from the configured broker (Redis under
`make test`): the heartbeat must reach it through its own direct queue and come back as a record.
"""

from __future__ import annotations

import threading
import time

import pytest
from celery import shared_task
from celery.contrib.testing.worker import start_worker
from django.core.management import CommandError, call_command

from conch import liveness

_release = threading.Event()

# The test worker consumes only this queue (and its own direct queue): a build or deployment task that an
# earlier test left in the broker's default queue must not take its only pool process.
TEST_QUEUE = "liveness-test"


@shared_task(name="tests.liveness.hold_pool_process")
def hold_pool_process() -> None:
    """Occupy a pool process until the test releases it (a long build stands in)."""
    _release.wait(120)


@pytest.fixture
def health_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path / "health"


@pytest.fixture
def worker(health_dir):
    from conch.celery import app

    app.control.purge()
    _release.clear()
    # The worker narrows the app-wide set of queues to consume; later in-process workers need it back.
    consumed_before = app.amqp.queues._consume_from
    with start_worker(
        app,
        pool="threads",
        concurrency=1,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
        hostname="liveness@test",
        queues=[TEST_QUEUE],
    ) as controller:
        assert "celery" not in {queue.name for queue in controller.app.amqp.queues.consume_from.values()}
        yield controller
    _release.set()
    app.amqp.queues._consume_from = consumed_before


def _health(node: str, max_age: float, *, send: bool = True) -> str:
    """Run `manage.py worker_health`; return its output, or raise CommandError (exit 1)."""
    from io import StringIO

    out = StringIO()
    call_command("worker_health", node=node, max_age=max_age, no_send=not send, stdout=out)
    return out.getvalue()


def _verdict(max_age_s: float) -> liveness.Liveness:
    return liveness.worker_liveness(node="liveness@test", max_age_s=max_age_s)


def _until_alive(node: str, max_age: float, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _health(node, max_age)
        except CommandError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_worker_health_passes_once_the_worker_ran_a_heartbeat_sent_to_its_own_queue(worker):
    # given a worker that has run no heartbeat yet
    with pytest.raises(CommandError, match="worker liveness@test never ran a heartbeat"):
        _health("liveness@test", 30, send=False)
    # when worker_health sends heartbeats to its queue
    output = _until_alive("liveness@test", 30)
    # then the worker ran one and the probe passes
    assert output.startswith("worker liveness@test ran a heartbeat ")
    # and a heartbeat addressed to another node was not run by this worker
    with pytest.raises(CommandError, match="worker other@test never ran a heartbeat"):
        _health("other@test", 30)
    time.sleep(1)
    with pytest.raises(CommandError, match="worker other@test never ran a heartbeat"):
        _health("other@test", 30, send=False)


def test_a_worker_busy_on_every_pool_process_is_alive_and_an_idle_one_that_runs_nothing_is_not(worker):
    # given a worker that ran a heartbeat, then took a task that holds its only pool process
    _until_alive("liveness@test", 30)
    hold_pool_process.apply_async(queue=TEST_QUEUE)
    deadline = time.monotonic() + 60
    while "busy: tests.liveness.hold_pool_process" not in (verdict := _verdict(max_age_s=0)).reason:
        assert time.monotonic() < deadline, verdict
        time.sleep(0.2)
    # then with its heartbeat stale it still counts as alive: it is busy, not stuck
    assert verdict.alive
    assert verdict.reason.endswith("but every pool process is busy: tests.liveness.hold_pool_process")
    # when the task ends and the pool process sits idle, a stale heartbeat means it is not taking tasks
    _release.set()
    while _verdict(max_age_s=0).alive:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(CommandError, match="with no pool process busy: it is not taking tasks"):
        _health("liveness@test", 0, send=False)


def test_beat_health_follows_the_last_publish(health_dir):
    # given no beat ever ran here
    with pytest.raises(CommandError, match="beat never published a task"):
        call_command("beat_health", max_age=60)
    # when beat publishes
    liveness.record_beat_tick()
    # then the probe passes, and fails once the publish is older than the limit
    call_command("beat_health", max_age=60)
    time.sleep(0.1)
    with pytest.raises(CommandError, match=r"beat published no task for 0\.\d s \(limit 0\.01 s\)"):
        call_command("beat_health", max_age=0.01)

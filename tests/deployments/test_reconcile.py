"""Reconcile heals what it can and leaves alone what is not its own: stalled starts, unloaded models,
permanent load failures, the restart backoff, other hosts' processes and abandoned verify servers.

Every deployment here is a real tritonserver; tasks run inline (eager Celery, on commit).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from builds.model_config import BuildOptions
from builds.services import SERVER_ID_INFIX_VERIFY, served_repository_prefix, stop_verify_servers
from deployments import services
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.runtimes.local import LocalServerState, triton_api_key
from models_registry.storage import get_object_store
from tests import real_models
from tests.deployments.conftest import write_built_version
from tritonserving import server as triton_server
from tritonserving.client import TritonClient

pytestmark = pytest.mark.django_db


def _create(caller, version, capture, *, execute: bool) -> Deployment:
    body = {"name": "web", "team": caller.team.slug, "model_version": version.pk, "runtime": "local"}
    with capture(execute=execute):
        response = caller.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.content
    return Deployment.objects.get(pk=response.json()["id"])


def _server(row: Deployment) -> LocalServerState:
    row.refresh_from_db()
    return LocalServerState.from_state(row.runtime_state)


@pytest.mark.triton
def test_a_start_task_killed_after_spawning_triton_is_adopted_and_ends_ready(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given a deployment whose start task spawned Triton, recorded it, then died (stale heartbeat)
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=False)
    services.ensure_deployment_repository(deployment=row)
    state = get_runtime("local").apply(services.deployment_spec(row), {})
    stale = timezone.now() - timedelta(seconds=600)
    Deployment.objects.filter(pk=row.pk).update(status="starting", runtime_state=state, heartbeat_at=stale)
    # when the periodic reconcile runs
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.reconcile_deployments()
    # then the start ran again, adopted the spawned server (no second one) and the deployment is ready
    assert counts["restarted"] == 1 and counts["orphans_killed"] == 0
    server = _server(row)
    assert row.status == "ready", row.error
    assert server.pid == state["pid"]
    assert [s.pid for s in triton_server.find_servers(server.server_id)] == [server.pid]
    services.stop_deployment(deployment_id=row.pk)


def test_a_start_with_a_fresh_heartbeat_is_left_to_its_task(
    alice, built_classifier, django_capture_on_commit_callbacks
):
    # given a deployment another task is starting right now
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=False)
    Deployment.objects.filter(pk=row.pk).update(status="starting", heartbeat_at=timezone.now())
    # when reconcile runs, and a duplicate start task arrives
    with django_capture_on_commit_callbacks(execute=False) as queued:
        counts = services.reconcile_deployments()
    status = services.ensure_deployment_started(deployment_id=row.pk)
    # then neither starts a second server
    assert counts["restarted"] == 0 and queued == []
    assert status == "starting"
    assert _server(row) == LocalServerState()


@pytest.mark.triton
def test_a_model_unloaded_behind_conchs_back_is_not_ready_then_healed(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given a ready deployment whose model someone unloads through Triton's own API
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=True)
    before = _server(row)
    assert row.status == "ready", row.error
    client = TritonClient(services.internal_url(row), timeout_s=30, api_key=triton_api_key(before.server_id))
    client.unload_model("classifier")
    deadline = time.monotonic() + 30
    while client.model_ready("classifier") and time.monotonic() < deadline:
        time.sleep(0.2)
    # when the periodic reconcile runs
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.reconcile_deployments()
    # then it was seen as not ready, recorded, and healed on the same server (model loaded again)
    assert counts["failed"] == 1
    after = _server(row)
    assert row.status == "ready", row.error
    assert "model 'classifier' is not ready" in row.last_failure
    assert after.pid == before.pid
    assert client.model_ready("classifier")
    services.stop_deployment(deployment_id=row.pk)


@pytest.mark.triton
def test_a_model_triton_refuses_to_load_fails_permanently_and_is_not_restarted(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a built version whose stored model file is not a model Triton can load
    version = write_built_version(alice.team, "broken", real_models.classifier(), BuildOptions(max_batch_size=4))
    get_object_store().put_bytes(f"{served_repository_prefix(version)}/broken/{version.number}/model.onnx", b"not onnx")
    # when it is deployed
    row = _create(alice, version, django_capture_on_commit_callbacks, execute=True)
    row.refresh_from_db()
    # then it failed, says restarting will not help, and no process is left
    assert (row.status, row.permanent_failure) == ("failed", True)
    assert "Restarting will not help" in row.error
    assert triton_server.find_servers(_server(row).server_id) == []
    # and reconcile, long after, leaves it failed
    Deployment.objects.filter(pk=row.pk).update(failed_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.reconcile_deployments()
    row.refresh_from_db()
    assert counts["restarted"] == 0
    assert (row.status, row.restart_count) == ("failed", 0)


@pytest.mark.triton
def test_the_restart_count_resets_after_a_stable_period(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given a ready deployment that was restarted three times, ready for longer than the reset period
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=True)
    long_ago = timezone.now() - timedelta(seconds=settings.CONCH_RESTART_BACKOFF_RESET_SECONDS + 5)
    Deployment.objects.filter(pk=row.pk).update(restart_count=3, ready_at=long_ago)
    # when reconcile runs
    services.reconcile_deployments()
    # then the count (and with it the backoff) starts over
    row.refresh_from_db()
    assert (row.status, row.restart_count) == ("ready", 0)
    services.stop_deployment(deployment_id=row.pk)


@pytest.mark.triton
def test_a_recently_restarted_deployment_keeps_its_restart_count(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=True)
    Deployment.objects.filter(pk=row.pk).update(restart_count=3, ready_at=timezone.now())
    services.reconcile_deployments()
    row.refresh_from_db()
    assert (row.status, row.restart_count) == ("ready", 3)
    services.stop_deployment(deployment_id=row.pk)


def test_another_worker_hosts_process_is_never_marked_failed_or_restarted(
    alice, built_classifier, django_capture_on_commit_callbacks
):
    # given a ready deployment whose Triton runs on another worker host (its pid means nothing here)
    row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=False)
    state = LocalServerState(host="other-worker", server_id="x", pid=999999, create_time=1.0, http_port=1).to_state()
    Deployment.objects.filter(pk=row.pk).update(status="ready", runtime_state=state)
    # when this host's reconcile and a stray start task run
    with django_capture_on_commit_callbacks(execute=False) as queued:
        counts = services.reconcile_deployments()
    status = services.ensure_deployment_started(deployment_id=row.pk)
    # then nothing happened to it
    row.refresh_from_db()
    assert counts == {"failed": 0, "restarted": 0, "stopped": 0, "orphans_killed": 0}
    assert queued == [] and status == "ready"
    assert (row.status, row.runtime_state) == ("ready", state)


@pytest.mark.triton
def test_a_verify_server_whose_build_process_died_is_stopped(settings):
    # given two verify servers: one owned by this (live) process, one by a process that no longer exists
    root = settings.CONCH_TRITON_DIR
    backend_root = triton_server.ensure_backend_directory(root / "backends")
    (root / "empty").mkdir(parents=True, exist_ok=True)
    dead_owner = _dead_pid()
    servers = []
    for owner in (os.getpid(), dead_owner):
        ports = triton_server.allocate_ports(3)
        servers.append(
            triton_server.start_server(
                server_id=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}{owner}-abc",
                repository=root / "empty",
                http_port=ports[0],
                grpc_port=ports[1],
                metrics_port=ports[2],
                log_path=root / f"verify-{owner}.log",
                backend_root=backend_root,
                api_key="k" * 32,
            )
        )
    for server in servers:  # exec'd and up, as a build's verify server is
        triton_server.wait_until_ready(server, timeout_s=60)
    mine, abandoned = servers
    # when the sweep runs (reconcile calls it)
    stopped = stop_verify_servers(only_abandoned=True)
    # then only the abandoned one is gone
    assert stopped == 1
    assert not triton_server.is_alive(abandoned.pid, abandoned.create_time)
    assert triton_server.is_alive(mine.pid, mine.create_time)
    triton_server.stop_server(mine.pid, mine.create_time)


def _dead_pid() -> int:
    """A pid that no process has now (taken from a child that has exited)."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    assert not triton_server.process_exists(child.pid)
    return child.pid


def _reconcile_queries(django_capture_on_commit_callbacks) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured, django_capture_on_commit_callbacks(execute=False):
        services.reconcile_deployments()
    return [query["sql"] for query in captured.captured_queries]


def test_a_reconcile_tick_costs_the_same_queries_for_one_deployment_or_many(
    alice, built_classifier, django_capture_on_commit_callbacks
):
    # given one deployment of each kind a tick only looks at (another host's ready Triton, a stop in progress, a
    # permanent failure)
    def kinds(suffix: str) -> None:
        other_host = LocalServerState(host="elsewhere", server_id="x", pid=999999, create_time=1.0, http_port=1)
        for name, status, extra in (
            ("ready", "ready", {"runtime_state": other_host.to_state()}),
            ("stopping", "stopping", {"desired_state": "stopped"}),
            ("failed", "failed", {"permanent_failure": True}),
        ):
            row = _create(alice, built_classifier, django_capture_on_commit_callbacks, execute=False)
            Deployment.objects.filter(pk=row.pk).update(name=f"{name}-{suffix}", status=status, **extra)

    kinds("a")
    one_each = _reconcile_queries(django_capture_on_commit_callbacks)
    # when there are three of each
    kinds("b")
    kinds("c")
    three_each = _reconcile_queries(django_capture_on_commit_callbacks)
    # then a tick makes the same queries: none per deployment
    assert len(three_each) == len(one_each), three_each

"""Deployments on the local runtime: create, start, infer, reconcile (dead Triton, orphans), stop.

Tasks run inline (eager Celery, on commit); every deployment is a real tritonserver process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import numpy as np
import onnxruntime
import psutil
import pytest
from django.test import Client
from django.utils import timezone

from deployments import services, tasks
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.runtimes.base import DeploymentSpec, Phase
from deployments.runtimes.local import LocalServerState, triton_api_key
from tests import real_models
from tests.build_records import fail_current_build
from tests.tritonserving.test_server import _write_classifier
from tritonserving import server as triton_server
from tritonserving.client import TritonClient

pytestmark = pytest.mark.django_db


def _deploy(caller, version, capture, **extra) -> dict:
    body = {"name": "web", "team": caller.team.slug, "model_version": version.pk, "runtime": "local", **extra}
    with capture(execute=True):
        response = caller.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.content
    return caller.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()


def _server(row: Deployment) -> LocalServerState:
    """The local runtime's record of a deployment's tritonserver."""
    row.refresh_from_db()
    return LocalServerState.from_state(row.runtime_state)


def _second_triton(server: LocalServerState, triton_dir: Path, name: str) -> triton_server.ServerProcess:
    """Start another Triton under `server`'s server id (as a crashed start, or one not yet recorded, leaves one),
    its log at `triton_dir`/<name>.log."""
    backend_root = triton_server.ensure_backend_directory(triton_dir / "backends")
    ports = triton_server.allocate_ports(3)
    return triton_server.start_server(
        server_id=server.server_id,
        repository=str(triton_dir),
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        log_path=triton_dir / f"{name}.log",
        backend_root=backend_root,
        api_key=triton_api_key(server.server_id),
    )


def _port_is_free(port: int) -> bool:
    """Whether a new server could listen on `port` (TIME_WAIT leftovers of closed connections don't count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _classifier_request(batch: int, seed: int = 0) -> tuple[np.ndarray, dict]:
    x = np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    return x, {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


@pytest.mark.triton
def test_deploy_infer_and_delete(alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks):
    # given a ready deployment with overrides
    d = _deploy(
        alice,
        built_classifier,
        django_capture_on_commit_callbacks,
        instance_count=2,
        max_batch_size=4,
        max_queue_delay_microseconds=1000,
    )
    assert d["status"] == "ready", d["error"]
    assert d["endpoints"]["http"].startswith("http://127.0.0.1:")
    assert "count: 2" in d["config_pbtxt"] and "max_batch_size: 4" in d["config_pbtxt"]
    assert any("successfully loaded" in line for line in d["log_tail"])
    # when a KServe v2 request is sent through Conch
    x, request = _classifier_request(batch=3)
    response = alice.client.post(f"/api/v1/deployments/{d['id']}/infer", request, format="json")
    # then Triton's response comes back, equal to onnxruntime's
    assert response.status_code == 200, response.content
    out = response.json()["outputs"][0]
    assert (out["name"], out["shape"], out["datatype"]) == ("fetch_name_0", [3, 4], "FP32")
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(np.array(out["data"]).reshape(3, 4), expected, rtol=1e-4, atol=1e-5)
    # and once the periodic scrape has run, the metrics count it (the first sample counts from zero)
    assert tasks.scrape_metrics() == 1
    [stats] = alice.client.get(f"/api/v1/deployments/{d['id']}/metrics?window=300").json()["models"]
    assert (stats["request_count"], stats["inference_count"], stats["execution_count"]) == (1, 3, 1)
    assert d["effective"] == {
        "max_batch_size": 4,
        "instance_count": 2,
        "instance_kind": "KIND_AUTO",
        "dynamic_batching": True,
        "max_queue_delay_microseconds": 1000,
    }
    # a request Triton rejects comes back 400 with Triton's message
    bad = {"inputs": [{"name": "x", "shape": [1, 3, 10, 10], "datatype": "FP32", "data": [0.0] * 300}]}
    response = alice.client.post(f"/api/v1/deployments/{d['id']}/infer", bad, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("unexpected shape for input 'x'")
    # when it is deleted
    server = _server(Deployment.objects.get(pk=d["id"]))
    ports = [server.http_port, server.grpc_port, server.metrics_port]
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.delete(f"/api/v1/deployments/{d['id']}/")
    assert response.status_code == 202
    # then no process is left and the ports are free
    stopped = alice.client.get(f"/api/v1/deployments/{d['id']}/").json()
    assert stopped["status"] == "stopped" and stopped["endpoints"]["http"] == ""
    assert not triton_server.is_alive(server.pid, server.create_time)
    assert all(_port_is_free(p) for p in ports)


def _load_status(http_url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"{http_url}/v2/repository/models/classifier/load", data=b"{}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.triton
def test_a_deployments_triton_answers_only_to_conchs_key_and_gets_no_secret(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, monkeypatch, settings
):
    # given: the worker's environment holds Conch's secrets
    secrets = {
        "DATABASE_URL": "postgres://conch:db-password-e41f@db.internal:5432/conch",
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "CELERY_BROKER_URL": "redis://:broker-password-09ab@redis.internal:6379/0",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    # when a deployment starts
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    server = _server(Deployment.objects.get(pk=d["id"]))
    http_url = f"http://127.0.0.1:{server.http_port}"
    # then a caller of its published endpoint cannot load models; the key any Conch process derives can
    assert d["status"] == "ready", d["error"]
    assert _load_status(http_url, {}) == 403
    assert _load_status(http_url, {"X-Conch-Key": triton_api_key(server.server_id)}) == 200
    [found] = triton_server.find_servers(server.server_id)
    assert found.api_key == triton_api_key(server.server_id)
    # and neither the server nor its backend stub got a secret, while inference works
    processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    assert len(processes) == 2
    for process in processes:
        environment = process.environ()
        assert not set(secrets) & set(environment)
        assert not [value for value in secrets.values() if value in "\0".join(environment.values())]
    _, request = _classifier_request(batch=1)
    assert alice.client.post(f"/api/v1/deployments/{d['id']}/infer", request, format="json").status_code == 200
    services.stop_deployment(deployment_id=d["id"])


def _wait_until_gone(server: LocalServerState) -> None:
    deadline = time.monotonic() + 10
    while triton_server.is_alive(server.pid, server.create_time) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.triton
def test_reconcile_reports_a_dead_triton_and_restarts_it(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given a ready deployment whose Triton is then killed by SIGKILL
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    row = Deployment.objects.get(pk=d["id"])
    old = _server(row)
    os.kill(old.pid, signal.SIGKILL)
    _wait_until_gone(old)
    # when the periodic reconcile runs
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.reconcile_deployments()
    # then it reported the failure, naming the signal, with Triton's last log lines, and started a new Triton on
    # the same ports
    assert counts["failed"] == 1
    new = _server(row)
    assert row.status == "ready"
    assert row.restart_count == 1
    assert new.pid != old.pid and triton_server.is_alive(new.pid, new.create_time)
    assert (new.http_port, new.grpc_port, new.metrics_port) == (old.http_port, old.grpc_port, old.metrics_port)
    assert row.last_failure.startswith("Triton was stopped by signal SIGKILL (9).\nLast lines of Triton's log:\n")
    x, request = _classifier_request(batch=1)
    assert alice.client.post(f"/api/v1/deployments/{d['id']}/infer", request, format="json").status_code == 200
    # and, ready again, it shows no current error in the API or on its page: the failure is in its history
    shown = alice.client.get(f"/api/v1/deployments/{d['id']}/").json()
    assert (shown["status"], shown["error"], shown["status_message"]) == ("ready", "", "")
    assert shown["last_failure"] == row.last_failure
    console = Client()
    console.force_login(alice.user)
    html = console.get(f"/deployments/{d['id']}/").content.decode()
    assert '<pre class="error" id="error" hidden></pre>' in html
    assert '<p id="status-message" class="muted"></p>' in html
    history = [(e.action, e.after.get("message")) for e in services.deployment_events(row)]
    assert history[:3] == [
        ("deployment.recovered", None),
        ("deployment.restarted", None),
        ("deployment.failed", "Triton was stopped by signal SIGKILL (9)."),
    ]
    assert "deployment.failed" in html and "Triton was stopped by signal SIGKILL (9)." in html
    services.stop_deployment(deployment_id=row.pk)


@pytest.mark.triton
def test_a_triton_that_exits_with_a_code_says_the_code(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given Triton told to listen on an address this host does not have (TEST-NET-1, RFC 5737): it exits with a
    # code of its own during start-up
    settings.CONCH_TRITON_BIND_ADDRESS = "192.0.2.1"
    # when a deployment starts
    body = {"name": "web", "team": alice.team.slug, "model_version": built_classifier.pk, "runtime": "local"}
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post("/api/v1/deployments/", body, format="json")
    # then it failed saying Triton's exit code
    shown = alice.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    assert shown["status"] == "failed"
    assert shown["status_message"] == (
        f"Triton did not become ready: tritonserver '{settings.CONCH_INSTANCE_ID}.dep.{shown['id']}' exited during "
        "start-up with code 1"
    )
    assert "failed to start" in shown["error"]


@pytest.mark.triton
def test_the_local_runtime_says_the_exit_code_of_a_triton_that_exited_with_one(settings, tmp_path):
    # given a deployment's Triton that ends with an error of its own: asked to stop (SIGTERM) with no time left to
    # unload its model (`--exit-timeout-secs=0`), it logs "Exit timeout expired" and exits with code 1
    repository = tmp_path / "repository"
    _write_classifier(repository, "orientation")
    backend_root = triton_server.ensure_backend_directory(settings.CONCH_TRITON_DIR / "backends")
    ports = triton_server.allocate_ports(3)
    server_id = f"{settings.CONCH_INSTANCE_ID}.dep.1"
    process = triton_server.start_server(
        server_id=server_id,
        repository=repository,
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        log_path=settings.CONCH_TRITON_DIR / "logs" / "deployment-1.log",
        backend_root=backend_root,
        api_key=triton_api_key(server_id),
        exit_timeout_s=0,
    )
    triton_server.wait_until_ready(process, timeout_s=60)
    with TritonClient(process.http_url, timeout_s=60, api_key=triton_api_key(server_id)) as client:
        client.load_model("orientation")
    os.kill(process.pid, signal.SIGTERM)
    state = LocalServerState.of_process(process, log_path=process.log_path)
    _wait_until_gone(state)
    # when the local runtime observes it (as reconcile does, from any worker process)
    spec = DeploymentSpec(deployment_id=1, model_name="orientation", repository=str(repository), config_json="{}")
    observation = get_runtime("local").observe(spec, state.to_state())
    # then it says the code
    assert (observation.phase, observation.message) == (Phase.ABSENT, "Triton exited with code 1.")


@pytest.mark.triton
def test_a_triton_that_shuts_down_on_sigterm_says_so(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given a ready deployment whose Triton someone stops with SIGTERM (Triton shuts down by itself, code 0)
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    row = Deployment.objects.get(pk=d["id"])
    old = _server(row)
    os.kill(old.pid, signal.SIGTERM)
    _wait_until_gone(old)
    # when reconcile sees it (its restart not run yet)
    with django_capture_on_commit_callbacks(execute=False):
        services.reconcile_deployments()
    # then the deployment says which signal ended it
    row.refresh_from_db()
    assert (row.status, row.status_message) == ("failed", "Triton shut down on signal SIGTERM (15).")


@pytest.mark.triton
def test_reconcile_spares_the_triton_a_start_in_progress_has_not_recorded_yet(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given a deployment being started again (`starting`, fresh heartbeat) whose start has launched its Triton but
    # not yet saved that server's state (the window between the runtime's apply and the save)
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    row = Deployment.objects.get(pk=d["id"])
    server = _server(row)
    Deployment.objects.filter(pk=row.pk).update(status="starting", heartbeat_at=timezone.now())
    launched = _second_triton(server, settings.CONCH_TRITON_DIR, "launched")
    try:
        # when reconcile runs in that window
        counts = services.reconcile_deployments()
        # then the start's server is not taken for an orphan
        assert counts["orphans_killed"] == 0
        assert triton_server.is_alive(launched.pid, launched.create_time)
        # and when that start stops beating (its worker died), the server it left is an orphan after all
        stale = timezone.now() - timedelta(seconds=settings.CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS + 5)
        Deployment.objects.filter(pk=row.pk).update(heartbeat_at=stale)
        with django_capture_on_commit_callbacks(execute=True):
            counts = services.reconcile_deployments()
        assert counts["orphans_killed"] == 1 and counts["restarted"] == 1
        assert not triton_server.is_alive(launched.pid, launched.create_time)
        row.refresh_from_db()
        assert row.status == "ready" and _server(row) == server
    finally:
        if triton_server.is_alive(launched.pid, launched.create_time):
            triton_server.stop_server(launched.pid, launched.create_time)
        services.stop_deployment(deployment_id=row.pk)


@pytest.mark.triton
def test_restarted_conch_adopts_its_triton_and_kills_orphans(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given a ready deployment, and a second Triton tagged for it (as left by a crashed start)
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    row = Deployment.objects.get(pk=d["id"])
    server = _server(row)
    orphan = _second_triton(server, settings.CONCH_TRITON_DIR, "orphan")
    triton_server.wait_until_ready(orphan, timeout_s=60)
    # when Conch restarts (nothing in the database changes) and reconcile runs
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.reconcile_deployments()
        again = services.ensure_deployment_started(deployment_id=row.pk)
    # then the recorded Triton is adopted, the duplicate is gone, nothing new started
    assert counts["orphans_killed"] == 1
    assert again == "ready"
    assert not triton_server.is_alive(orphan.pid, orphan.create_time)
    running = triton_server.find_servers(server.server_id)
    assert [s.pid for s in running] == [server.pid]
    assert _server(row) == server
    assert row.restart_count == 0
    services.stop_deployment(deployment_id=row.pk)
    assert psutil.pid_exists(server.pid) is False or not triton_server.is_alive(server.pid, server.create_time)


@pytest.mark.triton
def test_conch_shutdown_stops_tritons_and_the_next_start_brings_deployments_back(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given a ready deployment, and another installation's Triton whose id shares our prefix's letters
    d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
    row = Deployment.objects.get(pk=d["id"])
    server = _server(row)
    ports = triton_server.allocate_ports(3)
    neighbour = triton_server.start_server(
        server_id=f"{settings.CONCH_INSTANCE_ID}-b.dep.1",
        repository=str(settings.CONCH_TRITON_DIR),
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        log_path=settings.CONCH_TRITON_DIR / "neighbour.log",
        backend_root=triton_server.ensure_backend_directory(settings.CONCH_TRITON_DIR / "backends"),
        api_key=triton_api_key(f"{settings.CONCH_INSTANCE_ID}-b.dep.1"),
    )
    # when Conch shuts down (the demo's Ctrl-C)
    assert services.stop_all_local_servers() == 1
    # then its Triton is gone and it waits as pending, not failed; the other installation's is untouched
    assert not triton_server.is_alive(server.pid, server.create_time)
    assert triton_server.is_alive(neighbour.pid, neighbour.create_time)
    triton_server.stop_server(neighbour.pid, neighbour.create_time)
    row.refresh_from_db()
    assert (row.status, row.error, row.restart_count) == ("pending", "", 0)
    # when Conch runs again and reconcile sees it (after the grace period for queued starts)
    Deployment.objects.filter(pk=row.pk).update(updated_at=timezone.now() - timedelta(seconds=60))
    with django_capture_on_commit_callbacks(execute=True):
        services.reconcile_deployments()
    # then it is ready again, without a recorded crash
    again = _server(row)
    assert (row.status, row.restart_count, row.last_failure) == ("ready", 0, "")
    assert triton_server.is_alive(again.pid, again.create_time)
    services.stop_deployment(deployment_id=row.pk)


ROOT = Path(__file__).resolve().parent.parent.parent


def _default_instance_id(var_dir: Path) -> str:
    """The CONCH_INSTANCE_ID of an installation whose data folder is `var_dir` and that sets none (settings are
    read once per process, so in a subprocess)."""
    environment = {name: value for name, value in os.environ.items() if name != "CONCH_INSTANCE_ID"}
    environment.update(CONCH_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="conch.settings")
    code = "import django; django.setup(); from django.conf import settings; print(settings.CONCH_INSTANCE_ID)"
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def _triton_of(triton_dir: Path, server_id: str) -> triton_server.ServerProcess:
    """Start a Triton as the installation whose Triton folder is `triton_dir` starts one: on its own backend
    directory, tagged `server_id`."""
    backend_root = triton_server.ensure_backend_directory(triton_dir / "backends")
    ports = triton_server.allocate_ports(3)
    return triton_server.start_server(
        server_id=server_id,
        repository=str(triton_dir),
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        log_path=triton_dir / f"{server_id}.log",
        backend_root=backend_root,
        api_key=triton_api_key(server_id),
    )


@pytest.mark.triton
def test_a_second_installation_on_the_host_leaves_the_first_ones_tritons_alone(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks, settings, tmp_path
):
    # given two installations on one host (two checkouts), each with its own data folder, neither setting
    # CONCH_INSTANCE_ID
    first_var, second_var = tmp_path / "first" / "var", tmp_path / "second" / "var"
    first_id, second_id = _default_instance_id(first_var), _default_instance_id(second_var)
    assert first_id != second_id
    # the first serves its deployment 1 on a Triton
    first = _triton_of(first_var / "triton", f"{first_id}.dep.1")
    try:
        # and this Conch is the second, serving a deployment of its own
        settings.VAR_DIR, settings.CONCH_TRITON_DIR, settings.CONCH_INSTANCE_ID = (
            second_var,
            second_var / "triton",
            second_id,
        )
        d = _deploy(alice, built_classifier, django_capture_on_commit_callbacks)
        mine = _server(Deployment.objects.get(pk=d["id"]))
        # when the second's reconcile looks for orphans, then the second shuts down (the demo's Ctrl-C)
        counts = services.reconcile_deployments()
        stopped = services.stop_all_local_servers()
        # then only the second's own Triton was stopped; the first's still runs
        assert (counts["orphans_killed"], stopped) == (0, 1)
        assert not triton_server.is_alive(mine.pid, mine.create_time)
        assert triton_server.is_alive(first.pid, first.create_time)
    finally:
        triton_server.stop_server(first.pid, first.create_time)


@pytest.mark.triton
def test_a_server_named_like_ours_but_not_started_by_this_installation_is_left_alone(settings, tmp_path):
    # given two Tritons named like this installation's deployment servers, no deployment recording either: one on
    # this installation's backend folder (an orphan of ours), one started by another checkout that was given the
    # same CONCH_INSTANCE_ID; and that checkout's verify server, also named like ours
    prefix = settings.CONCH_INSTANCE_ID
    elsewhere = tmp_path / "elsewhere" / "triton"
    orphan = _triton_of(settings.CONCH_TRITON_DIR, f"{prefix}.dep.998")
    look_alikes = [
        _triton_of(elsewhere, f"{prefix}.dep.999"),
        _triton_of(elsewhere, f"{prefix}.verify.{os.getpid()}-abc"),
    ]
    try:
        # when reconcile looks for orphans
        counts = services.reconcile_deployments()
        # then only ours was stopped
        assert counts["orphans_killed"] == 1
        assert not triton_server.is_alive(orphan.pid, orphan.create_time)
        assert all(triton_server.is_alive(s.pid, s.create_time) for s in look_alikes)
        # and when this installation shuts down (the demo's Ctrl-C), the look-alikes still run
        assert services.stop_all_local_servers() == 0
        assert all(triton_server.is_alive(s.pid, s.create_time) for s in look_alikes)
    finally:
        for server in look_alikes:
            triton_server.stop_server(server.pid, server.create_time)


def test_deploying_a_version_that_is_not_built_gets_409(alice, built_classifier):
    fail_current_build(built_classifier, "bad file")
    response = alice.client.post(
        "/api/v1/deployments/", {"name": "web", "team": "acme", "model_version": built_classifier.pk}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["field"] == "model_version"


@pytest.mark.parametrize(
    ("change", "field", "status"),
    [
        ({"name": "Web_1"}, "name", 400),
        ({"runtime": "kubernetes"}, "cluster", 400),
        ({"runtime": "kubernetes", "cluster": "nowhere"}, "cluster", 400),
        ({"replicas": 2}, "replicas", 400),
        ({"gpu": {"count": 1}}, "gpu", 400),
        ({"runtime": "docker"}, "runtime", 400),
        ({"instance_count": 0}, "instance_count", 400),
        ({"max_batch_size": -1}, "max_batch_size", 400),
        ({"max_queue_delay_microseconds": "soon"}, "max_queue_delay_microseconds", 400),
        ({"model_version": "abc"}, "model_version", 400),
        ({"model_version": 999999}, "model_version", 404),
        ({"team": "globex"}, "team", 404),
    ],
)
def test_bad_deployment_requests_name_the_field(alice, built_classifier, change, field, status):
    body = {"name": "web", "team": "acme", "model_version": built_classifier.pk, "runtime": "local", **change}
    response = alice.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == status, response.content
    assert response.json()["field"] == field
    assert Deployment.objects.count() == 0


def test_max_batch_size_above_zero_on_a_fixed_batch_model_gets_400(alice):
    from tests.deployments.conftest import write_built_version

    version = write_built_version(alice.team, "captcha", real_models.ddddocr_common())
    response = alice.client.post(
        "/api/v1/deployments/",
        {"name": "web", "team": "acme", "model_version": version.pk, "max_batch_size": 8},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["field"] == "max_batch_size"


def test_other_teams_deployments_are_invisible(alice, bob, built_classifier):
    response = bob.client.post(
        "/api/v1/deployments/",
        {"name": "web", "team": "globex", "model_version": built_classifier.pk},
        format="json",
    )
    assert response.status_code == 404
    assert response.json()["field"] == "model_version"


def test_infer_on_a_deployment_that_is_not_ready_gets_409(alice, built_classifier):
    response = alice.client.post(
        "/api/v1/deployments/", {"name": "web", "team": "acme", "model_version": built_classifier.pk}, format="json"
    )
    deployment_id = response.json()["id"]
    response = alice.client.post(f"/api/v1/deployments/{deployment_id}/infer", {"inputs": []}, format="json")
    assert response.status_code == 409

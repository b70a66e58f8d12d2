"""The test kubelet: runs the pods the real scheduler binds to the test cluster's fake Nodes, with local processes.

It stands in for a node's kubelet and container runtime, and nothing else does (devtools/cluster/control_plane.py
starts it).
What it does, after the kubelet's documented behaviour (Kubernetes "Pod Lifecycle", "Configure Liveness,
Readiness and Startup Probes", "Define Environment Variables for a Container", "Expose Pod Information"):
- watches every pod bound (`spec.nodeName`) to one of its nodes;
- gives each pod an address of its own in 127.0.0.0/8 (Linux routes the whole range to `lo`), never 127.0.0.1;
- resolves each container's environment (literal values with `$(VAR)` references, `secretKeyRef`,
  `configMapKeyRef`, a few `fieldRef`s, `envFrom` Secrets and ConfigMaps, read through the API);
- maps any `nvcr.io/nvidia/tritonserver:*` image to the `tritonserver` of the nvidia-pytriton wheel with our CPU
  backends (and the stand-in `tensorrt` backend of devtools/cluster/standins), runs the container's command and
  args (`$(VAR)` expanded, `$$` escapes) and adds the flags that bind Triton to the pod's address; runs an
  `nvcr.io/nvidia/tensorrt:*` image's command with this Python as `python3` and the stand-in `trtexec` on PATH;
  other images fail like a registry that does not have them (`ErrImagePull`, then `ImagePullBackOff`);
- runs the startup, readiness and liveness `httpGet` probes with their periods and thresholds (named ports
  resolved), restarts containers that exit or fail their liveness probe with the crash-loop back-off (10 s doubling
  up to 5 minutes; first restart at once), and patches `pods/status` as a kubelet does;
- on deletion stops the containers (SIGTERM, the grace period, SIGKILL) and deletes the pod with grace period 0;
- serves `/containerLogs/{namespace}/{pod}/{container}` over HTTPS, which the API server proxies pod logs to.
With `fake_containers=True` pods turn Running and Ready at once and nothing is started (for benchmarks).
Every process it starts leads its own process group and is stopped when the kubelet stops.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from devtools.cluster.control_plane import die_with_parent, record_process

logger = logging.getLogger("devtools.cluster.kubelet")

TRITON_IMAGE = re.compile(r"(nvcr\.io/)?nvidia/tritonserver(:[^@]+)?(@sha256:[0-9a-f]+)?")
TRITON_COMMANDS = {"tritonserver", "/opt/tritonserver/bin/tritonserver"}
TENSORRT_IMAGE = re.compile(r"(nvcr\.io/)?nvidia/tensorrt(:[^@]+)?(@sha256:[0-9a-f]+)?")
STANDINS = Path(__file__).resolve().parent / "standins"
# Flags the kubelet sets itself on Triton (its address and the local backends), replacing any in the manifest.
_OWN_FLAGS = ("--http-address", "--grpc-address", "--metrics-address", "--backend-directory")
BACKOFF_CAP_S = 300.0
LOG_TAIL_LINES = 20
TERMINATION_MESSAGE_BYTES = 2048


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, variables: dict[str, str]) -> str:
    """Expand `$(NAME)` from `variables` as Kubernetes does: `$$` is a literal `$`, unknown references stay."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "$" and index + 1 < len(text):
            following = text[index + 1]
            if following == "$":
                out.append("$")
                index += 2
                continue
            if following == "(":
                end = text.find(")", index + 2)
                if end != -1:
                    name = text[index + 2 : end]
                    out.append(variables.get(name, text[index : end + 1]))
                    index = end + 1
                    continue
        out.append(char)
        index += 1
    return "".join(out)


class ConfigError(Exception):
    """A container cannot be configured (a missing Secret or key): `CreateContainerConfigError`."""


@dataclass
class Probe:
    """One probe of a container, with its schedule and consecutive results."""

    kind: str  # startup | readiness | liveness
    spec: dict[str, Any]
    scale: float
    due: float = 0.0
    successes: int = 0
    failures: int = 0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10)) * self.scale

    def reset(self, started: float) -> None:
        self.due = started + float(self.spec.get("initialDelaySeconds", 0)) * self.scale
        self.successes = self.failures = 0

    def run(self, address: str, ports: dict[str, int]) -> bool:
        """Probe once (only `httpGet` is supported); record the result and return whether the probe passed."""
        get = self.spec.get("httpGet") or {}
        port = get.get("port", 80)
        port = ports.get(port, port) if isinstance(port, str) and not port.isdigit() else int(port)
        scheme = str(get.get("scheme", "HTTP")).lower()
        url = f"{scheme}://{get.get('host') or address}:{port}{get.get('path', '/')}"
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=float(self.spec.get("timeoutSeconds", 1))) as response:
                passed = 200 <= response.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            passed = False
        if passed:
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1
        return passed

    @property
    def succeeded(self) -> bool:
        return self.successes >= int(self.spec.get("successThreshold", 1))

    @property
    def failed(self) -> bool:
        return self.failures >= int(self.spec.get("failureThreshold", 3))


@dataclass
class Container:
    """One container of a pod: its spec, current process, status fields and crash-loop bookkeeping."""

    spec: dict[str, Any]
    log_dir: Path
    probes: list[Probe] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""
    started_at: float = 0.0
    next_start: float = 0.0
    backoff_s: float = 0.0

    @property
    def name(self) -> str:
        return self.spec["name"]

    def log_path(self, restart: int | None = None) -> Path:
        return self.log_dir / f"{self.restart_count if restart is None else restart}.log"

    def status(self) -> dict[str, Any]:
        image = self.spec.get("image", "")
        status = {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "image": image,
            "imageID": f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
            "started": self.started,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


class PodWorker(threading.Thread):
    """Runs one pod: starts its containers, probes them, restarts them, reports status, and tears it down."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any], address: str) -> None:
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['namespace']}/{metadata['name']}", daemon=True)
        self.kubelet = kubelet
        self.pod = pod
        self.namespace, self.pod_name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]
        self.address = address
        self.start_time = _now()
        self.wake = threading.Event()
        self.terminating: float | None = None  # grace period in seconds once deletion was requested
        self.stopping = False
        self.reported: dict[str, Any] | None = None
        folder = kubelet.state_dir / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid}"
        self.containers = [
            Container(
                spec=spec,
                log_dir=folder / spec["name"],
                probes=[
                    Probe(kind, spec[f"{kind}Probe"], kubelet.probe_scale)
                    for kind in ("startup", "readiness", "liveness")
                    if spec.get(f"{kind}Probe")
                ],
            )
            for spec in pod["spec"].get("containers", [])
        ]
        self.ports = {
            port["name"]: int(port["containerPort"])
            for spec in pod["spec"].get("containers", [])
            for port in spec.get("ports") or []
            if port.get("name")
        }

    # -- loop ------------------------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping:
            if self.terminating is not None:
                self._stop_containers(self.terminating)
                self._report()
                if self.kubelet.delete_pod(self.namespace, self.pod_name, self.uid):
                    break
                self.wake.wait(1.0)
                continue
            wait_s = min((self._step(container) for container in self.containers), default=5.0)
            self._report()
            if self.reported is None:  # the API server is away: try again soon
                wait_s = min(wait_s, 1.0)
            self.wake.wait(max(0.05, wait_s))
            self.wake.clear()
        if self.stopping:
            self._stop_containers(5.0)
        self.kubelet.forget(self.uid)

    def request_deletion(self, grace_s: float) -> None:
        if self.terminating is None:
            self.terminating = grace_s
            self.wake.set()

    def stop(self) -> None:
        """Stop the containers (kubelet shutdown) without touching the pod object."""
        self.stopping = True
        self.wake.set()

    def _step(self, container: Container) -> float:
        """Advance one container's life by what is due now; return how many seconds until something is due."""
        now = time.monotonic()
        restart_policy = self.pod["spec"].get("restartPolicy", "Always")
        if container.process is None:
            if container.state.get("terminated") and (
                restart_policy == "Never"
                or (restart_policy == "OnFailure" and container.state["terminated"]["exitCode"] == 0)
            ):
                return 60.0
            if now < container.next_start:
                return container.next_start - now
            return self._start(container)
        code = container.process.poll()
        if code is not None:
            self._exited(container, code)
            return 0.0
        if self.kubelet.fake_containers:
            return 60.0
        return self._probe(container, now)

    def _start(self, container: Container) -> float:
        image = container.spec.get("image", "")
        if not (TRITON_IMAGE.fullmatch(image) or TENSORRT_IMAGE.fullmatch(image)):
            # What a node shows for an image its registry does not have: ErrImagePull, then ImagePullBackOff.
            pulled_once = container.state.get("waiting", {}).get("reason") in ("ErrImagePull", "ImagePullBackOff")
            reason = "ImagePullBackOff" if pulled_once else "ErrImagePull"
            message = (
                f'Back-off pulling image "{image}"'
                if pulled_once
                else f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                f"not found (the test kubelet runs nvcr.io/nvidia/tritonserver and tensorrt images only)"
            )
            container.state = {"waiting": {"reason": reason, "message": message}}
            container.next_start = time.monotonic() + self.kubelet.backoff_base_s
            return self.kubelet.backoff_base_s
        try:
            env = self.kubelet.container_environment(self.pod, container.spec, self.address)
        except ConfigError as exc:
            container.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            container.next_start = time.monotonic() + 1.0
            return 1.0
        container.container_id = f"conch://{secrets.token_hex(32)}"
        started_at = _now()
        if self.kubelet.fake_containers:
            container.process = _NoProcess()
        else:
            argv = self.kubelet.container_argv(container.spec, env, self.address)
            container.log_dir.mkdir(parents=True, exist_ok=True)
            try:
                if TENSORRT_IMAGE.fullmatch(image):
                    env = {**env, "PATH": f"{self.kubelet.standin_bin()}:{os.environ.get('PATH', '')}"}
                container.process = self.kubelet.spawn(argv, env, container.log_path(), container.log_dir)
            except OSError as exc:
                container.log_path().write_text(f"{exc}\n")
                container.process = _ExitedProcess(128)
        container.state = {"running": {"startedAt": started_at}}
        container.started_at = time.monotonic()
        container.started = container.ready = False
        for probe in container.probes:
            probe.reset(container.started_at)
        if not any(probe.kind == "startup" for probe in container.probes):
            container.started = True
        if not any(probe.kind == "readiness" for probe in container.probes):
            container.ready = container.started
        if self.kubelet.fake_containers:  # nothing runs that could be probed: started and ready at once
            container.started = container.ready = True
        return 0.0

    def _probe(self, container: Container, now: float) -> float:
        due = [probe for probe in container.probes if probe.due <= now]
        for probe in due:
            probe.due = now + probe.period
            if probe.kind != "startup" and not container.started:
                continue
            if probe.kind == "startup" and container.started:
                continue
            passed = probe.run(self.address, self.ports)
            if probe.kind == "startup" and probe.succeeded:
                container.started = True
                if not any(p.kind == "readiness" for p in container.probes):
                    container.ready = True
                for other in container.probes:  # readiness and liveness start right after start-up succeeded
                    if other.kind != "startup":
                        other.due = now
                return 0.0
            if probe.kind == "readiness" and (probe.succeeded if passed else probe.failed):
                container.ready = passed
            if probe.kind in ("startup", "liveness") and probe.failed:
                logger.info("kubelet.probe.failed %s %s %s", self.pod_name, container.name, probe.kind)
                self._kill(container, float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)))
                return 0.0
        next_due = min((probe.due for probe in container.probes), default=now + 1.0)
        # Exits are noticed by polling: a short wait while a real process runs.
        return min(max(0.0, next_due - now), 0.25)

    def _exited(self, container: Container, code: int) -> None:
        finished = _now()
        tail = _tail(container.log_path()) if code != 0 else ""
        terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": container.state.get("running", {}).get("startedAt", finished),
            "finishedAt": finished,
            "containerID": container.container_id,
        }
        if tail:
            terminated["message"] = tail
        container.process = None
        container.ready = container.started = False
        restart_policy = self.pod["spec"].get("restartPolicy", "Always")
        if restart_policy == "Never" or (restart_policy == "OnFailure" and code == 0):
            container.state = {"terminated": terminated}
            return
        if time.monotonic() - container.started_at > 2 * BACKOFF_CAP_S:
            container.backoff_s = 0.0  # a container that ran long enough starts its back-off afresh
        container.last_state = {"terminated": terminated}
        container.restart_count += 1
        if container.backoff_s == 0.0:
            # Like the kubelet: the first restart is immediate, the back-off starts with the second.
            container.backoff_s = self.kubelet.backoff_base_s
            container.next_start = time.monotonic()
            container.state = {"waiting": {"reason": "ContainerCreating"}}
            return
        delay = container.backoff_s
        container.backoff_s = min(container.backoff_s * 2, BACKOFF_CAP_S * self.kubelet.backoff_base_s / 10)
        container.next_start = time.monotonic() + delay
        container.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={container.name} "
                f"pod={self.pod_name}_{self.namespace}({self.uid})",
            }
        }

    def _kill(self, container: Container, grace_s: float) -> None:
        process = container.process
        if process is None:
            return
        if process.poll() is None:
            self.kubelet.terminate(process, grace_s)
        self._exited(container, process.wait())

    def _stop_containers(self, grace_s: float) -> None:
        for container in self.containers:
            process = container.process
            if process is not None:
                if process.poll() is None:
                    self.kubelet.terminate(process, grace_s)
                code = process.wait()
                container.process = None
                container.ready = container.started = False
                container.state = {
                    "terminated": {
                        "exitCode": code if code >= 0 else 128 - code,
                        "reason": "Completed" if code == 0 else "Error",
                        "finishedAt": _now(),
                        "containerID": container.container_id,
                    }
                }

    # -- status ----------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The pod's `status` as a kubelet reports it (Kubernetes "Pod Lifecycle": phase, conditions, states)."""
        statuses = [container.status() for container in self.containers]
        ever_ran = any(c.restart_count or "waiting" not in c.state for c in self.containers)
        terminated = [c.state.get("terminated") for c in self.containers]
        if all(terminated) and self.containers and self.terminating is None:
            phase = "Succeeded" if all(t["exitCode"] == 0 for t in terminated) else "Failed"
        else:
            phase = "Running" if ever_ran else "Pending"
        all_ready = bool(self.containers) and all(c.ready for c in self.containers)
        unready = [c.name for c in self.containers if not c.ready]

        def condition(kind: str, true: bool) -> dict[str, Any]:
            item: dict[str, Any] = {"type": kind, "status": "True" if true else "False", "lastProbeTime": None}
            if not true:
                item["reason"] = "ContainersNotReady"
                item["message"] = f"containers with unready status: [{' '.join(unready)}]"
            return item

        return {
            "phase": phase,
            "hostIP": self.kubelet.host_ip,
            "podIP": self.address,
            "podIPs": [{"ip": self.address}],
            "startTime": self.start_time,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": None},
                condition("Ready", all_ready),
                condition("ContainersReady", all_ready),
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None},
            ],
            "containerStatuses": statuses,
        }

    def _report(self) -> None:
        status = self.status()
        if status == self.reported:
            return
        # lastTransitionTime changes only with the condition's status, as on a real node.
        previous = {c["type"]: c for c in (self.reported or {}).get("conditions", [])}
        for item in status["conditions"]:
            earlier = previous.get(item["type"])
            same = earlier is not None and earlier["status"] == item["status"]
            item["lastTransitionTime"] = earlier["lastTransitionTime"] if same else _now()
        self.reported = status if self.kubelet.patch_status(self.namespace, self.pod_name, status) else None


class _NoProcess:
    """The process of a fake container: runs until stopped."""

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = 0
        return 0


class _ExitedProcess(_NoProcess):
    """A container whose command could not be run at all."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.returncode = code

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return ""
    return "\n".join(lines)[-TERMINATION_MESSAGE_BYTES:]


# --------------------------------------------------------------------------------------------------------------
# The kubelet


class Kubelet:
    """Watches the pods bound to `node_names` and runs them (see the module docstring).

    `api_client_factory` returns a new `kubernetes.client.ApiClient` for the cluster. `certificate` is the
    (cert, key) pair its log endpoint serves. `backoff_base_s` (default: env `CONCH_KUBELET_BACKOFF_S`, else 10)
    is the first crash-loop delay; `probe_scale` (default: env `CONCH_KUBELET_PROBE_SCALE`, else 1) multiplies
    every probe period, so tests need not wait ten seconds for a startup probe.
    """

    def __init__(
        self,
        *,
        api_client_factory: Callable[[], Any],
        node_names: list[str],
        state_dir: Path,
        certificate: tuple[Path, Path],
        fake_containers: bool = False,
        backoff_base_s: float | None = None,
        probe_scale: float | None = None,
        host_ip: str = "127.0.0.1",
    ) -> None:
        from kubernetes import client

        self.api_client = api_client_factory()
        self.core = client.CoreV1Api(self.api_client)
        self.node_names = set(node_names)
        self.state_dir = Path(state_dir)
        self.fake_containers = fake_containers or os.environ.get("CONCH_KUBELET_FAKE_CONTAINERS") == "1"
        self.backoff_base_s = (
            backoff_base_s if backoff_base_s is not None else float(os.environ.get("CONCH_KUBELET_BACKOFF_S", "10"))
        )
        self.probe_scale = (
            probe_scale if probe_scale is not None else float(os.environ.get("CONCH_KUBELET_PROBE_SCALE", "1"))
        )
        self.host_ip = host_ip
        self._certificate = certificate
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self._next_address = 0
        self._block = 10 + secrets.randbelow(240)
        self._stopping = threading.Event()
        self._watch: Any = None
        self._threads: list[threading.Thread] = []
        self._server: http.server.ThreadingHTTPServer | None = None
        self._triton: tuple[Path, dict[str, str], Path] | None = None
        self.port = 0

    # -- life cycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve container logs, then watch pods (returns at once; the watch runs in a thread)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._server = _log_server(self, *self._certificate)
        self.port = self._server.server_address[1]
        for target, name in ((self._server.serve_forever, "kubelet-logs"), (self._watch_pods, "kubelet-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop watching, stop every container (waiting for each), stop serving logs."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(60)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(10)
        self.api_client.close()

    def running_processes(self) -> list[int]:
        """Pids of the container processes running now."""
        with self._lock:
            workers = list(self._workers.values())
        return [
            c.process.pid
            for w in workers
            for c in w.containers
            if isinstance(c.process, subprocess.Popen) and c.process.poll() is None
        ]

    # -- watching --------------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        from kubernetes import watch

        while not self._stopping.is_set():
            try:
                listing = self._get_json(self.core.list_pod_for_all_namespaces)
                for pod in listing["items"]:
                    self._handle(pod)
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                    deserialize=False,
                ):
                    if self._stopping.is_set():
                        break
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._handle(event["object"])
                    elif event["type"] == "DELETED":
                        self._deleted(event["object"])
            except Exception as exc:  # the API server stopped, restarted or expired our resourceVersion
                if not self._stopping.is_set():
                    logger.debug("kubelet.watch.retry %s", exc)
                    self._stopping.wait(0.5)

    def _handle(self, pod: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") not in self.node_names:
            return
        metadata = pod["metadata"]
        with self._lock:
            worker = self._workers.get(metadata["uid"])
            if worker is None and not self._stopping.is_set():
                if metadata.get("deletionTimestamp") is not None:
                    self.delete_pod(metadata["namespace"], metadata["name"], metadata["uid"])
                    return
                if pod["status"].get("phase") in ("Succeeded", "Failed"):
                    return
                worker = PodWorker(self, pod, self._allocate_address())
                self._workers[metadata["uid"]] = worker
                worker.start()
        if worker is not None and metadata.get("deletionTimestamp") is not None:
            worker.request_deletion(float(metadata.get("deletionGracePeriodSeconds") or 0))

    def _deleted(self, pod: dict[str, Any]) -> None:
        with self._lock:
            worker = self._workers.get(pod["metadata"]["uid"])
        if worker is not None:  # deleted at once (grace period 0 by someone else): the containers go too
            worker.request_deletion(0)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)

    def _allocate_address(self) -> str:
        # 127.B.0.1, 127.B.0.2, ... 127.B.0.254, 127.B.1.1, ... in a block B picked at random per kubelet, so two
        # test clusters on one machine do not hand out the same address; never 127.0.0.1, never reused in one run,
        # and an address where something already listens on Triton's HTTP port is skipped.
        while True:
            index = self._next_address
            self._next_address += 1
            address = f"127.{self._block}.{index // 254 % 256}.{index % 254 + 1}"
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind((address, 8000))
                except OSError:
                    continue
            return address

    # -- API calls -------------------------------------------------------------------------------------------

    def _get_json(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        response = method(*args, _preload_content=False, _request_timeout=10, **kwargs)
        return json.loads(response.data)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        """Patch `pods/status` (strategic merge: conditions merge by type); False when the call failed."""
        try:
            self.core.patch_namespaced_pod_status(
                name,
                namespace,
                {"status": status},
                _content_type="application/strategic-merge-patch+json",
                _preload_content=False,
                _request_timeout=10,
            )
            return True
        except Exception as exc:
            logger.debug("kubelet.status.failed %s/%s %s", namespace, name, exc)
            return False

    def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod object at once (its containers are gone); True when it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                grace_period_seconds=0,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                _preload_content=False,
                _request_timeout=10,
            )
            return True
        except ApiException as exc:
            return exc.status in (404, 409)  # gone already, or the name now belongs to a new pod
        except Exception:
            return False

    def _read(self, kind: str, namespace: str, name: str, optional: bool) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        method = self.core.read_namespaced_secret if kind == "secret" else self.core.read_namespaced_config_map
        try:
            obj = self._get_json(method, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{kind} "{name}" not found') from None
            raise ConfigError(f'cannot read {kind} "{name}": {exc.reason}') from None
        except Exception as exc:
            raise ConfigError(f'cannot read {kind} "{name}": {exc}') from None
        if kind == "secret":
            return {key: base64.b64decode(value).decode() for key, value in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    def container_environment(self, pod: dict[str, Any], spec: dict[str, Any], address: str) -> dict[str, str]:
        """The container's variables: `envFrom` first, then `env` in order (Kubernetes "Define Environment
        Variables for a Container"). Raises ConfigError for a missing Secret, ConfigMap or key."""
        namespace = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            kind, ref = (
                ("secret", source["secretRef"]) if source.get("secretRef") else ("configmap", source["configMapRef"])
            )
            values = self._read(kind, namespace, ref["name"], bool(ref.get("optional")))
            env.update({source.get("prefix", "") + key: value for key, value in (values or {}).items()})
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": namespace,
            "metadata.uid": pod["metadata"]["uid"],
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": address,
            "status.hostIP": self.host_ip,
        }
        for item in spec.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = expand(item.get("value", ""), env)
            elif "fieldRef" in source:
                env[item["name"]] = fields.get(source["fieldRef"]["fieldPath"], "")
            else:
                kind, ref = (
                    ("secret", source["secretKeyRef"])
                    if "secretKeyRef" in source
                    else ("configmap", source["configMapKeyRef"])
                )
                values = self._read(kind, namespace, ref["name"], bool(ref.get("optional")))
                if values is None:
                    continue
                if ref["key"] not in values:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(
                        f"couldn't find key {ref['key']} in {kind.capitalize()} {namespace}/{ref['name']}"
                    )
                env[item["name"]] = values[ref["key"]]
        return env

    # -- processes -------------------------------------------------------------------------------------------

    def container_argv(self, spec: dict[str, Any], env: dict[str, str], address: str) -> list[str]:
        """Command and args with `$(VAR)` expanded; Triton mapped to the local binary and bound to `address`."""
        argv = [expand(part, env) for part in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        if not argv:
            argv = ["tritonserver"]
        if argv[0] not in TRITON_COMMANDS:
            return argv
        binary, _, backends = self._triton_installation()
        flags = [arg for arg in argv[1:] if not arg.startswith(_OWN_FLAGS)]
        return [
            str(binary),
            *flags,
            f"--http-address={address}",
            f"--grpc-address={address}",
            f"--metrics-address={address}",
            f"--backend-directory={backends}",
            "--allow-gpu-metrics=false",
        ]

    def _triton_installation(self) -> tuple[Path, dict[str, str], Path]:
        if self._triton is None:
            from tritonserving.server import ensure_backend_directory, locate_installation, server_environment

            installation = locate_installation()
            backends = ensure_backend_directory(self.state_dir / "backends", installation=installation)
            (backends / "tensorrt").mkdir(exist_ok=True)
            shutil.copyfile(STANDINS / "tensorrt_backend" / "model.py", backends / "tensorrt" / "model.py")
            self._triton = (installation.binary, server_environment(installation), backends)
        return self._triton

    def standin_bin(self) -> Path:
        """A folder with `python3` (this Python) and the stand-in `trtexec`, first on a TensorRT container's PATH."""
        folder = self.state_dir / "standin-bin"
        if not (folder / "trtexec").exists():
            folder.mkdir(parents=True, exist_ok=True)
            root = STANDINS.parent.parent.parent
            for name, body in (
                ("python3", f'exec "{sys.executable}" "$@"\n'),
                ("trtexec", f'PYTHONPATH="{root}" exec "{sys.executable}" -m devtools.cluster.standins.trtexec "$@"\n'),
            ):
                path = folder / f".{name}"
                path.write_text(f"#!/bin/sh\n{body}")
                path.chmod(0o755)
                path.replace(folder / name)
        return folder

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
        """Start a container process in its own process group, output appended to `log_path`."""
        # The image's environment (PATH, LD_LIBRARY_PATH for Triton's libraries, HOME...) under the pod's own.
        base = dict(self._triton_installation()[1])
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**base, **env},
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent,
                close_fds=True,
            )
        pid_dir = self.state_dir.parent / "pids" / "containers"
        pid_dir.mkdir(parents=True, exist_ok=True)
        record_process(pid_dir / f"{process.pid}.json", process.pid)
        return process

    def terminate(self, process: Any, grace_s: float) -> None:
        """SIGTERM the process group, wait up to `grace_s` seconds, then SIGKILL (a container's stop)."""
        if not isinstance(process, subprocess.Popen):
            process.wait()
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(max(grace_s, 0.1))
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait(10)
        # The group may hold Triton's backend stubs still: they go with their server.
        _signal_group(process.pid, signal.SIGKILL)
        (self.state_dir.parent / "pids" / "containers" / f"{process.pid}.json").unlink(missing_ok=True)

    # -- logs ------------------------------------------------------------------------------------------------

    def container_log(self, namespace: str, pod: str, container: str, *, previous: bool) -> Path | None:
        """The log file of a container's current (or previous) run; None when there is none."""
        with self._lock:
            workers = [w for w in self._workers.values() if (w.namespace, w.pod_name) == (namespace, pod)]
        for worker in workers:
            for item in worker.containers:
                if item.name == container:
                    if previous:
                        return item.log_path(item.restart_count - 1) if item.restart_count else None
                    return item.log_path()
        return None


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _log_server(kubelet: Kubelet, cert: Path, key: Path) -> http.server.ThreadingHTTPServer:
    """The kubelet's HTTPS endpoint the API server proxies `pods/log` to: `/containerLogs/{ns}/{pod}/{container}`
    with `tailLines`, `limitBytes` and `previous` (Kubernetes kubelet API, as `kubectl logs` reaches it)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            query = {name: values[-1] for name, values in parse_qs(url.query).items()}
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._answer(404, f"no handler for {url.path}")
                return
            previous = query.get("previous") == "true"
            path = kubelet.container_log(parts[1], parts[2], parts[3], previous=previous)
            if path is None:
                what = "previous terminated container" if previous else "container"
                self._answer(400, f'{what} "{parts[3]}" in pod "{parts[2]}" not found')
                return
            try:
                text = path.read_bytes()
            except OSError:
                text = b""
            if "tailLines" in query:
                lines = text.splitlines(keepends=True)
                text = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
            if "limitBytes" in query:
                text = text[: int(query["limitBytes"])]
            self._answer(200, text)

        def _answer(self, code: int, body: str | bytes) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            logger.debug("kubelet.http " + format, *args)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server

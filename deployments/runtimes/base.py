"""The Runtime seam (interface and data): what every place that runs Triton for a deployment offers.

A runtime turns a desired `DeploymentSpec` into a running Triton that serves the model, reports what it sees as
an `Observation`, lists the workloads it owns, deletes them, and tells where to reach them. What a runtime must
remember between calls (a pid and ports, or Kubernetes object names) is its *state*: a JSON-serializable dict that
the deployments app stores on `Deployment.runtime_state` without looking inside, so a new runtime adds no columns.

Reconcile (`deployments.services.reconcile_deployments`) is generic: observe, compare with the desired state,
apply or delete. Nothing here touches the database.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeploymentSpec",
    "Endpoints",
    "Observation",
    "OwnedWorkload",
    "Phase",
    "Runtime",
    "RuntimeState",
    "Server",
]

#: A runtime's own record of a deployment's workload (JSON-serializable); `{}` before the first apply.
RuntimeState = dict[str, Any]


class Phase(enum.StrEnum):
    """What a runtime sees of a deployment's workload."""

    #: Nothing runs for it (never applied, deleted, or the process/pods are gone).
    ABSENT = "absent"
    #: Waiting for resources: not placed yet (e.g. no node has the GPUs it asks for); the message says what.
    PENDING = "pending"
    #: The server is coming up, or up while the model is not (yet) ready.
    STARTING = "starting"
    #: The server answers and the model is ready (`GET /v2/models/<name>/ready` is 200).
    READY = "ready"
    #: Some servers serve, fewer than desired (others are pending, starting or crashing: the message says why).
    DEGRADED = "degraded"
    #: It cannot serve and waiting will not help without a new apply (the message says why).
    FAILED = "failed"
    #: The runtime could not tell (a check timed out): look again later, change nothing.
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeploymentSpec:
    """What should run: one model served by one Triton.

    `repository` is the model repository Triton reads (a folder or an `s3://` URL) pinned by the deployment;
    `environment` the variables Triton needs to read it (S3 credentials); `config_json` the effective model
    configuration sent with the repository load request (Triton "Model Repository Extension" -> "Load").
    """

    deployment_id: int
    model_name: str
    repository: str
    config_json: str
    instance_count: int = 1
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Who and what, for names and labels: the team's slug and the deployment's name.
    team: str = ""
    name: str = ""
    #: Kubernetes only: the registered cluster, pods (`replicas`, or `autoscaling` {"min_replicas",
    #: "max_replicas", "target_queue_time_us" | "target_cpu_percent"}), GPUs per pod ({"count", "product"} or
    #: {"mig_profile"}), CPU and memory requests per pod (Kubernetes quantities; "" = the runtime's defaults).
    cluster: str = ""
    replicas: int = 1
    autoscaling: Mapping[str, Any] | None = None
    gpu: Mapping[str, Any] | None = None
    cpu: str = ""
    memory: str = ""
    #: Custom backends the model needs (a team's registered backend its build used): name -> where its files lie in
    #: the object store (`CustomBackend.files_prefix`); the runtime puts each in the server's backend directory.
    backends: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """A runtime's view of a deployment: `phase`, and a `message` a user can act on when it is not ready.

    `permanent` marks a failure that retrying cannot fix (Triton refused the model's configuration or the model
    refused to load): reconcile stops restarting it and says so.
    """

    phase: Phase
    message: str = ""
    permanent: bool = False
    #: Runtimes with several servers (Kubernetes pods): how many are wanted and ready, and each one's state as
    #: `{"name", "node", "phase", "ready", "restarts", "message"}`; None/() when the runtime has one server.
    replicas: tuple[int, int] | None = None
    pods: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Endpoints:
    """Where clients reach a deployment's Triton: KServe v2 HTTP base URL, gRPC `host:port`, metrics URL."""

    http: str = ""
    grpc: str = ""
    metrics: str = ""


@dataclass(frozen=True)
class OwnedWorkload:
    """A workload a runtime finds running that belongs to this Conch installation: `key` names it
    (a server id, an object name), `deployment_id` the deployment it says it serves (None when unknown)."""

    key: str
    deployment_id: int | None
    state: RuntimeState


@dataclass(frozen=True)
class Server:
    """One Triton serving a deployment, as Conch's own processes reach it.

    `name` names it for people (a pod name, or the local server id); `http_url` is its KServe v2 HTTP base URL
    and `metrics_url` its Prometheus `/metrics` URL (both "" when it has none); `api_key` is the key of its
    restricted endpoints (model load/unload, configuration, statistics: Triton "Limit Endpoint Access"), sent in
    the `X-Conch-Key` header (gRPC: the `triton-grpc-protocol-x-conch-key` metadata); `grpc_target` its KServe v2
    gRPC `host:port` ("" when it has none).
    """

    name: str
    http_url: str
    metrics_url: str
    api_key: str
    grpc_target: str = ""


class Runtime(abc.ABC):
    """One place deployments run. Implementations: `deployments.runtimes.local.LocalRuntime`.

    Every method is idempotent and safe to call from any worker; none holds a database lock. Errors: methods
    raise `conch.errors.Unavailable` for transient trouble (retry later); permanent trouble is reported as an
    `Observation` with `permanent=True`.
    """

    name: str
    #: Whether `wait_until_ready` waits for the workload (local processes); False for runtimes whose progress
    #: the periodic reconcile observes (`observe_many`) instead of a task waiting on it (Kubernetes).
    waits_for_ready: bool = True

    def observe_many(self, items: Sequence[tuple[DeploymentSpec, RuntimeState]]) -> dict[int, Observation]:
        """`observe` for many deployments at once, by deployment id; runtimes that can batch their requests (one
        list per cluster) override it."""
        return {spec.deployment_id: self.observe(spec, state) for spec, state in items}

    def forget_server(self, state: RuntimeState, server_url: str) -> None:
        """A server of `state` at `server_url` did not answer: drop what is cached about it (runtimes that route
        among several servers list them again). A no-op by default."""
        return None

    @abc.abstractmethod
    def apply(self, spec: DeploymentSpec, state: RuntimeState) -> RuntimeState:
        """Create (or adopt) the workload that serves `spec` and return the state to store; returns at once.

        A workload recorded in `state` that still runs is kept (adopted); otherwise a new one is started.
        """

    @abc.abstractmethod
    def wait_until_ready(
        self,
        spec: DeploymentSpec,
        state: RuntimeState,
        *,
        timeout_s: float,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> Observation:
        """Wait (at most `timeout_s` seconds) for the workload in `state` to serve `spec`'s model, loading the
        model when the server is up without it. Calls `heartbeat` every few seconds while it waits."""

    @abc.abstractmethod
    def observe(self, spec: DeploymentSpec, state: RuntimeState) -> Observation:
        """Look at the workload in `state` now (no waiting): absent, starting, ready or failed."""

    @abc.abstractmethod
    def delete(self, state: RuntimeState) -> None:
        """Remove the workload in `state` (a no-op when it is gone); on return its ports/resources are free."""

    @abc.abstractmethod
    def list_owned(self) -> list[OwnedWorkload]:
        """Workloads of this Conch installation that this runtime can see (for orphan clean-up)."""

    @abc.abstractmethod
    def same_workload(self, state: RuntimeState, workload: OwnedWorkload) -> bool:
        """Whether `workload` is the one recorded in `state`."""

    @abc.abstractmethod
    def manages_here(self, state: RuntimeState) -> bool:
        """Whether this process may observe, restart or delete the workload in `state` (the local runtime's
        processes belong to the worker host that started them)."""

    @abc.abstractmethod
    def log_tail(self, state: RuntimeState, lines: int) -> list[str]:
        """The last `lines` lines of Triton's log ([] when there is none)."""

    @abc.abstractmethod
    def endpoints(self, state: RuntimeState) -> Endpoints:
        """Where clients reach the workload (empty strings before it has any)."""

    @abc.abstractmethod
    def servers(self, state: RuntimeState) -> list[Server]:
        """The Tritons of the workload in `state` that are up and ready now (one for a local process, one per
        ready pod on Kubernetes); [] when none is. Raises `conch.errors.Unavailable` when the runtime cannot
        tell (its API does not answer)."""

    @abc.abstractmethod
    def internal_url(self, state: RuntimeState, port: str = "http", path: str = "") -> str:
        """URL by which Conch's own processes reach the workload's `port` ("http" or "metrics") + `path`;
        "" when it has none."""

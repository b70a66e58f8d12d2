"""The Kubernetes runtime: a deployment is a set of objects in a registered cluster's namespace (Triton pods that
read the model repository from S3 themselves), applied idempotently and observed in batches.

`apply` builds the manifests (`manifests`, pure) from the `DeploymentSpec` and the cluster's registration and
server-side applies them (`api`); objects a spec no longer wants (an HPA after switching to fixed replicas, a PDB
below two replicas) are deleted. Nothing waits: the periodic reconcile calls `observe_many`, which makes a constant
number of list calls per cluster (Deployments and Pods of this installation by label selector, Nodes only when a pod
is unschedulable) however many deployments there are, and words the result (`status`).

State kept on the deployment: `{"cluster", "namespace", "name", "deployment_id"}` (the object name is
deterministic; every object carries `conch.io/deployment` and `conch.io/installation` labels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from conch.errors import ConchError, InvalidInput, NotFound
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
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.api import ClusterAccess, ClusterApi, cluster_api
from deployments.runtimes.kubernetes.status import describe_workload
from tritonserving.access import derive_api_key

log = logging.getLogger(__name__)

__all__ = ["INSTALLATION_LABEL", "ClusterDirectory", "KubernetesRuntime", "pod_repository_location"]

#: Label naming the Conch installation that owns an object (several may share a namespace).
INSTALLATION_LABEL = "conch.io/installation"
#: Seconds the ready pods of a deployment are reused for inference routing before they are listed again.
POD_CACHE_SECONDS = 2.0
#: Kinds a deployment consists of, deleted on stop (ReplicaSets and Pods go with their Deployment as well).
OWNED_KINDS = (
    "Deployment",
    "ReplicaSet",
    "Pod",
    "Service",
    "Secret",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "PodMonitor",
    "NetworkPolicy",
)


class ClusterDirectory:
    """Where the runtime finds clusters' access data: `get(name)` and `all()` return `ClusterAccess`; the
    deployments app provides one reading its `Cluster` registrations (`deployments.runtimes.clusters`)."""

    def get(self, name: str) -> ClusterAccess:  # pragma: no cover - interface
        raise NotImplementedError

    def all(self) -> list[ClusterAccess]:  # pragma: no cover - interface
        raise NotImplementedError


def pod_repository_location(repository: str, s3_endpoint: str) -> str:
    """The `--model-repository` the pods use: `repository` (Conch's own `s3://…` location) with its endpoint
    replaced by `s3_endpoint` (the object store as seen from the pods, "http://minio.storage:9000"; "" keeps it).

    Triton "Model Repository" > "S3": `s3://bucket/path` (AWS) or `s3://http://host:port/bucket/path`. Raises
    InvalidInput (field `cluster`) when the repository is not on S3: pods cannot read a folder on Conch's disk.
    """
    if not repository.startswith("s3://"):
        raise InvalidInput(
            "The kubernetes runtime needs the model repository on S3-compatible storage (CONCH_STORAGE_URL=s3://…): "
            "pods cannot read a folder on Conch's own disk.",
            field="runtime",
        )
    if not s3_endpoint:
        return repository
    rest = repository[len("s3://") :]
    if rest.startswith(("http://", "https://")):
        scheme, _, after = rest.partition("://")
        rest = after.split("/", 1)[1] if "/" in after else ""
    endpoint = urlsplit(s3_endpoint)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    return f"s3://{endpoint.scheme}://{endpoint.hostname}:{port}/{rest}"


def _selector(**labels: str) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


class KubernetesRuntime(Runtime):
    """Deployments as Triton pods on registered Kubernetes clusters (see the module docstring)."""

    name = "kubernetes"
    waits_for_ready = False

    def __init__(self, directory: ClusterDirectory) -> None:
        self.directory = directory

    # --- helpers -----------------------------------------------------------------------------------------------

    @staticmethod
    def installation() -> str:
        return manifests.dns_label(settings.CONCH_INSTANCE_ID)

    def _api(self, cluster: str) -> ClusterApi:
        return cluster_api(self.directory.get(cluster))

    def _owned_selector(self, **extra: str) -> str:
        return _selector(**{"app.kubernetes.io/managed-by": "conch", INSTALLATION_LABEL: self.installation()}, **extra)

    def _deployment_selector(self, deployment_id: int | str) -> str:
        return self._owned_selector(**{"conch.io/deployment": str(deployment_id)})

    @staticmethod
    def conch_peers() -> manifests.PeerSelector:
        """Conch's own pods, which reach the Triton pods' http, grpc and metrics ports (settings
        `CONCH_KUBERNETES_CONCH_POD_SELECTOR`, `CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR`)."""
        return manifests.PeerSelector(
            pod_labels=settings.CONCH_KUBERNETES_CONCH_POD_SELECTOR,
            namespace_labels=settings.CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR,
        )

    @staticmethod
    def monitoring_peers() -> manifests.PeerSelector:
        """The monitoring pods, which reach the metrics port only (settings
        `CONCH_KUBERNETES_MONITORING_POD_SELECTOR`, `CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR`)."""
        return manifests.PeerSelector(
            pod_labels=settings.CONCH_KUBERNETES_MONITORING_POD_SELECTOR,
            namespace_labels=settings.CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR,
        )

    @staticmethod
    def api_key(state: RuntimeState) -> str:
        """Key of the pods' restricted endpoints, derived from SECRET_KEY and the objects' identity (never
        stored; written into the deployment's Secret by `apply`)."""
        return derive_api_key(
            settings.SECRET_KEY, f"k8s.{state.get('cluster')}.{state.get('namespace')}.{state.get('name')}"
        )

    def pod_spec(self, spec: DeploymentSpec, access: ClusterAccess) -> manifests.TritonPodSpec:
        """The manifests' input for `spec` on the cluster `access` (raises InvalidInput naming the field)."""
        gpu = None
        if spec.gpu:
            gpu = manifests.GpuRequest(
                count=spec.gpu.get("count") or 0,
                product=spec.gpu.get("product") or None,
                mig_profile=spec.gpu.get("mig_profile") or None,
            )
        # The stored bounds are `Autoscaling`'s own fields (`placement.parse_scaling` wrote them).
        scaling = manifests.Autoscaling(**spec.autoscaling) if spec.autoscaling else None
        base = manifests.TritonPodSpec(
            deployment_id=spec.deployment_id,
            team=spec.team or "team",
            name=spec.name or spec.model_name,
            model_name=spec.model_name,
            namespace=access.namespace,
            image=access.triton_image,
            repository=pod_repository_location(spec.repository, access.s3_endpoint),
            s3_secret_name="",
            replicas=spec.replicas,
            gpu=gpu,
            cpu=spec.cpu or "1",
            memory=spec.memory or "4Gi",
            image_pull_secrets=tuple(access.image_pull_secrets),
            autoscaling=scaling,
            extra_labels={INSTALLATION_LABEL: self.installation()},
        )
        if access.s3_secret_name or not access.pod_service_account:
            secret = access.s3_secret_name or f"{manifests.object_name(base)}-s3"
            return dataclasses.replace(base, s3_secret_name=secret)
        # The service account's identity reads the store: no credentials, only the region.
        region = dict(spec.environment).get("AWS_DEFAULT_REGION", "us-east-1")
        return dataclasses.replace(
            base, service_account=access.pod_service_account, environment={"AWS_DEFAULT_REGION": region}
        )

    # --- Runtime -----------------------------------------------------------------------------------------------

    def apply(self, spec: DeploymentSpec, state: RuntimeState) -> RuntimeState:
        """Server-side apply every object of the deployment (Secrets first, then the NetworkPolicy, Deployment,
        Service, HPA, PDB, PodMonitor) and delete the optional ones the spec no longer wants. Returns at once.

        Raises InvalidInput for values no cluster could run or that the API server refused (its message),
        Unavailable when the cluster cannot be reached.
        """
        if not spec.cluster:
            raise InvalidInput("A kubernetes deployment needs a cluster.", field="cluster")
        if spec.backends:
            raise InvalidInput(
                f"The model is served by the team's own backend {', '.join(sorted(spec.backends))}, which Conch puts "
                "in a server's backend directory on the local runtime only so far; deploy it with runtime local.",
                field="runtime",
            )
        access = self.directory.get(spec.cluster)
        api = cluster_api(access)
        pod = self.pod_spec(spec, access)
        name = manifests.object_name(pod)
        new_state = {
            "cluster": access.name,
            "namespace": access.namespace,
            "name": name,
            "deployment_id": spec.deployment_id,
        }
        versions = api.versions()
        wanted = [manifests.api_key_secret_manifest(pod, self.api_key(new_state))]
        if not access.s3_secret_name and not access.pod_service_account:
            environment = dict(spec.environment)
            wanted.append(
                manifests.s3_secret_manifest(
                    pod,
                    access_key_id=environment.get("AWS_ACCESS_KEY_ID", ""),
                    secret_access_key=environment.get("AWS_SECRET_ACCESS_KEY", ""),
                    region=environment.get("AWS_DEFAULT_REGION", "us-east-1"),
                )
            )
        # The policy goes first: the pods never run a moment open to the rest of the cluster.
        wanted += [
            manifests.network_policy_manifest(pod, conch=self.conch_peers(), monitoring=self.monitoring_peers()),
            manifests.deployment_manifest(pod),
            manifests.service_manifest(pod),
        ]
        hpa = manifests.hpa_manifest(pod, api_version=versions.autoscaling)
        pdb = manifests.pdb_manifest(pod, api_version=versions.policy)
        monitor = manifests.pod_monitor_manifest(pod) if versions.pod_monitor else None
        wanted += [manifest for manifest in (hpa, pdb, monitor) if manifest is not None]
        for manifest in wanted:
            api.apply(manifest)
        for kind, optional in (("HorizontalPodAutoscaler", hpa), ("PodDisruptionBudget", pdb)):
            if optional is None:
                api.delete(kind, name)
        return new_state

    def wait_until_ready(
        self,
        spec: DeploymentSpec,
        state: RuntimeState,
        *,
        timeout_s: float,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> Observation:
        """Does not wait (reconcile observes instead): the observation now."""
        return self.observe(spec, state)

    def observe(self, spec: DeploymentSpec, state: RuntimeState) -> Observation:
        """The deployment's phase and message now (3 requests at most); UNKNOWN when the cluster does not answer."""
        return self.observe_many([(spec, state)]).get(spec.deployment_id, Observation(Phase.UNKNOWN))

    def observe_many(self, items: Sequence[tuple[DeploymentSpec, RuntimeState]]) -> dict[int, Observation]:
        """Observations of many deployments, by deployment id, with two list requests per cluster (plus Nodes
        when a pod is unschedulable). A cluster that does not answer gives UNKNOWN for its deployments."""
        by_cluster: dict[str, list[tuple[DeploymentSpec, RuntimeState]]] = {}
        for spec, state in items:
            by_cluster.setdefault(state.get("cluster") or spec.cluster, []).append((spec, state))
        found: dict[int, Observation] = {}
        for cluster, group in by_cluster.items():
            try:
                api = self._api(cluster)
                selector = self._owned_selector()
                deployments = {obj["metadata"]["name"]: obj for obj in api.list("Deployment", selector=selector)}
                pods: dict[str, list[dict]] = {}
                for pod in api.list("Pod", selector=selector):
                    key = (pod["metadata"].get("labels") or {}).get("conch.io/deployment", "")
                    pods.setdefault(key, []).append(pod)
                nodes: list[dict] = []
                if any(_unschedulable(pod) for pod_list in pods.values() for pod in pod_list):
                    nodes = api.nodes()
            except ConchError as exc:
                for spec, _state in group:
                    found[spec.deployment_id] = Observation(Phase.UNKNOWN, f"Cluster {cluster!r}: {exc.detail}")
                continue
            for spec, state in group:
                if not state.get("name"):
                    found[spec.deployment_id] = Observation(Phase.ABSENT, "Nothing has been applied yet.")
                    continue
                found[spec.deployment_id] = describe_workload(
                    deployments.get(state["name"]), pods.get(str(spec.deployment_id), []), nodes
                )
                self._remember_pods(state, pods.get(str(spec.deployment_id), []))
        return found

    def delete(self, state: RuntimeState) -> None:
        """Delete every object labelled with the deployment (all of `OWNED_KINDS`); Pods terminate gracefully.
        A no-op for a state that names no cluster. Raises Unavailable when the cluster does not answer."""
        if not state.get("cluster") or state.get("deployment_id") is None:
            return
        try:
            api = self._api(state["cluster"])
        except NotFound:
            log.warning("kubernetes.cluster_gone", extra={"cluster": state["cluster"]})
            return  # the cluster was unregistered: nothing Conch can reach is left to delete
        selector = self._deployment_selector(state["deployment_id"])
        for kind in OWNED_KINDS:
            if kind == "Service":  # Services have no delete-collection before Kubernetes 1.31
                for service in api.list("Service", selector=selector):
                    api.delete("Service", service["metadata"]["name"])
            elif kind == "Pod":
                continue  # the garbage collector removes them with their ReplicaSets, letting Triton drain
            else:
                api.delete_collection(kind, selector=selector)
        self._forget(state)

    def leftovers(self, state: RuntimeState) -> dict[str, list[str]]:
        """Names of objects still labelled with the deployment, by kind (after `delete`: empty once the garbage
        collector and the kubelet are done)."""
        api = self._api(state["cluster"])
        selector = self._deployment_selector(state["deployment_id"])
        left = {kind: [obj["metadata"]["name"] for obj in api.list(kind, selector=selector)] for kind in OWNED_KINDS}
        return {kind: names for kind, names in left.items() if names}

    def list_owned(self) -> list[OwnedWorkload]:
        """Deployments of this installation on every registered cluster (one list request per cluster); a
        cluster that does not answer is skipped."""
        owned = []
        for access in self.directory.all():
            try:
                found = cluster_api(access).list("Deployment", selector=self._owned_selector())
            except ConchError:
                continue
            for obj in found:
                label = (obj["metadata"].get("labels") or {}).get("conch.io/deployment", "")
                owned.append(
                    OwnedWorkload(
                        key=f"{access.name}/{obj['metadata']['name']}",
                        deployment_id=int(label) if label.isdigit() else None,
                        state={
                            "cluster": access.name,
                            "namespace": access.namespace,
                            "name": obj["metadata"]["name"],
                            "deployment_id": int(label) if label.isdigit() else label,
                        },
                    )
                )
        return owned

    def same_workload(self, state: RuntimeState, workload: OwnedWorkload) -> bool:
        return state.get("cluster") == workload.state.get("cluster") and state.get("name") == workload.state.get("name")

    def manages_here(self, state: RuntimeState) -> bool:
        """Every worker can reach a cluster's API: any of them manages Kubernetes deployments."""
        return True

    def log_tail(self, state: RuntimeState, lines: int) -> list[str]:
        """The log of the pod in most trouble (the previous run of a crashing one), or of the first pod."""
        if not state.get("cluster"):
            return []
        try:
            api = self._api(state["cluster"])
            pods = api.list("Pod", selector=self._deployment_selector(state["deployment_id"]))
        except ConchError:
            return []
        if not pods:
            return []
        pods.sort(key=lambda pod: (-_restarts(pod), pod["metadata"]["name"]))
        pod = pods[0]
        tail = api.pod_log(
            pod["metadata"]["name"], container="tritonserver", tail_lines=lines, previous=_restarts(pod) > 0
        )
        if not tail and _restarts(pod) > 0:
            tail = api.pod_log(pod["metadata"]["name"], container="tritonserver", tail_lines=lines)
        return [f"[{pod['metadata']['name']}] {line}" for line in tail] if tail else []

    def endpoints(self, state: RuntimeState) -> Endpoints:
        """The Service's cluster-internal addresses (reachable from inside the cluster; outside, use Conch's
        inference endpoint)."""
        if not state.get("name"):
            return Endpoints()
        host = f"{state['name']}.{state['namespace']}.svc"
        return Endpoints(
            http=f"http://{host}:{manifests.HTTP_PORT}",
            grpc=f"{host}:{manifests.GRPC_PORT}",
            metrics=f"http://{host}:{manifests.METRICS_PORT}/metrics",
        )

    def servers(self, state: RuntimeState) -> list[Server]:
        """One `Server` per ready pod (by pod IP), listed now. Raises Unavailable when the cluster does not
        answer."""
        if not state.get("name"):
            return []
        pods = self._api(state["cluster"]).list("Pod", selector=self._deployment_selector(state["deployment_id"]))
        self._remember_pods(state, pods)
        return self._servers_of(state, pods)

    def internal_url(self, state: RuntimeState, port: str = "http", path: str = "") -> str:
        """A ready pod's URL, taking the ready pods in turn (round-robin; pods listed at most every
        `POD_CACHE_SECONDS`); "" when none is ready or the cluster does not answer."""
        servers = self._cached_servers(state)
        if not servers:
            return ""
        server = servers[next(_round_robin) % len(servers)]
        if port == "metrics":
            return server.metrics_url.removesuffix("/metrics") + path
        return server.http_url + path

    # --- ready pods, cached for routing ------------------------------------------------------------------------

    def _servers_of(self, state: RuntimeState, pods: Iterable[Mapping[str, Any]]) -> list[Server]:
        key = self.api_key(state)
        servers = []
        for pod in sorted(pods, key=lambda pod: pod["metadata"]["name"]):
            status = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            if not ready or not status.get("podIP") or pod["metadata"].get("deletionTimestamp"):
                continue
            ip = status["podIP"]
            host = f"[{ip}]" if ":" in ip else ip
            servers.append(
                Server(
                    name=pod["metadata"]["name"],
                    http_url=f"http://{host}:{manifests.HTTP_PORT}",
                    metrics_url=f"http://{host}:{manifests.METRICS_PORT}/metrics",
                    api_key=key,
                    grpc_target=f"{host}:{manifests.GRPC_PORT}",
                )
            )
        return servers

    def _remember_pods(self, state: RuntimeState, pods: Sequence[Mapping[str, Any]]) -> None:
        with _cache_lock:
            _pod_cache[_cache_key(state)] = (time.monotonic(), self._servers_of(state, pods))

    def _forget(self, state: RuntimeState) -> None:
        with _cache_lock:
            _pod_cache.pop(_cache_key(state), None)

    def forget_server(self, state: RuntimeState, server_url: str) -> None:
        """Drop the cached pods of `state` (a pod did not answer): the next call lists them again."""
        self._forget(state)

    def _cached_servers(self, state: RuntimeState) -> list[Server]:
        if not state.get("name"):
            return []
        with _cache_lock:
            cached = _pod_cache.get(_cache_key(state))
        if cached is not None and time.monotonic() - cached[0] < POD_CACHE_SECONDS:
            return cached[1]
        try:
            return self.servers(state)
        except ConchError:
            return cached[1] if cached is not None else []


_round_robin = itertools.count()
_pod_cache: dict[str, tuple[float, list[Server]]] = {}
_cache_lock = threading.Lock()


def _cache_key(state: RuntimeState) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(status.get("restartCount") or 0) for status in statuses)


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )

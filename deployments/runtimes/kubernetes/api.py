"""The Kubernetes API adapter: the one module that talks to a cluster's API server (official `kubernetes` client).

It returns plain dicts (the objects as the API server wrote them, JSON-decoded) and raises Conch's own errors:
`Unavailable` when the API server cannot be reached or keeps answering 409/429/5xx after the retries, and
`ClusterRefused` (HTTP 400 for the caller) carrying the API server's own message for any other 4xx.

Objects are applied with server-side apply (Kubernetes "Server-Side Apply": `PATCH` with
`application/apply-patch+yaml`, a field manager, `force=true` because Conch owns every field it writes), so applying
the same manifest twice changes nothing and a field another manager set is taken over instead of failing.
API versions of the kinds that moved (HorizontalPodAutoscaler, PodDisruptionBudget) and whether the PodMonitor CRD
exists come from the server's discovery (`/apis`), cached per client.

Every request is counted (`ClusterApi.calls`), so reconcile and the benchmark can show that a tick makes a constant
number of calls per cluster.
"""

from __future__ import annotations

import builtins
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from conch.errors import ConchError, InvalidInput, Unavailable

log = logging.getLogger(__name__)

__all__ = [
    "FIELD_MANAGER",
    "ApiVersions",
    "ClusterAccess",
    "ClusterApi",
    "ClusterRefused",
    "KINDS",
    "cluster_api",
]

#: Field manager of every server-side apply Conch makes.
FIELD_MANAGER = "conch"
#: Seconds to wait before retry 1, 2, 3 of a request the server answered with 409, 429 or 5xx.
RETRY_BACKOFF_S = (0.2, 0.5, 1.0)
#: Connect and read timeouts of one request (seconds).
REQUEST_TIMEOUT_S = (5.0, 30.0)
#: How long discovery results are reused (seconds).
DISCOVERY_TTL_S = 300.0


class ClusterRefused(InvalidInput):
    """The API server refused a request (a 4xx other than 409/429); `detail` carries its message."""


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach one registered cluster and what Conch's pods there need (plain data, no secrets shown).

    `kubeconfig` is the decrypted kubeconfig as a dict (None with `in_cluster`: the service account of the pod
    Conch runs in); `context` picks one of its contexts ("" = its current-context). `triton_image`,
    `image_pull_secrets`, `s3_endpoint` (the object store as the pods see it, "" = Conch's own) and
    `s3_secret_name` ("" = Conch writes a Secret per deployment) shape the pods.
    """

    name: str
    namespace: str
    kubeconfig: Mapping[str, Any] | None = None
    context: str = ""
    in_cluster: bool = False
    triton_image: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    s3_endpoint: str = ""
    s3_secret_name: str = ""
    pod_service_account: str = ""
    fingerprint: str = field(default="", compare=False)


@dataclass(frozen=True)
class ApiVersions:
    """What the server offers: the newest `autoscaling` group version with the `metrics` form of the
    HorizontalPodAutoscaler (`autoscaling/v2`, else `autoscaling/v2beta2`), the newest `policy` group version with
    PodDisruptionBudget (`policy/v1`, else `policy/v1beta1`), and whether `monitoring.coreos.com/v1` (the
    Prometheus operator's PodMonitor) is served."""

    autoscaling: str
    policy: str
    pod_monitor: bool


@dataclass(frozen=True)
class _Kind:
    group_version: str  # "v1", "apps/v1"; "" = chosen by discovery
    plural: str


#: Kinds Conch creates or reads, by `kind`.
KINDS: dict[str, _Kind] = {
    "Deployment": _Kind("apps/v1", "deployments"),
    "ReplicaSet": _Kind("apps/v1", "replicasets"),
    "Pod": _Kind("v1", "pods"),
    "Service": _Kind("v1", "services"),
    "Secret": _Kind("v1", "secrets"),
    "Event": _Kind("v1", "events"),
    "Job": _Kind("batch/v1", "jobs"),
    "HorizontalPodAutoscaler": _Kind("", "horizontalpodautoscalers"),
    "PodDisruptionBudget": _Kind("", "poddisruptionbudgets"),
    "PodMonitor": _Kind("monitoring.coreos.com/v1", "podmonitors"),
    "NetworkPolicy": _Kind("networking.k8s.io/v1", "networkpolicies"),
}


def _base(group_version: str) -> str:
    return f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or f"HTTP {exc.status}")


class ClusterApi:
    """Requests to one cluster's API server (see the module docstring). Thread-safe; one per cluster and process
    (`cluster_api`), so connections and discovery are reused."""

    def __init__(self, access: ClusterAccess) -> None:
        self.access = access
        self.namespace = access.namespace
        self.calls = 0
        self._lock = threading.Lock()
        self._versions: tuple[float, ApiVersions] | None = None
        configuration = k8s_client.Configuration()
        try:
            if access.in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                loader = k8s_config.kube_config.KubeConfigLoader(
                    config_dict=dict(access.kubeconfig or {}), active_context=access.context or None
                )
                loader.load_and_set(configuration)
        except k8s_config.ConfigException as exc:
            raise InvalidInput(
                f"Cluster {access.name!r}: its credentials cannot be used ({exc}); register it again.",
                field="cluster",
            ) from None
        configuration.retries = False
        self._client = k8s_client.ApiClient(configuration)

    # --- raw requests ------------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str = "application/json",
        raw: bool = False,
        retry: bool = True,
    ) -> Any:
        """One request to the API server; returns the decoded JSON body (the text with `raw`).

        `body` is a dict for JSON content types, already-serialized text for others (server-side apply).

        409 (conflict), 429 and 5xx are retried after `RETRY_BACKOFF_S`; a connection failure is retried once.
        Raises Unavailable (unreachable, or still failing after the retries), NotFoundInCluster for 404,
        ClusterRefused with the server's message for another 4xx.
        """
        waits = list(RETRY_BACKOFF_S) if retry else []
        connection_retries = 1 if retry else 0
        while True:
            with self._lock:
                self.calls += 1
            try:
                verb, url, headers, payload, _ = self._client.param_serialize(
                    method=method,
                    resource_path=path,
                    query_params=list(query),
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body,
                    auth_settings=["BearerToken"],
                )
                response = self._client.call_api(
                    verb, url, header_params=headers, body=payload, _request_timeout=REQUEST_TIMEOUT_S
                )
                data = response.read() or b""
                text = data.decode() if isinstance(data, bytes) else str(data)
                if not 200 <= response.status < 300:
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body = text
                    raise error
                if raw:
                    return text
                return json.loads(text) if text else {}
            except ApiException as exc:
                status = int(exc.status or 0)
                if status == 404:
                    raise NotFoundInCluster(_api_message(exc)) from None
                if (status in (409, 429) or status >= 500) and waits:
                    time.sleep(waits.pop(0))
                    continue
                if status in (409, 429) or status >= 500:
                    raise Unavailable(
                        f"Cluster {self.access.name!r} answered {status}: {_api_message(exc)}; Conch retries later."
                    ) from None
                if status == 0:
                    raise Unavailable(f"Cluster {self.access.name!r} cannot be reached: {exc.reason}.") from None
                raise ClusterRefused(
                    f"Cluster {self.access.name!r} refused {method} {path}: {_api_message(exc)}", field="cluster"
                ) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if connection_retries:
                    connection_retries -= 1
                    time.sleep(RETRY_BACKOFF_S[0])
                    continue
                raise Unavailable(
                    f"The API server of cluster {self.access.name!r} cannot be reached ({type(exc).__name__}); "
                    "Conch retries later."
                ) from None

    # --- discovery ---------------------------------------------------------------------------------------------

    def versions(self) -> ApiVersions:
        """The API versions this server offers for the kinds that moved (cached for `DISCOVERY_TTL_S`)."""
        cached = self._versions
        if cached is not None and time.monotonic() - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
        groups = {group["name"]: group for group in self.request("GET", "/apis").get("groups", [])}

        def offered(group: str) -> list[str]:
            return [entry["groupVersion"] for entry in groups.get(group, {}).get("versions", [])]

        autoscaling = offered("autoscaling")
        policy = offered("policy")
        found = ApiVersions(
            autoscaling=next(
                (v for v in ("autoscaling/v2", "autoscaling/v2beta2") if v in autoscaling), "autoscaling/v2"
            ),
            policy=next((v for v in ("policy/v1", "policy/v1beta1") if v in policy), "policy/v1"),
            pod_monitor="monitoring.coreos.com/v1" in offered("monitoring.coreos.com"),
        )
        self._versions = (time.monotonic(), found)
        return found

    def _group_version(self, kind: str) -> str:
        known = KINDS[kind].group_version
        if known:
            return known
        versions = self.versions()
        return versions.autoscaling if kind == "HorizontalPodAutoscaler" else versions.policy

    def _collection(self, kind: str, namespace: str | None = None) -> str:
        group_version = self._group_version(kind)
        return f"{_base(group_version)}/namespaces/{namespace or self.namespace}/{KINDS[kind].plural}"

    # --- objects -----------------------------------------------------------------------------------------------

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply `manifest` (its `kind`, `metadata.name`, namespace) and return the object as stored.

        Idempotent. Raises ClusterRefused with the server's message when it rejects the object (e.g. a quantity
        it cannot parse, a namespace that does not exist, a role that may not create it), Unavailable as `request`
        does.
        """
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        namespace = manifest["metadata"].get("namespace") or self.namespace
        try:
            return self.request(
                "PATCH",
                f"{self._collection(kind, namespace)}/{name}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=json.dumps(manifest),
                content_type="application/apply-patch+yaml",
            )
        except NotFoundInCluster as exc:
            # Applying creates the object: a 404 means its namespace (or the kind's API) is missing.
            raise ClusterRefused(
                f"Cluster {self.access.name!r} cannot create {kind} {name} in namespace {namespace!r}: {exc.detail}. "
                "Create the namespace, or register the cluster again with one that exists.",
                field="cluster",
            ) from None

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """Object `name` of `kind` in the namespace, or None when there is none."""
        try:
            return self.request("GET", f"{self._collection(kind)}/{name}")
        except NotFoundInCluster:
            return None

    def list(self, kind: str, *, selector: str = "", namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of `kind` in the namespace matching label `selector` (one request). A kind the server does not
        serve (the PodMonitor CRD absent) lists as []."""
        if kind == "PodMonitor" and not self.versions().pod_monitor:
            return []
        query = [("labelSelector", selector)] if selector else []
        return list(self.request("GET", self._collection(kind, namespace), query=query).get("items", []))

    def delete(self, kind: str, name: str, *, propagation: str = "Background") -> bool:
        """Delete object `name` of `kind`; returns False when it was already gone. Owned objects (a Deployment's
        ReplicaSets and Pods) are removed by the garbage collector (`propagation`)."""
        try:
            self.request(
                "DELETE",
                f"{self._collection(kind)}/{name}",
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
        except NotFoundInCluster:
            return False
        return True

    def delete_collection(self, kind: str, *, selector: str) -> None:
        """Delete every object of `kind` matching `selector` in the namespace (one request)."""
        if kind == "PodMonitor" and not self.versions().pod_monitor:
            return
        try:
            self.request(
                "DELETE",
                self._collection(kind),
                query=[("labelSelector", selector), ("propagationPolicy", "Background")],
            )
        except NotFoundInCluster:
            return

    # Annotations below name `builtins.list`: in this class's scope `list` is the method above.
    def nodes(self) -> builtins.list[dict[str, Any]]:
        """Every Node of the cluster (one request)."""
        return list(self.request("GET", "/api/v1/nodes").get("items", []))

    def pod_log(
        self, name: str, *, container: str = "", tail_lines: int = 30, previous: bool = False
    ) -> builtins.list[str]:
        """The last `tail_lines` lines of a pod container's log (the previous run's with `previous`); [] when the
        log cannot be read (the pod is gone, never ran, or its node does not serve logs)."""
        query: list[tuple[str, Any]] = [("tailLines", tail_lines)]
        if container:
            query.append(("container", container))
        if previous:
            query.append(("previous", "true"))
        try:
            text = self.request("GET", f"{self._collection('Pod')}/{name}/log", query=query, raw=True, retry=False)
        except ConchError:
            return []
        return text.splitlines()[-tail_lines:]


class NotFoundInCluster(Unavailable):
    """The API server answered 404 for the object or path (callers treat it as "gone")."""

    status_code = 404


_clients: dict[tuple[str, str], ClusterApi] = {}
_clients_lock = threading.Lock()


def cluster_api(access: ClusterAccess) -> ClusterApi:
    """The process's `ClusterApi` for `access` (a new one when the cluster's registration changed)."""
    key = (access.name, access.fingerprint)
    with _clients_lock:
        api = _clients.get(key)
        if api is None or api.access != access:
            api = ClusterApi(access)
            _clients[key] = api
        return api

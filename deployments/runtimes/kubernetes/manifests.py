"""Kubernetes manifests of a Triton deployment, as pure functions of plain data (no client, no network).

From one `TritonPodSpec` this module builds the objects a Kubernetes deployment of a model consists of: the
apps/v1 Deployment running `tritonserver`, its ClusterIP Service, the Secret holding the restricted-API key, the
Secret with the object-store credentials the pods read the repository with, a HorizontalPodAutoscaler, and a
PodDisruptionBudget when there are two replicas or more. Every object carries deterministic names and the same
labels, so applying them again is idempotent and one label selector finds them all.

Rules and their sources:
- Names are DNS-1123 labels of at most 63 characters (Kubernetes "Object Names and IDs"); a long one is cut and
  given a short hash suffix, so two long names never collide.
- Labels follow Kubernetes "Recommended Labels" (`app.kubernetes.io/name`, `/instance`, `/managed-by`), plus
  `conch.io/team` and `conch.io/deployment`.
- The container runs Triton with the model repository on S3, explicit model control, strict readiness, no
  auto-complete, and the restricted APIs keyed by an env var from a Secret (Triton "Model Repository", "Model
  Management", "Limit Endpoint Access"); probes on `/v2/health/live` and `/v2/health/ready` as NVIDIA's Triton
  Helm chart sets them, with a startup probe generous enough for large models.
- GPUs are whole `nvidia.com/gpu` units or one MIG resource `nvidia.com/mig-<profile>`, requested and limited
  alike (extended resources cannot be overcommitted: Kubernetes "Extended resources"); pods tolerate the
  `nvidia.com/gpu` taint and select the GPU product by the `nvidia.com/gpu.product` node label (NVIDIA GPU
  Feature Discovery).
- Pods run as non-root, without privilege escalation, with every capability dropped and the RuntimeDefault
  seccomp profile (Kubernetes "Pod Security Standards", restricted); `/dev/shm` is a memory-backed emptyDir with a
  size limit (Triton's Python backend exchanges tensors through shared memory).
- Rolling updates never go below the ready count (`maxUnavailable: 0`).
- Ingress to the pods is denied but from Conch's own pods (http, grpc, metrics) and the monitoring pods (metrics
  only), as the operator selects them (Kubernetes "Network Policies": a pod selected by a policy of type Ingress
  takes only what some rule admits). Egress stays open: the pods read the repository from the object store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conch.errors import InvalidInput
from tritonserving.access import restricted_api_flags_for
from tritonserving.metrics import LATENCY_SUMMARIES

__all__ = [
    "API_KEY_ENV",
    "HTTP_PORT",
    "GRPC_PORT",
    "METRICS_PORT",
    "Autoscaling",
    "GpuRequest",
    "PeerSelector",
    "TritonPodSpec",
    "api_key_secret_manifest",
    "deployment_manifest",
    "dns_label",
    "hpa_manifest",
    "labels",
    "network_policy_manifest",
    "object_name",
    "pdb_manifest",
    "pod_monitor_manifest",
    "s3_secret_manifest",
    "service_manifest",
    "triton_args",
]

#: Triton's standard ports (Triton "Deploying with Kubernetes"; the same numbers the local binary defaults to).
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
#: Container environment variable holding the restricted-API key; the args refer to it as `$(CONCH_TRITON_API_KEY)`.
API_KEY_ENV = "CONCH_TRITON_API_KEY"
#: Key of the restricted-API key inside its Secret.
API_KEY_SECRET_KEY = "api-key"
#: Label of the GPU product on nodes (NVIDIA GPU Feature Discovery) and the taint GPU nodes carry.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
#: Longest object name that is also a valid label value and DNS label (Kubernetes "Object Names and IDs").
_MAX_NAME = 63
_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]+gb(\+me)?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?")


@dataclass(frozen=True)
class GpuRequest:
    """GPUs for each pod: `count` whole GPUs of `product` (a `nvidia.com/gpu.product` label value, or None for
    any), or one MIG slice `mig_profile` (e.g. "1g.10gb"; resource `nvidia.com/mig-1g.10gb`)."""

    count: int = 0
    product: str | None = None
    mig_profile: str | None = None


@dataclass(frozen=True)
class Autoscaling:
    """HorizontalPodAutoscaler bounds and target: replicas between `min_replicas` and `max_replicas`, aiming at
    `target_queue_time_us` microseconds of average queue time per request on each pod (a Pods metric named
    `metric_name` that the cluster's metrics adapter derives from Triton's `nv_inference_queue_duration_us`), or,
    when `target_cpu_percent` is set instead, at that average CPU utilization (percent of the CPU request)."""

    min_replicas: int
    max_replicas: int
    target_queue_time_us: int | None = None
    target_cpu_percent: int | None = None
    metric_name: str = "triton_queue_time_per_request_us"


@dataclass(frozen=True)
class PeerSelector:
    """Pods a NetworkPolicy admits: those whose labels include `pod_labels` (empty: every pod) in the namespaces
    whose labels include `namespace_labels` (empty: only the policy's own namespace, the deployment's).

    Both are equality selectors (`{"app.kubernetes.io/part-of": "conch"}`), as `matchLabels` takes them.
    """

    pod_labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TritonPodSpec:
    """Plain data from which every manifest of one Kubernetes deployment is built.

    `repository` is the `s3://…` model repository the pods read (Triton "Cloud Storage"); `s3_secret_name` the
    Secret holding `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_DEFAULT_REGION` for it ("" when the pods'
    `service_account` carries an identity the store trusts instead). `cpu` and
    `memory` are Kubernetes quantities ("2", "500m", "8Gi"); `shm_size` the size limit of `/dev/shm`.
    """

    deployment_id: int
    team: str
    name: str
    model_name: str
    namespace: str
    image: str
    repository: str
    s3_secret_name: str
    replicas: int = 1
    gpu: GpuRequest | None = None
    cpu: str = "1"
    memory: str = "4Gi"
    shm_size: str = "1Gi"
    image_pull_secrets: tuple[str, ...] = ()
    autoscaling: Autoscaling | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    #: The pods' service account ("" = the namespace's default) and literal environment variables.
    service_account: str = ""
    environment: Mapping[str, str] = field(default_factory=dict)


def dns_label(text: str, *, max_length: int = _MAX_NAME) -> str:
    """Turn `text` into a DNS-1123 label of at most `max_length` characters, deterministically.

    Lower-cased, runs of other characters become "-"; a text that had to be cut (or changed) keeps a 6-hex-digit
    hash of the original at its end, so two different texts never map to one label. Raises InvalidInput (field
    `name`) when nothing usable is left.
    """
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not cleaned:
        raise InvalidInput(f"{text!r} has no letters or digits to name a Kubernetes object with.", field="name")
    if cleaned == text and len(cleaned) <= max_length:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    head = cleaned[: max_length - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


def object_name(spec: TritonPodSpec) -> str:
    """Name shared by the Deployment, Service, HPA and PDB: `<team>-<deployment name>-<id>` as a DNS label."""
    return dns_label(f"{spec.team}-{spec.name}-{spec.deployment_id}")


def labels(spec: TritonPodSpec) -> dict[str, str]:
    """Labels every object of the deployment carries (Kubernetes "Recommended Labels" plus Conch's own)."""
    return {
        **dict(spec.extra_labels),
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": object_name(spec),
        "app.kubernetes.io/managed-by": "conch",
        "conch.io/team": dns_label(spec.team),
        "conch.io/deployment": str(spec.deployment_id),
    }


def _selector(spec: TritonPodSpec) -> dict[str, str]:
    return {"app.kubernetes.io/instance": object_name(spec), "conch.io/deployment": str(spec.deployment_id)}


def _metadata(spec: TritonPodSpec, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec)}


def triton_args(spec: TritonPodSpec) -> list[str]:
    """`tritonserver` arguments of the pods: repository on S3, explicit control loading the one model, strict
    readiness, auto-complete off, restricted APIs keyed by `$(CONCH_TRITON_API_KEY)`, standard ports."""
    return [
        f"--model-repository={spec.repository}",
        "--model-control-mode=explicit",
        f"--load-model={spec.model_name}",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
        *restricted_api_flags_for(f"$({API_KEY_ENV})"),
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        "--allow-metrics=true",
        f"--metrics-port={METRICS_PORT}",
        f"--metrics-config={LATENCY_SUMMARIES}",
        "--exit-timeout-secs=30",
    ]


def _resources(spec: TritonPodSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": spec.cpu, "memory": spec.memory}
    limits: dict[str, Any] = {"memory": spec.memory}
    # Quantities are written as strings: server-side apply types them as such (a number is refused), and every
    # Kubernetes client reads them back as strings.
    if spec.gpu is not None and spec.gpu.mig_profile:
        requests[f"nvidia.com/mig-{spec.gpu.mig_profile}"] = "1"
        limits[f"nvidia.com/mig-{spec.gpu.mig_profile}"] = "1"
    elif spec.gpu is not None and spec.gpu.count:
        requests[GPU_RESOURCE] = str(spec.gpu.count)
        limits[GPU_RESOURCE] = str(spec.gpu.count)
    return {"requests": requests, "limits": limits}


def _check(spec: TritonPodSpec) -> None:
    if not isinstance(spec.replicas, int) or isinstance(spec.replicas, bool) or spec.replicas < 0:
        raise InvalidInput(f"replicas must be a whole number of at least 0; got {spec.replicas!r}.", field="replicas")
    for field_name, value in (("cpu", spec.cpu), ("memory", spec.memory), ("shm_size", spec.shm_size)):
        if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
            raise InvalidInput(
                f"{field_name} must be a Kubernetes quantity such as '2', '500m' or '8Gi'; got {value!r}.",
                field=field_name,
            )
    gpu = spec.gpu
    if gpu is not None:
        if gpu.mig_profile and gpu.count:
            raise InvalidInput(
                "Ask for either whole GPUs (gpu.count) or one MIG slice (gpu.mig_profile), not both.", field="gpu"
            )
        if gpu.mig_profile and not _MIG_PROFILE.fullmatch(gpu.mig_profile):
            raise InvalidInput(
                f"gpu.mig_profile must be a MIG profile such as '1g.10gb'; got {gpu.mig_profile!r}.",
                field="gpu.mig_profile",
            )
        if not isinstance(gpu.count, int) or isinstance(gpu.count, bool) or gpu.count < 0:
            raise InvalidInput(
                f"gpu.count must be a whole number of GPUs (Kubernetes cannot share a GPU); got {gpu.count!r}. "
                "For part of a GPU, ask for a MIG slice with gpu.mig_profile.",
                field="gpu.count",
            )
    if spec.autoscaling is not None:
        scaling = spec.autoscaling
        if not 1 <= scaling.min_replicas <= scaling.max_replicas:
            raise InvalidInput(
                f"autoscaling needs 1 <= min_replicas <= max_replicas; got {scaling.min_replicas} and "
                f"{scaling.max_replicas}.",
                field="autoscaling.min_replicas",
            )
        if (scaling.target_queue_time_us is None) == (scaling.target_cpu_percent is None):
            raise InvalidInput(
                "autoscaling needs one target: target_queue_time_us (Triton's queue time per request) or "
                "target_cpu_percent.",
                field="autoscaling.target_queue_time_us",
            )
        if scaling.target_queue_time_us is not None and scaling.target_queue_time_us < 1:
            raise InvalidInput(
                "autoscaling.target_queue_time_us must be at least 1 microsecond.",
                field="autoscaling.target_queue_time_us",
            )
        if scaling.target_cpu_percent is not None and not 1 <= scaling.target_cpu_percent <= 1000:
            raise InvalidInput(
                "autoscaling.target_cpu_percent must be between 1 and 1000 (percent of the CPU request).",
                field="autoscaling.target_cpu_percent",
            )


def deployment_manifest(spec: TritonPodSpec) -> dict[str, Any]:
    """The apps/v1 Deployment running `tritonserver` (see the module docstring for every rule it follows).

    Raises InvalidInput naming the field for values no cluster could run (fractional GPUs, a bad MIG profile,
    negative replicas, a malformed quantity).
    """
    _check(spec)
    name = object_name(spec)
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "tritonserver",
                "image": spec.image,
                "command": ["tritonserver"],
                "args": triton_args(spec),
                "env": [
                    {
                        "name": API_KEY_ENV,
                        "valueFrom": {"secretKeyRef": {"name": f"{name}-api-key", "key": API_KEY_SECRET_KEY}},
                    },
                    *({"name": key, "value": value} for key, value in sorted(spec.environment.items())),
                ],
                **({"envFrom": [{"secretRef": {"name": spec.s3_secret_name}}]} if spec.s3_secret_name else {}),
                "ports": [
                    {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                    {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                ],
                "resources": _resources(spec),
                "startupProbe": {
                    "httpGet": {"path": "/v2/health/ready", "port": "http"},
                    "periodSeconds": 10,
                    "failureThreshold": 120,
                },
                "readinessProbe": {
                    "httpGet": {"path": "/v2/health/ready", "port": "http"},
                    "periodSeconds": 5,
                    "failureThreshold": 3,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/v2/health/live", "port": "http"},
                    "periodSeconds": 10,
                    "failureThreshold": 3,
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": False,
                },
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}],
    }
    if spec.gpu is not None and (spec.gpu.count or spec.gpu.mig_profile):
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        if spec.gpu.product:
            pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: spec.gpu.product}
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in spec.image_pull_secrets]
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, name),
        "spec": {
            "selector": {"matchLabels": _selector(spec)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "progressDeadlineSeconds": 1800,
            "template": {"metadata": {"labels": labels(spec)}, "spec": pod_spec},
        },
    }
    if spec.autoscaling is None:
        manifest["spec"]["replicas"] = spec.replicas
    return manifest


def service_manifest(spec: TritonPodSpec) -> dict[str, Any]:
    """The ClusterIP Service in front of the pods, with named ports http, grpc and metrics."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, object_name(spec)),
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(spec),
            "ports": [
                {"name": port_name, "port": number, "targetPort": port_name, "protocol": "TCP"}
                for port_name, number in (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
            ],
        },
    }


def api_key_secret_manifest(spec: TritonPodSpec, api_key: str) -> dict[str, Any]:
    """The Secret holding the pods' restricted-API key (key `api-key`, read into `$CONCH_TRITON_API_KEY`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, f"{object_name(spec)}-api-key"),
        "type": "Opaque",
        "stringData": {API_KEY_SECRET_KEY: api_key},
    }


def s3_secret_manifest(
    spec: TritonPodSpec, *, access_key_id: str, secret_access_key: str, region: str
) -> dict[str, Any]:
    """The Secret with the object-store credentials Triton reads the `s3://` repository with (Triton "Cloud
    Storage with Environment variables"), named `spec.s3_secret_name`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, spec.s3_secret_name),
        "type": "Opaque",
        "stringData": {
            "AWS_ACCESS_KEY_ID": access_key_id,
            "AWS_SECRET_ACCESS_KEY": secret_access_key,
            "AWS_DEFAULT_REGION": region,
        },
    }


def hpa_manifest(spec: TritonPodSpec, *, api_version: str = "autoscaling/v2") -> dict[str, Any] | None:
    """The HorizontalPodAutoscaler on the per-pod queue-time metric, or None without autoscaling.

    `api_version` is `autoscaling/v2` (Kubernetes 1.23+) or `autoscaling/v2beta2` (older servers); both take the
    same `metrics` form. The cluster needs a metrics adapter serving the Pods metric `Autoscaling.metric_name`, e.g.
    prometheus-adapter with a rule deriving it as rate(nv_inference_queue_duration_us) / rate(
    nv_inference_request_success) per pod.
    """
    if spec.autoscaling is None:
        return None
    _check(spec)
    if api_version not in ("autoscaling/v2", "autoscaling/v2beta2"):
        raise ValueError(f"unsupported HorizontalPodAutoscaler version {api_version!r}")
    scaling = spec.autoscaling
    name = object_name(spec)
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(spec, name),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [_hpa_metric(scaling)],
        },
    }


def _hpa_metric(scaling: Autoscaling) -> dict[str, Any]:
    if scaling.target_cpu_percent is not None:
        return {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": scaling.target_cpu_percent},
            },
        }
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": scaling.metric_name},
            "target": {"type": "AverageValue", "averageValue": str(scaling.target_queue_time_us)},
        },
    }


def pdb_manifest(spec: TritonPodSpec, *, api_version: str = "policy/v1") -> dict[str, Any] | None:
    """A PodDisruptionBudget keeping all but one pod up during voluntary disruptions, when the deployment can run
    two pods or more (`replicas >= 2`, or autoscaling with `min_replicas >= 2`); None otherwise.

    `api_version` is `policy/v1` (Kubernetes 1.21+) or `policy/v1beta1` (older servers).
    """
    least = spec.autoscaling.min_replicas if spec.autoscaling is not None else spec.replicas
    if least < 2:
        return None
    if api_version not in ("policy/v1", "policy/v1beta1"):
        raise ValueError(f"unsupported PodDisruptionBudget version {api_version!r}")
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, object_name(spec)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(spec)}},
    }


def pod_monitor_manifest(spec: TritonPodSpec) -> dict[str, Any]:
    """A `monitoring.coreos.com/v1` PodMonitor scraping the pods' `metrics` port every 15 s (Prometheus operator
    API). Apply it only when the cluster serves that CRD (`api.ApiVersions.pod_monitor`)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(spec, object_name(spec)),
        "spec": {
            "selector": {"matchLabels": _selector(spec)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def _peer(selector: PeerSelector) -> dict[str, Any]:
    peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(selector.pod_labels)}}
    if selector.namespace_labels:
        peer["namespaceSelector"] = {"matchLabels": dict(selector.namespace_labels)}
    return peer


def network_policy_manifest(spec: TritonPodSpec, *, conch: PeerSelector, monitoring: PeerSelector) -> dict[str, Any]:
    """The `networking.k8s.io/v1` NetworkPolicy of the deployment's pods: ingress only from `conch` (Conch's
    gateway, web and worker pods) on the http, grpc and metrics ports, and from `monitoring` (Prometheus) on the
    metrics port; everything else that comes in is denied. Egress is not restricted.

    Ports are given as numbers (8000, 8001, 8002), the container ports of `deployment_manifest`. Kubernetes
    "Network Policies": a policy is enforced by the cluster's network plugin; without one, it is stored and has
    no effect.
    """
    ports = {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(spec, object_name(spec)),
        "spec": {
            "podSelector": {"matchLabels": _selector(spec)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [_peer(conch)],
                    "ports": [{"protocol": "TCP", "port": number} for number in ports.values()],
                },
                {"from": [_peer(monitoring)], "ports": [{"protocol": "TCP", "port": ports["metrics"]}]},
            ],
        },
    }

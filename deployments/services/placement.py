"""Where and how many: the Kubernetes part of a deployment's spec (cluster, replicas or autoscaling, GPUs, CPU and
memory per pod), parsed from JSON values and checked before anything is stored.

One source of rules: the shapes are checked here, the values by the same pure manifest builders that will run
(`manifests.deployment_manifest`, `hpa_manifest`), and GPU requests against what the cluster's Nodes offer
(`nodes.check_gpu_request`). Every refusal is an InvalidInput naming the field (`cluster`, `replicas`,
`autoscaling.max_replicas`, `gpu.count`, `gpu.product`, `cpu`...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from django.conf import settings

from builds.model_config import INSTANCE_KINDS
from conch.errors import ConchError, InvalidInput, NotFound, attempt
from deployments.choices import RuntimeName
from deployments.models import Cluster
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.nodes import check_gpu_request
from deployments.runtimes.local import local_gpu_count
from deployments.services.clusters import cluster_gpu_offers
from deployments.services.requests import PlacementRequest

__all__ = [
    "AutoscalingSpec",
    "GpuSpec",
    "Placement",
    "check_instance_kind",
    "check_placement",
    "parse_placement",
    "parse_scaling",
]

_AUTOSCALING_KEYS = ("min_replicas", "max_replicas", "target_queue_time_us", "target_cpu_percent")
_GPU_KEYS = ("count", "product", "mig_profile")


class AutoscalingSpec(TypedDict):
    """Parsed autoscaling bounds (stored as `Deployment.autoscaling`): pods between `min_replicas` and
    `max_replicas`, and exactly one target, `target_queue_time_us` (microseconds of queue time per request) or
    `target_cpu_percent` (percent of the CPU request). The keyword arguments of `manifests.Autoscaling`."""

    min_replicas: int
    max_replicas: int
    target_queue_time_us: NotRequired[int]
    target_cpu_percent: NotRequired[int]


class GpuSpec(TypedDict, total=False):
    """Parsed GPUs per pod (stored as `Deployment.gpu`): `count` whole GPUs, of `product` when given (a
    `nvidia.com/gpu.product` label value), or one MIG slice `mig_profile` alone ("1g.10gb")."""

    count: int
    product: str
    mig_profile: str


@dataclass(frozen=True)
class Placement:
    """A parsed Kubernetes placement: the cluster, fixed `replicas` or `autoscaling` bounds, GPUs per pod
    (`{"count", "product"}` or `{"mig_profile"}`, None for CPU only), `cpu`/`memory` requests ("" = defaults)."""

    cluster: Cluster | None = None
    replicas: int = 1
    autoscaling: AutoscalingSpec | None = None
    gpu: GpuSpec | None = None
    cpu: str = ""
    memory: str = ""

    def require_cluster(self) -> Cluster:
        """The cluster of a kubernetes placement. Raises ValueError for a placement without one (a local
        deployment's), which no kubernetes code path should be handed."""
        if self.cluster is None:
            raise ValueError("This placement names no cluster; only a kubernetes placement has one.")
        return self.cluster


def _whole(value: Any, field: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"{field} must be a whole number between {low} and {high}; got {value!r}.", field=field)
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.lstrip("-").isdigit()):
            raise InvalidInput(f"{field} must be a whole number between {low} and {high}; got {value!r}.", field=field)
        value = int(text)
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidInput(f"{field} must be a whole number; got {value!r}.", field=field)
        value = int(value)
    if not low <= value <= high:
        raise InvalidInput(f"{field} must be between {low} and {high}; got {value}.", field=field)
    return value


def _mapping(value: Any, field: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must be an object with {', '.join(keys)}.", field=field)
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise InvalidInput(
            f"{field} has unknown keys {', '.join(unknown)}; it takes {', '.join(keys)}.", field=f"{field}.{unknown[0]}"
        )
    return value


def parse_scaling(*, replicas: Any, autoscaling: Any) -> tuple[int, AutoscalingSpec | None]:
    """Fixed `replicas` (0..CONCH_KUBERNETES_MAX_REPLICAS) or `autoscaling` bounds, not both; returns (replicas,
    autoscaling or None). With neither, 1 replica."""
    most = settings.CONCH_KUBERNETES_MAX_REPLICAS
    if replicas is not None and autoscaling is not None:
        raise InvalidInput("Give either replicas or autoscaling, not both.", field="replicas")
    if autoscaling is None:
        return (1 if replicas is None else _whole(replicas, "replicas", low=0, high=most)), None
    raw = _mapping(autoscaling, "autoscaling", _AUTOSCALING_KEYS)
    for key in ("min_replicas", "max_replicas"):
        if raw.get(key) is None:
            raise InvalidInput(f"autoscaling.{key} is required.", field=f"autoscaling.{key}")
    low = _whole(raw["min_replicas"], "autoscaling.min_replicas", low=1, high=most)
    high = _whole(raw["max_replicas"], "autoscaling.max_replicas", low=1, high=most)
    if low > high:
        raise InvalidInput(
            f"autoscaling.min_replicas ({low}) must not exceed autoscaling.max_replicas ({high}).",
            field="autoscaling.min_replicas",
        )
    parsed: AutoscalingSpec = {"min_replicas": low, "max_replicas": high}
    if raw.get("target_cpu_percent") is not None:
        parsed["target_cpu_percent"] = _whole(
            raw["target_cpu_percent"], "autoscaling.target_cpu_percent", low=1, high=1000
        )
    if raw.get("target_queue_time_us") is not None or "target_cpu_percent" not in parsed:
        target = raw.get("target_queue_time_us")
        if target is None:
            raise InvalidInput(
                "autoscaling needs a target: target_queue_time_us (microseconds of queue time per request) or "
                "target_cpu_percent.",
                field="autoscaling.target_queue_time_us",
            )
        parsed["target_queue_time_us"] = _whole(target, "autoscaling.target_queue_time_us", low=1, high=60_000_000)
    if len(parsed) > 3:
        raise InvalidInput(
            "Give one autoscaling target: target_queue_time_us or target_cpu_percent.",
            field="autoscaling.target_cpu_percent",
        )
    return parsed["min_replicas"], parsed


def _parse_gpu(gpu: Any) -> GpuSpec | None:
    if gpu is None:
        return None
    raw = _mapping(gpu, "gpu", _GPU_KEYS)
    if raw.get("mig_profile") is not None:
        if raw.get("count") not in (None, 1) or raw.get("product") is not None:
            raise InvalidInput(
                'A MIG slice is asked for alone: {"mig_profile": "1g.10gb"} (one slice per pod).',
                field="gpu.mig_profile",
            )
        if not isinstance(raw["mig_profile"], str):
            raise InvalidInput("gpu.mig_profile must be a MIG profile name such as '1g.10gb'.", field="gpu.mig_profile")
        return {"mig_profile": raw["mig_profile"]}
    count = raw.get("count", 1)
    if isinstance(count, float) and not count.is_integer() or isinstance(count, str) and "." in count:
        raise InvalidInput(
            f"gpu.count must be a whole number of GPUs (Kubernetes cannot share one); got {count!r}. For part of a "
            "GPU, ask for a MIG slice with gpu.mig_profile.",
            field="gpu.count",
        )
    parsed: GpuSpec = {"count": _whole(count, "gpu.count", low=1, high=16)}
    product = raw.get("product")
    if product is not None:
        if not isinstance(product, str) or not product or len(product) > 63:
            raise InvalidInput("gpu.product must be a GPU product name such as 'NVIDIA-A10'.", field="gpu.product")
        parsed["product"] = product
    return parsed


def _quantity(value: Any, field: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidInput(f"{field} must be a Kubernetes quantity such as '2', '500m' or '8Gi'.", field=field)
    return str(value)


def check_instance_kind(*, runtime: str, instance_kind: Any, gpu: Mapping[str, Any] | None) -> str | None:
    """The model instance kind a deployment asks for (Triton "Model Configuration" -> "Instance Groups", kind),
    checked against where it runs; None (or "") leaves the kind as built (KIND_AUTO: Triton picks per machine).

    KIND_AUTO and KIND_CPU run anywhere. KIND_GPU needs a GPU: on the local runtime, one on the worker host
    (`local_gpu_count`, CONCH_LOCAL_GPUS); on kubernetes, GPUs per pod (`gpu`: whole GPUs or a MIG slice of
    what the cluster offers). Raises InvalidInput (field `instance_kind`) saying which kinds are possible there.
    """
    if instance_kind is None or instance_kind == "":
        return None
    if not isinstance(instance_kind, str) or instance_kind not in INSTANCE_KINDS:
        raise InvalidInput(
            f"instance_kind must be one of {', '.join(INSTANCE_KINDS)} (or empty: as built); got {instance_kind!r}.",
            field="instance_kind",
        )
    if instance_kind != "KIND_GPU":
        return instance_kind
    if runtime == RuntimeName.KUBERNETES and not gpu:
        raise InvalidInput(
            "instance_kind KIND_GPU needs GPUs in the pod: ask for whole GPUs (gpu.count) or a MIG slice "
            "(gpu.mig_profile) of what the cluster offers, or choose KIND_CPU.",
            field="instance_kind",
        )
    if runtime != RuntimeName.KUBERNETES and local_gpu_count() == 0:
        raise InvalidInput(
            "instance_kind KIND_GPU needs a GPU, and this machine (the local runtime's worker host) has none: "
            "choose KIND_CPU, or deploy on a Kubernetes cluster with GPUs.",
            field="instance_kind",
        )
    return instance_kind


def _find_cluster(cluster: Any) -> Cluster:
    if not cluster or not isinstance(cluster, str):
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none is registered yet"
        raise InvalidInput(f"A kubernetes deployment needs a cluster ({known}).", field="cluster")
    found = Cluster.objects.filter(name=cluster).first()
    if found is None:
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none is registered yet"
        raise InvalidInput(f"There is no cluster {cluster!r} ({known}).", field="cluster")
    return found


def parse_placement(request: PlacementRequest) -> Placement:
    """Parse and check the Kubernetes placement of a deployment (see the module docstring).

    For the local runtime every field must be absent (InvalidInput naming the first one given). For kubernetes,
    `cluster` must name a registered cluster, and a GPU request is checked against what the cluster's
    schedulable Nodes offer (one API request; Unavailable when the cluster does not answer). Raises the first
    refusal `check_placement` finds.
    """
    placement, refusals = check_placement(request)
    if refusals:
        raise refusals[0]
    if placement is None:
        raise ValueError("check_placement returned neither a placement nor a refusal.")
    return placement


def check_placement(request: PlacementRequest) -> tuple[Placement | None, list[ConchError]]:
    """Check the placement as `parse_placement` does, gathering every refusal instead of stopping at the first.

    Returns (the placement, []) or (None, the refusals in `parse_placement`'s order: each field given to a local
    deployment; then the cluster, the scaling, the GPUs, cpu and memory, each parsed on its own; then the
    manifest rules, once all parts parsed; then the GPU request against the cluster's offers, once the cluster
    and the GPUs parsed).
    """
    given = request.given()
    cluster, replicas, autoscaling, gpu = request.cluster, request.replicas, request.autoscaling, request.gpu
    cpu, memory = request.cpu, request.memory
    refusals: list[ConchError] = []
    if request.runtime != RuntimeName.KUBERNETES:
        for field, value in given.items():
            if value not in (None, ""):
                refusals.append(InvalidInput(f"{field} applies to the kubernetes runtime only.", field=field))
        return (None if refusals else Placement()), refusals
    _, found = attempt(refusals, _find_cluster, cluster)
    _, scaling_result = attempt(refusals, parse_scaling, replicas=replicas, autoscaling=autoscaling)
    gpu_parsed, parsed_gpu = attempt(refusals, _parse_gpu, gpu)
    _, cpu_quantity = attempt(refusals, _quantity, cpu, "cpu")
    _, memory_quantity = attempt(refusals, _quantity, memory, "memory")
    if not refusals:
        count, scaling = scaling_result
        placement = Placement(
            cluster=found,
            replicas=count,
            autoscaling=scaling,
            gpu=parsed_gpu,
            cpu=cpu_quantity,
            memory=memory_quantity,
        )
        attempt(refusals, _check_manifests, placement)
    if found is not None and gpu_parsed:
        attempt(refusals, _check_gpu_offers, found, _gpu_request(parsed_gpu))
    if refusals:
        return None, refusals
    return placement, []


def _check_manifests(placement: Placement) -> None:
    """Build the placement's manifests as the runtime will (raises InvalidInput naming the field)."""
    found, scaling = placement.require_cluster(), placement.autoscaling
    request = _gpu_request(placement.gpu)
    # The rules the manifests will apply, checked now (quantities, MIG profile names, autoscaling bounds).
    trial = manifests.TritonPodSpec(
        deployment_id=1,
        team="team",
        name="check",
        model_name="model",
        namespace=found.namespace,
        image=found.triton_image,
        repository="s3://bucket/check",
        s3_secret_name="check",
        replicas=placement.replicas,
        gpu=request,
        cpu=placement.cpu or "1",
        memory=placement.memory or "4Gi",
        autoscaling=manifests.Autoscaling(**scaling) if scaling else None,
    )
    manifests.deployment_manifest(trial)
    manifests.hpa_manifest(trial)


def _check_gpu_offers(cluster: Cluster, request: manifests.GpuRequest | None) -> None:
    """Check a GPU request against what the cluster's schedulable Nodes offer (one API request)."""
    if request is None:
        return
    try:
        offers = cluster_gpu_offers(cluster)
    except NotFound:
        offers = []
    check_gpu_request(offers, request)


def _gpu_request(gpu: Mapping[str, Any] | None) -> manifests.GpuRequest | None:
    if not gpu:
        return None
    return manifests.GpuRequest(
        count=gpu.get("count") or 0, product=gpu.get("product"), mig_profile=gpu.get("mig_profile")
    )

"""What a cluster offers for GPUs, read from its Node objects, and whether a GPU request can ever fit: pure code.

Inputs are Node objects as plain dicts (as the API returns them, e.g. after `sanitize_for_serialization`). GPU
nodes carry the product in the `nvidia.com/gpu.product` label (NVIDIA GPU Feature Discovery) and advertise
`nvidia.com/gpu` (whole GPUs) or `nvidia.com/mig-<profile>` (MIG slices) in `status.allocatable` (NVIDIA device
plugin, "MIG strategy mixed"). Nodes that are cordoned (`spec.unschedulable`) or not Ready are left out: nothing
would be scheduled there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conch.errors import InvalidInput
from deployments.runtimes.kubernetes.manifests import GPU_PRODUCT_LABEL, GPU_RESOURCE, GpuRequest

__all__ = ["GpuOffer", "check_gpu_request", "gpu_offers"]

_MIG_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True)
class GpuOffer:
    """One kind of GPU resource on a cluster's schedulable nodes.

    `resource` is `nvidia.com/gpu` or `nvidia.com/mig-<profile>`; `product` the nodes' GPU product (None when
    unlabelled); `most_on_one_node` the largest allocatable count of one node (a pod cannot span nodes); `total`
    the sum over `nodes` nodes.
    """

    product: str | None
    resource: str
    most_on_one_node: int
    total: int
    nodes: int

    @property
    def mig_profile(self) -> str | None:
        """ "1g.10gb" for `nvidia.com/mig-1g.10gb`, None for whole GPUs."""
        return self.resource[len(_MIG_PREFIX) :] if self.resource.startswith(_MIG_PREFIX) else None

    def describe(self) -> str:
        """E.g. "NVIDIA-A10: nvidia.com/gpu, up to 2 on a node (4 on 2 nodes)"."""
        return (
            f"{self.product or 'unlabelled'}: {self.resource}, up to {self.most_on_one_node} on a node "
            f"({self.total} on {self.nodes} node{'s' if self.nodes != 1 else ''})"
        )


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _count(value: Any) -> int:
    """Allocatable count of an extended resource (whole numbers, given as text or numbers); 0 when unreadable."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def gpu_offers(nodes: Iterable[Mapping[str, Any]]) -> list[GpuOffer]:
    """Group the GPU resources of schedulable, Ready nodes by (product, resource), sorted by product and resource."""
    grouped: dict[tuple[str | None, str], list[int]] = {}
    for node in nodes:
        if not _schedulable(node):
            continue
        product = ((node.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL)
        for resource, value in ((node.get("status") or {}).get("allocatable") or {}).items():
            if resource != GPU_RESOURCE and not resource.startswith(_MIG_PREFIX):
                continue
            count = _count(value)
            if count:
                grouped.setdefault((product, resource), []).append(count)
    ordered = sorted(grouped.items(), key=lambda item: (item[0][0] or "", item[0][1]))
    return [
        GpuOffer(product, resource, most_on_one_node=max(counts), total=sum(counts), nodes=len(counts))
        for (product, resource), counts in ordered
    ]


def check_gpu_request(offers: Sequence[GpuOffer], request: GpuRequest | None) -> None:
    """Raise InvalidInput naming the field when no schedulable node could ever hold one pod's GPUs.

    Fields: `gpu.product` (the cluster has no node with that product), `gpu.mig_profile` (no node offers that MIG
    slice), `gpu.count` (more GPUs than any one node has). The message lists what the cluster offers. A request
    for no GPU always fits here (CPU and memory are left to the scheduler).
    """
    if request is None or not (request.count or request.mig_profile):
        return
    offered = "; ".join(offer.describe() for offer in offers) or "no GPUs on any schedulable node"
    resource = f"{_MIG_PREFIX}{request.mig_profile}" if request.mig_profile else GPU_RESOURCE
    matching = [o for o in offers if o.resource == resource and (request.product in (None, o.product))]
    if request.product and not any(o.product == request.product for o in offers):
        raise InvalidInput(
            f"The cluster has no schedulable node with GPU product {request.product!r}. It offers: {offered}.",
            field="gpu.product",
        )
    if not matching:
        field = "gpu.mig_profile" if request.mig_profile else "gpu.count"
        raise InvalidInput(f"No schedulable node offers {resource}. The cluster offers: {offered}.", field=field)
    wanted = 1 if request.mig_profile else request.count
    most = max(o.most_on_one_node for o in matching)
    if wanted > most:
        raise InvalidInput(
            f"A pod needs {wanted} {resource} on one node, but the most any node has is {most}. Ask for at most "
            f"{most}, or run more replicas. The cluster offers: {offered}.",
            field="gpu.count",
        )

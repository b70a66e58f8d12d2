"""GPU offers read from Node objects, and GPU requests that no node could hold refused naming the field."""

from __future__ import annotations

import pytest

from conch.errors import InvalidInput
from deployments.runtimes.kubernetes.manifests import GpuRequest
from deployments.runtimes.kubernetes.nodes import GpuOffer, check_gpu_request, gpu_offers


def node(name: str, *, product: str | None = None, ready: bool = True, cordoned: bool = False, resources=None) -> dict:
    """A Node as the API returns it, with extended `resources` (e.g. {"nvidia.com/gpu": "2"}) allocatable."""
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels["nvidia.com/gpu.product"] = product
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", **(resources or {})},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


NODES = [
    node("gpu-a", product="NVIDIA-A10", resources={"nvidia.com/gpu": "2"}),
    node("gpu-a2", product="NVIDIA-A10", resources={"nvidia.com/gpu": "1"}),
    node("gpu-b", product="NVIDIA-A100-SXM4-40GB", resources={"nvidia.com/mig-1g.10gb": "7"}),
    node("cpu-a"),
    node("gpu-down", product="NVIDIA-H100", ready=False, resources={"nvidia.com/gpu": "8"}),
    node("gpu-cordoned", product="NVIDIA-L4", cordoned=True, resources={"nvidia.com/gpu": "4"}),
]


def test_offers_group_schedulable_ready_gpu_nodes_by_product_and_resource():
    assert gpu_offers(NODES) == [
        GpuOffer(product="NVIDIA-A10", resource="nvidia.com/gpu", most_on_one_node=2, total=3, nodes=2),
        GpuOffer("NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.10gb", most_on_one_node=7, total=7, nodes=1),
    ]
    [_, mig] = gpu_offers(NODES)
    assert mig.mig_profile == "1g.10gb"
    assert gpu_offers([node("cpu-a")]) == []


@pytest.mark.parametrize(
    "request_",
    [
        None,
        GpuRequest(),
        GpuRequest(count=2, product="NVIDIA-A10"),
        GpuRequest(count=1),
        GpuRequest(mig_profile="1g.10gb"),
        GpuRequest(mig_profile="1g.10gb", product="NVIDIA-A100-SXM4-40GB"),
    ],
)
def test_requests_some_node_could_hold_pass(request_):
    check_gpu_request(gpu_offers(NODES), request_)


@pytest.mark.parametrize(
    ("request_", "field", "message"),
    [
        (GpuRequest(count=3, product="NVIDIA-A10"), "gpu.count", "needs 3 nvidia.com/gpu on one node, but the most"),
        (GpuRequest(count=1, product="NVIDIA-H100"), "gpu.product", "no schedulable node with GPU product"),
        (GpuRequest(count=1, product="NVIDIA-L4"), "gpu.product", "NVIDIA-L4"),  # only on a cordoned node
        (GpuRequest(mig_profile="3g.20gb"), "gpu.mig_profile", "No schedulable node offers nvidia.com/mig-3g.20gb"),
        (
            GpuRequest(count=1, product="NVIDIA-A100-SXM4-40GB"),
            "gpu.count",
            "No schedulable node offers nvidia.com/gpu.",
        ),
    ],
)
def test_requests_no_node_could_hold_are_refused_naming_the_field_and_what_there_is(request_, field, message):
    with pytest.raises(InvalidInput) as caught:
        check_gpu_request(gpu_offers(NODES), request_)
    assert caught.value.field == field
    assert message in caught.value.detail
    assert "NVIDIA-A10: nvidia.com/gpu, up to 2 on a node (3 on 2 nodes)" in caught.value.detail


def test_a_gpu_request_on_a_cluster_without_gpus_says_so():
    with pytest.raises(InvalidInput, match="no GPUs on any schedulable node"):
        check_gpu_request(gpu_offers([node("cpu-a")]), GpuRequest(count=1))

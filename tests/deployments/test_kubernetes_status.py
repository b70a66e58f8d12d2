"""Status in words (tier 1): the pure wording of Deployments and Pods as the API server writes them.

The objects here have the shapes Kubernetes 1.20+ returns (the same fields the real-cluster tests produce with the
real scheduler and controller-manager); the real-cluster tests check the same wording end to end.
"""

from __future__ import annotations

from deployments.runtimes.base import Phase
from deployments.runtimes.kubernetes.status import describe_workload, pod_summary


def deployment(desired=2, ready=0, generation=1, observed=1, conditions=()):
    return {
        "metadata": {"name": "acme-web-1", "generation": generation},
        "spec": {"replicas": desired},
        "status": {"observedGeneration": observed, "readyReplicas": ready, "conditions": list(conditions)},
    }


def pod(name, *, node="gpu-a", ready=False, conditions=(), container=None, gpu=None, selector=None, memory="4Gi"):
    requests = {"cpu": "1", "memory": memory, **({"nvidia.com/gpu": gpu} if gpu else {})}
    spec = {
        "containers": [
            {
                "name": "tritonserver",
                "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
                "resources": {"requests": requests, "limits": {"memory": memory}},
            }
        ],
        **({"nodeName": node} if node else {}),
        **({"nodeSelector": selector} if selector else {}),
    }
    status_conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *conditions]
    return {
        "metadata": {"name": name, "labels": {"conch.io/deployment": "1"}},
        "spec": spec,
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": status_conditions,
            "containerStatuses": [container] if container else [],
        },
    }


def gpu_node(name, product, gpus):
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match node selector.",
}


def test_all_pods_ready_is_ready_with_counts():
    pods = [pod("p1", ready=True), pod("p2", ready=True)]
    seen = describe_workload(deployment(ready=2), pods)
    assert seen.phase == Phase.READY
    assert seen.message == "ready 2/2"
    assert seen.replicas == (2, 2)
    assert [p["name"] for p in seen.pods] == ["p1", "p2"]
    assert set(seen.pods[0]) == {"name", "node", "phase", "ready", "restarts", "message"}


def test_unschedulable_gpu_pod_says_how_many_nodes_have_the_gpus():
    pods = [pod("p1", node=None, gpu=3, selector={"nvidia.com/gpu.product": "NVIDIA-A10"}, conditions=[UNSCHEDULABLE])]
    nodes = [gpu_node("gpu-a", "NVIDIA-A10", 2), gpu_node("gpu-c", "NVIDIA-A10", 2), gpu_node("gpu-b", "A100", 8)]
    seen = describe_workload(deployment(desired=1), pods, nodes)
    assert seen.phase == Phase.PENDING
    assert "waiting for a GPU: 0/2 nodes have 3 free nvidia.com/gpu (NVIDIA-A10)" in seen.message
    assert "Insufficient nvidia.com/gpu" in seen.message
    assert seen.pods[0]["phase"] == "Pending" and seen.pods[0]["node"] == ""


def test_crash_loop_is_failed_with_the_last_termination_message():
    container = {
        "name": "tritonserver",
        "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {
            "terminated": {"exitCode": 1, "reason": "Error", "message": "I1201 ...\nerror: creating server: model bad"}
        },
    }
    seen = describe_workload(deployment(desired=1), [pod("p1", container=container)])
    assert seen.phase == Phase.FAILED
    assert "restarted 4 times" in seen.message
    assert "exit code 1: error: creating server: model bad" in seen.message
    assert seen.pods[0]["restarts"] == 4


def test_oom_killed_names_the_memory_limit():
    container = {
        "name": "tritonserver",
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    }
    seen = describe_workload(deployment(desired=1), [pod("p1", container=container, memory="2Gi")])
    assert seen.phase == Phase.FAILED
    assert "memory limit (2Gi)" in seen.message and "Raise memory" in seen.message


def test_image_pull_error_points_at_the_image():
    container = {
        "name": "tritonserver",
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
    }
    seen = describe_workload(deployment(desired=1), [pod("p1", container=container)])
    assert seen.phase == Phase.FAILED
    assert "cannot pull image nvcr.io/nvidia/tritonserver:24.10-py3" in seen.message


def test_some_ready_is_degraded_with_the_reason_of_the_others():
    crashing = {"name": "tritonserver", "restartCount": 2, "lastState": {"terminated": {"exitCode": 1}}, "state": {}}
    pods = [pod("p1", ready=True), pod("p2", container=crashing)]
    seen = describe_workload(deployment(desired=2, ready=1), pods)
    assert seen.phase == Phase.DEGRADED
    assert seen.message.startswith("ready 1/2; p2: Triton keeps exiting")


def test_progress_deadline_exceeded_is_failed():
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}
    seen = describe_workload(deployment(desired=1, conditions=[stalled]), [pod("p1")])
    assert seen.phase == Phase.FAILED
    assert "no progress before its deadline" in seen.message


def test_rollout_not_observed_yet_serves_and_says_so():
    seen = describe_workload(deployment(desired=1, ready=1, generation=3, observed=2), [pod("p1", ready=True)])
    assert seen.phase == Phase.READY
    assert seen.message == "ready 1/1; rolling out a change"


def test_a_scale_up_with_pods_still_starting_is_ready_not_degraded():
    running = {"name": "tritonserver", "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}
    seen = describe_workload(deployment(desired=2, ready=1), [pod("p1", ready=True), pod("p2", container=running)])
    assert seen.phase == Phase.READY
    assert seen.message == "ready 1/2; 1 more starting"
    assert seen.replicas == (2, 1)


def test_absent_deployment_and_terminating_pods():
    assert describe_workload(None, []).phase == Phase.ABSENT
    terminating = pod("p1", ready=True)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert pod_summary(terminating)["message"] == "stopping"
    seen = describe_workload(deployment(desired=1, ready=1), [terminating, pod("p2", ready=True)])
    assert seen.phase == Phase.READY


def test_starting_pod_says_triton_is_loading():
    running = {"name": "tritonserver", "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}
    seen = describe_workload(deployment(desired=1), [pod("p1", container=running)])
    assert seen.phase == Phase.STARTING
    assert "loading the model" in seen.message

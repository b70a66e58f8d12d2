"""A Kubernetes deployment's state in words: pure functions from the objects the API server returned.

Input: the apps/v1 Deployment (as a dict, or None when absent), its Pods, and the cluster's Nodes (only needed to
word an unschedulable GPU request). Output: an `Observation` with our phase, a one-line message that says what is
happening and what to do, the desired/ready replica counts and one summary per pod.

Sources of the rules:
- Kubernetes "Deployments" > "Deployment status": a rollout is current when `status.observedGeneration` has
  reached `metadata.generation`; `Progressing=False` with reason `ProgressDeadlineExceeded` means it stalled.
- Kubernetes "Pod Lifecycle": the `PodScheduled` condition with reason `Unschedulable` carries the scheduler's
  reason ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, ..."); container states `waiting` with reasons
  `ErrImagePull`, `ImagePullBackOff`, `CrashLoopBackOff`, and `lastState.terminated` with reason `OOMKilled` or
  `Error`, its exit code and termination message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deployments.runtimes.base import Observation, Phase
from deployments.runtimes.kubernetes.manifests import GPU_PRODUCT_LABEL, GPU_RESOURCE

__all__ = ["describe_workload", "pod_summary"]

_IMAGE_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return {}


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == "tritonserver":
            return status
    return statuses[0] if statuses else {}


def _requested(pod: Mapping[str, Any]) -> dict[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return dict(((containers[0].get("resources") or {}).get("requests")) or {})


def _gpu_wording(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """ "0/2 nodes have 3 free nvidia.com/gpu" for a pod that asks for GPUs, counting the nodes that could hold it
    (the product its nodeSelector names, or every node offering the resource); None for a pod without GPUs."""
    requests = _requested(pod)
    resource = next((name for name in requests if name == GPU_RESOURCE or name.startswith("nvidia.com/mig-")), None)
    if resource is None:
        return None
    count = requests[resource]
    product = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    candidates = [
        node
        for node in nodes
        if (product is None or ((node.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL) == product)
        and ((node.get("status") or {}).get("allocatable") or {}).get(resource) not in (None, "0")
    ]
    what = f"{count} free {resource}" + (f" ({product})" if product else "")
    return f"0/{len(candidates)} nodes have {what}"


def pod_summary(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """`{"name", "node", "phase", "ready", "restarts", "message", "state"}` of one pod.

    `state` is one of `ready`, `starting`, `unschedulable`, `image`, `crashing`, `config`, `terminating`,
    `pending`; `message` says it in words (empty when ready).
    """
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    container = _container(pod)
    ready = _condition(pod, "Ready").get("status") == "True"
    restarts = int(container.get("restartCount") or 0)
    waiting = (container.get("state") or {}).get("waiting") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    scheduled = _condition(pod, "PodScheduled")
    summary = {
        "name": meta.get("name", ""),
        "node": spec.get("nodeName") or "",
        "phase": status.get("phase") or "Pending",
        "ready": ready,
        "restarts": restarts,
        "message": "",
        "state": "ready" if ready else "starting",
    }

    def say(state: str, message: str) -> dict[str, Any]:
        summary.update(state=state, message=message)
        return summary

    if meta.get("deletionTimestamp"):
        return say("terminating", "stopping")
    if ready:
        return summary
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        reason = scheduled.get("message") or "no node can run it"
        gpus = _gpu_wording(pod, nodes)
        if gpus is not None:
            return say(
                "unschedulable",
                f"waiting for a GPU: {gpus} (scheduler: {reason}). Ask for fewer GPUs per pod, another gpu.product "
                "or MIG profile, or free GPUs by stopping a deployment.",
            )
        return say(
            "unschedulable",
            f"waiting for room on a node (scheduler: {reason}). Lower the cpu/memory requests or add nodes.",
        )
    if waiting.get("reason") in _IMAGE_PULL:
        image = ((spec.get("containers") or [{}])[0]).get("image", "")
        return say(
            "image",
            f"cannot pull image {image} ({waiting.get('reason')}: {waiting.get('message') or 'no details'}). Check the "
            "cluster's Triton image and its image pull secrets.",
        )
    if waiting.get("reason") in _CONFIG_ERRORS:
        return say("config", f"the container cannot be created ({waiting.get('reason')}: {waiting.get('message')}).")
    if last or waiting.get("reason") == "CrashLoopBackOff":
        if last.get("reason") == "OOMKilled":
            limit = ((((spec.get("containers") or [{}])[0]).get("resources") or {}).get("limits") or {}).get("memory")
            return say(
                "crashing",
                f"Triton was killed for using more than its memory limit ({limit or 'unknown'}), restarted {restarts} "
                "times. Raise memory, or lower instance_count or max_batch_size.",
            )
        detail = (last.get("message") or "").strip().splitlines()
        text = f"exit code {last.get('exitCode', '?')}" + (f": {detail[-1]}" if detail else "")
        return say(
            "crashing",
            f"Triton keeps exiting (restarted {restarts} times; last run ended with {text}). Its log shows why.",
        )
    if not spec.get("nodeName"):
        return say("pending", "waiting to be scheduled")
    if container.get("state", {}).get("running"):
        return say("starting", "Triton is starting and loading the model")
    return say("starting", "the container is being created")


def describe_workload(
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] = (),
) -> Observation:
    """Our phase and one-line message for a Kubernetes deployment (see the module docstring).

    Phases: ABSENT (no Deployment object), READY (every desired pod ready and the rollout current, or some ready
    while the others are only starting: a scale-up), DEGRADED (some ready, others crashing, unschedulable or
    unable to pull their image), PENDING (none ready, some waiting for room or a GPU), FAILED (none ready and pods
    crash, cannot pull their image, or the rollout passed its progress deadline), STARTING (otherwise).
    """
    if deployment is None:
        return Observation(Phase.ABSENT, "The Kubernetes Deployment does not exist.")
    spec, status, meta = deployment.get("spec") or {}, deployment.get("status") or {}, deployment.get("metadata") or {}
    replicas = spec.get("replicas")
    desired = int(replicas if replicas is not None else 1)
    ready = int(status.get("readyReplicas") or 0)
    current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    summaries = sorted(
        (pod_summary(pod, nodes) for pod in pods),
        key=lambda pod: (pod["state"] == "terminating", not pod["ready"], pod["name"]),
    )
    live = [pod for pod in summaries if pod["state"] != "terminating"]
    ready = min(ready, sum(1 for pod in live if pod["ready"])) if live else 0
    pods_view = tuple(
        {key: pod[key] for key in ("name", "node", "phase", "ready", "restarts", "message")} for pod in summaries
    )
    counts = (desired, ready)
    troubled = [pod for pod in live if not pod["ready"]]
    by_state = {state: [pod for pod in troubled if pod["state"] == state] for state in {p["state"] for p in troubled}}

    def first_message(*states: str) -> str:
        for state in states:
            if by_state.get(state):
                pod = by_state[state][0]
                more = len(by_state[state]) - 1
                return f"{pod['name']}: {pod['message']}" + (f" (and {more} more pods)" if more > 0 else "")
        return ""

    progressing = _condition(deployment, "Progressing")
    stalled = progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded"
    problem = first_message("crashing", "image", "config", "unschedulable", "pending", "starting")
    if desired == 0:
        return Observation(Phase.READY, "scaled to 0 replicas", replicas=counts, pods=pods_view)
    if ready >= desired and current and not troubled:
        return Observation(Phase.READY, f"ready {ready}/{desired}", replicas=counts, pods=pods_view)
    if ready > 0:
        if not any(by_state.get(state) for state in ("crashing", "image", "config", "unschedulable")):
            # Pods on their way up (a scale-up or a rollout) while others serve: nothing is wrong.
            coming = len(troubled) or desired - ready
            what = "rolling out a change" if not current and not troubled else f"{coming} more starting"
            return Observation(Phase.READY, f"ready {ready}/{desired}; {what}", replicas=counts, pods=pods_view)
        return Observation(Phase.DEGRADED, f"ready {ready}/{desired}; {problem}", replicas=counts, pods=pods_view)
    if stalled:
        return Observation(
            Phase.FAILED,
            f"ready 0/{desired}; the rollout made no progress before its deadline ({progressing.get('message', '')})"
            + (f"; {problem}" if problem else ""),
            replicas=counts,
            pods=pods_view,
        )
    if any(by_state.get(state) for state in ("crashing", "image", "config")):
        return Observation(Phase.FAILED, f"ready 0/{desired}; {problem}", replicas=counts, pods=pods_view)
    if by_state.get("unschedulable"):
        return Observation(Phase.PENDING, f"ready 0/{desired}; {problem}", replicas=counts, pods=pods_view)
    return Observation(
        Phase.STARTING,
        f"ready 0/{desired}; " + (problem or "waiting for the pods to be created"),
        replicas=counts,
        pods=pods_view,
    )

"""The local test cluster behaves like a cluster: real scheduling on GPU nodes, Conch's Deployment manifest run by a
real Triton through the test kubelet, crash loops, image pull errors, pod logs, deletion, API server restarts."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from deployments.runtimes.kubernetes.manifests import (
    GpuRequest,
    TritonPodSpec,
    api_key_secret_manifest,
    deployment_manifest,
    object_name,
    s3_secret_manifest,
)
from deployments.runtimes.kubernetes.nodes import gpu_offers
from tests.s3_server import S3Server
from tritonserving.access import restricted_api_flags_for

pytestmark = pytest.mark.kube

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.08-py3"
ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""


def create(api_client: Any, manifest: dict[str, Any]) -> None:
    """POST a manifest exactly as built (the typed client would re-validate it), like `kubectl create -f`."""
    group = manifest["apiVersion"]
    prefix = "/api/v1" if group == "v1" else f"/apis/{group}"
    plural = {"Deployment": "deployments", "Secret": "secrets", "Pod": "pods"}[manifest["kind"]]
    namespace = manifest["metadata"].get("namespace", "conch")
    method, url, headers, body, _ = api_client.param_serialize(
        "POST",
        f"{prefix}/namespaces/{namespace}/{plural}",
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=manifest,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(method, url, header_params=headers, body=body, _request_timeout=10)
    response.read()
    assert response.status == 201, response.data


def pod_json(core: client.CoreV1Api, name: str, namespace: str = "conch") -> dict[str, Any]:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def pods_json(core: client.CoreV1Api, selector: str, namespace: str = "conch") -> list[dict[str, Any]]:
    listing = core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return json.loads(listing.data)["items"]


def wait_for(predicate: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def health(address: str, path: str = "/v2/health/live") -> int:
    with urllib.request.urlopen(f"http://{address}:8000{path}", timeout=2) as response:
        return response.status


def minimal_pod(name: str, *, image: str = TRITON_IMAGE, args: list[str], gpus: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "tritonserver", "image": image, "command": ["tritonserver"], "args": args}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 5}
    if gpus is not None:
        container["resources"] = {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "conch"}, "spec": spec}


@pytest.fixture(scope="module")
def model_repository(s3_server: S3Server, s3_client: Any) -> Iterator[str]:
    """A bucket holding a one-model Triton repository (a Python `echo` model); yields its `s3://http://…` URL."""
    bucket = f"conch-kube-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    s3_client.put_object(Bucket=bucket, Key="repo/echo/config.pbtxt", Body=ECHO_CONFIG.encode())
    s3_client.put_object(Bucket=bucket, Key="repo/echo/1/model.py", Body=ECHO_MODEL.encode())
    yield f"s3://{s3_server.endpoint_url}/{bucket}/repo"
    from tests.s3_server import empty_bucket

    empty_bucket(s3_client, bucket)
    s3_client.delete_bucket(Bucket=bucket)


@pytest.fixture
def triton_spec(kube_cluster, model_repository: str, s3_server: S3Server) -> Iterator[TritonPodSpec]:
    """A 1-GPU (NVIDIA-A10) TritonPodSpec on the S3 repository, with its Secrets created; removed afterwards."""
    spec = TritonPodSpec(
        deployment_id=int(uuid.uuid4().int % 100000),
        team="acme",
        name="echo",
        model_name="echo",
        namespace=kube_cluster.namespace,
        image=TRITON_IMAGE,
        repository=model_repository,
        s3_secret_name=f"s3-{uuid.uuid4().hex[:8]}",
        gpu=GpuRequest(count=1, product="NVIDIA-A10"),
        cpu="1",
        memory="1Gi",
    )
    with kube_cluster.api_client() as api_client:
        create(api_client, api_key_secret_manifest(spec, "k" * 64))
        s3_secret = s3_secret_manifest(
            spec,
            access_key_id=s3_server.access_key,
            secret_access_key=s3_server.secret_key,
            region=s3_server.region,
        )
        create(api_client, s3_secret)
        yield spec
        apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
        try:
            apps.delete_namespaced_deployment(object_name(spec), spec.namespace, propagation_policy="Foreground")
        except ApiException as exc:
            assert exc.status == 404
        wait_for(lambda: not pods_json(core, f"conch.io/deployment={spec.deployment_id}"), timeout_s=60, what="no pods")
        for name in (f"{object_name(spec)}-api-key", spec.s3_secret_name):
            core.delete_namespaced_secret(name, spec.namespace)


def test_nodes_offer_gpus_by_product_and_cpu_a_none(kube_cluster):
    with kube_cluster.api_client() as api_client:
        nodes = json.loads(client.CoreV1Api(api_client).list_node(_preload_content=False).data)["items"]

    by_name = {node["metadata"]["name"]: node for node in nodes}
    assert sorted(by_name) == ["cpu-a", "gpu-a", "gpu-b"]
    assert by_name["gpu-a"]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert by_name["gpu-a"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10"
    assert by_name["gpu-b"]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert by_name["gpu-b"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert not any(key.startswith("nvidia.com/") for key in by_name["cpu-a"]["status"]["allocatable"])
    assert by_name["gpu-a"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert "taints" not in by_name["cpu-a"]["spec"]
    assert [(o.product, o.resource, o.most_on_one_node) for o in gpu_offers(nodes)] == [
        ("NVIDIA-A10", "nvidia.com/gpu", 2),
        ("NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.10gb", 7),
    ]


def test_gpu_deployment_runs_triton_on_gpu_a_with_its_own_address(kube_cluster, triton_spec):
    with kube_cluster.api_client() as api_client:
        core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        started = time.monotonic()
        create(api_client, deployment_manifest(triton_spec))

        pod = wait_for(
            lambda: next(
                (p for p in pods_json(core, f"conch.io/deployment={triton_spec.deployment_id}") if is_ready(p)), None
            ),
            timeout_s=90,
            what="a Ready pod",
        )
        ready_s = time.monotonic() - started

        # The Deployment's status follows the pod's a moment later (the controller-manager's own sync).
        def read_deployment() -> dict[str, Any]:
            answer = apps.read_namespaced_deployment(object_name(triton_spec), "conch", _preload_content=False)
            return json.loads(answer.data)

        deployment = wait_for(
            lambda: (found := read_deployment())["status"].get("readyReplicas") == 1 and found,
            timeout_s=30,
            what="the Deployment's readyReplicas",
        )
        log = core.read_namespaced_pod_log(pod["metadata"]["name"], "conch", container="tritonserver", tail_lines=200)
        command_lines = [psutil.Process(pid).cmdline() for pid in kube_cluster.kubelet.running_processes()]

    address = pod["status"]["podIP"]
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert address.startswith("127.") and address != "127.0.0.1"
    assert pod["status"]["podIPs"] == [{"ip": address}]
    assert pod["status"]["phase"] == "Running"
    status = pod["status"]["containerStatuses"][0]
    assert (status["ready"], status["started"], status["restartCount"]) == (True, True, 0)
    assert set(status["state"]) == {"running"}
    assert health(address) == 200
    assert health(address, "/v2/models/echo/ready") == 200  # the model came from the S3 repository
    assert f"Started HTTPService at {address}:8000" in log
    assert deployment["status"].get("readyReplicas") == 1
    # `$(CONCH_TRITON_API_KEY)` in the args was expanded from the Secret, as a kubelet does.
    [argv] = [argv for argv in command_lines if f"--http-address={address}" in argv]
    assert set(restricted_api_flags_for("k" * 64)) <= set(argv)
    print(f"pod ready {ready_s:.1f} s after the Deployment was created")


def test_pod_asking_more_gpus_than_a_node_has_stays_pending_with_the_schedulers_reason(kube_cluster):
    name = f"greedy-{uuid.uuid4().hex[:6]}"
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        create(api_client, minimal_pod(name, args=["--model-repository=/nonexistent"], gpus="3"))
        try:
            condition = wait_for(
                lambda: next(
                    (c for c in pod_json(core, name)["status"].get("conditions", []) if c["type"] == "PodScheduled"),
                    None,
                ),
                timeout_s=30,
                what="the PodScheduled condition",
            )
        finally:
            core.delete_namespaced_pod(name, "conch", grace_period_seconds=0)

    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"].startswith("0/3 nodes are available")
    assert "Insufficient nvidia.com/gpu" in condition["message"]


def test_container_that_exits_at_once_ends_in_crash_loop_back_off_with_its_last_words(kube_cluster, tmp_path):
    name = f"crash-{uuid.uuid4().hex[:6]}"
    missing = tmp_path / "no-repository"
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        create(api_client, minimal_pod(name, args=[f"--model-repository={missing}", "--http-port=8000"]))
        try:
            status = wait_for(
                lambda: next(
                    (
                        s
                        for s in pod_json(core, name)["status"].get("containerStatuses", [])
                        if s["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"
                    ),
                    None,
                ),
                timeout_s=60,
                what="CrashLoopBackOff",
            )
            previous = core.read_namespaced_pod_log(name, "conch", container="tritonserver", previous=True)
        finally:
            core.delete_namespaced_pod(name, "conch")
            wait_for(lambda: not _exists(core, name), timeout_s=30, what="the pod to go")

    terminated = status["lastState"]["terminated"]
    assert status["restartCount"] >= 1
    assert status["ready"] is False
    assert terminated["reason"] == "Error"
    assert terminated["exitCode"] != 0
    assert str(missing) in terminated["message"]
    assert str(missing) in previous
    assert "back-off" in status["state"]["waiting"]["message"]


def test_image_that_is_not_triton_fails_to_pull(kube_cluster):
    name = f"pull-{uuid.uuid4().hex[:6]}"
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        create(api_client, minimal_pod(name, image="registry.example/nothing:1", args=[]))
        try:
            waiting = wait_for(
                lambda: next(
                    (
                        s["state"].get("waiting")
                        for s in pod_json(core, name)["status"].get("containerStatuses", [])
                        if s["state"].get("waiting", {}).get("reason") in ("ErrImagePull", "ImagePullBackOff")
                    ),
                    None,
                ),
                timeout_s=30,
                what="an image pull error",
            )
            phase = pod_json(core, name)["status"]["phase"]
        finally:
            core.delete_namespaced_pod(name, "conch")
            wait_for(lambda: not _exists(core, name), timeout_s=30, what="the pod to go")

    assert "registry.example/nothing:1" in waiting["message"]
    assert phase == "Pending"


def test_deleting_a_deployment_leaves_no_pods_and_no_triton(kube_cluster, triton_spec):
    with kube_cluster.api_client() as api_client:
        core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        others = set(kube_cluster.kubelet.running_processes())  # other tests' pods may share the cluster
        create(api_client, deployment_manifest(triton_spec))
        selector = f"conch.io/deployment={triton_spec.deployment_id}"
        pod = wait_for(
            lambda: next((p for p in pods_json(core, selector) if is_ready(p)), None), timeout_s=90, what="Ready"
        )
        pids = [pid for pid in kube_cluster.kubelet.running_processes() if pid not in others]
        assert pids

        apps.delete_namespaced_deployment(object_name(triton_spec), "conch", propagation_policy="Background")
        wait_for(lambda: not pods_json(core, selector), timeout_s=60, what="the pods to go")

    assert not set(pids) & set(kube_cluster.kubelet.running_processes())
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    with pytest.raises(OSError):
        health(pod["status"]["podIP"])


def test_api_server_down_and_back_the_kubelet_resumes_its_watch(kube_cluster):
    name = f"restart-{uuid.uuid4().hex[:6]}"
    kube_cluster.stop_apiserver()
    try:
        with kube_cluster.api_client() as api_client, pytest.raises(MaxRetryError):
            client.CoreV1Api(api_client).list_node(_request_timeout=2)
    finally:
        kube_cluster.start_apiserver()

    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        create(api_client, minimal_pod(name, image="registry.example/nothing:1", args=[]))
        try:
            wait_for(lambda: pod_json(core, name)["status"].get("containerStatuses"), timeout_s=30, what="status")
        finally:
            core.delete_namespaced_pod(name, "conch", grace_period_seconds=0)


def _exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "conch", _preload_content=False)
        return True
    except ApiException as exc:
        assert exc.status == 404
        return False


def test_container_failing_its_liveness_probe_is_killed_and_restarted(kube_cluster, tmp_path):
    name = f"unlive-{uuid.uuid4().hex[:6]}"
    pod = minimal_pod(name, args=[f"--model-repository={tmp_path}", "--model-control-mode=explicit"])
    container = pod["spec"]["containers"][0]
    container["ports"] = [{"name": "http", "containerPort": 8000}]
    container["livenessProbe"] = {
        "httpGet": {"path": "/v2/health/no-such-endpoint", "port": "http"},
        "periodSeconds": 1,
        "failureThreshold": 3,
    }
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        create(api_client, pod)
        try:
            status = wait_for(
                lambda: next(
                    (s for s in pod_json(core, name)["status"].get("containerStatuses", []) if s["restartCount"] >= 1),
                    None,
                ),
                timeout_s=60,
                what="a restart",
            )
        finally:
            core.delete_namespaced_pod(name, "conch")
            wait_for(lambda: not _exists(core, name), timeout_s=30, what="the pod to go")

    # Triton exits on the kubelet's SIGTERM: the run ended, it did not crash on its own.
    assert "terminated" in status["lastState"]
    assert status["lastState"]["terminated"]["finishedAt"]

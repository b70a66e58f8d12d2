"""TensorRT plans built by a Kubernetes Job on the GPU product they run on (`deployments.services.plans`).

The rules (shapes, manifests, trtexec's output format) are tested as pure functions. The Job's life runs on the test
cluster: a real API server, scheduler, controller-manager (its Job controller and garbage collector) and the test
kubelet, against a real S3 protocol server. No TensorRT runs on this machine: the kubelet runs the TensorRT image's
containers with a STAND-IN `trtexec` and serves plans with a STAND-IN `tensorrt` backend
(devtools/cluster/standins), both of which compute with onnxruntime on the ONNX model inside the stand-in plan.
"""

from __future__ import annotations

import time
from datetime import timedelta

import kubernetes_validate
import numpy as np
import onnx
import pytest
from django.test import Client
from kubernetes import client as k8s
from onnx import TensorProto, helper

from builds.model_config import BuildOptions
from conch.errors import InvalidInput
from deployments.models import Cluster, Deployment, TensorRTPlan
from deployments.runtimes import get_runtime
from deployments.runtimes.kubernetes.plan_job import (
    PlanJobSpec,
    TensorShape,
    plan_job_manifest,
    plan_request_secret_manifest,
    read_trtexec_outputs,
    shape_arguments,
)
from deployments.services import advance_tensorrt_plans, reconcile_deployments
from deployments.services.clusters import register_cluster, tensorrt_image_of
from deployments.services.plans import plan_config, plan_shapes
from deployments.services.records import usable_plan
from devtools.seed import add_constant, write_built_version
from models_registry.storage import get_object_store
from tests.deployments.conftest import close_edge_connections
from tritonserving.config import config_from_pbtxt

ADDER_CONFIG = """
name: "adder"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]
platform: "onnxruntime_onnx"
dynamic_batching {}
"""


# --- the rules, as pure functions -----------------------------------------------------------------------------


def test_a_batching_model_is_optimized_from_batch_1_to_its_max_batch_size_and_run_on_2():
    [shape] = plan_shapes(config_from_pbtxt(ADDER_CONFIG))
    assert (shape.minimum, shape.optimum, shape.maximum, shape.run) == ((1, 4), (4, 4), (4, 4), (2, 4))
    build, run = shape_arguments([shape])
    assert build == ["--minShapes='x':1x4", "--optShapes='x':4x4", "--maxShapes='x':4x4"]
    assert run == ["--shapes='x':2x4"]
    # a model without a dynamic axis needs no shape option at all
    fixed = TensorShape("image", (1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))
    assert shape_arguments([fixed]) == ([], [])


@pytest.mark.parametrize(
    ("tensor", "expected"),
    [
        ('input [{ name: "ids" data_type: TYPE_INT64 dims: [-1] }]', "Input 'ids' has a dynamic axis 1"),
        ('input [{ name: "text" data_type: TYPE_STRING dims: [1] }]', "Tensor 'text' is BYTES"),
        ('input [{ name: "x" data_type: TYPE_FP64 dims: [4] }]', "Tensor 'x' is FP64"),
    ],
)
def test_what_tensorrt_cannot_take_is_refused_naming_the_tensor(tensor, expected):
    text = f'name: "m" max_batch_size: 4 {tensor} output [{{ name: "y" data_type: TYPE_FP32 dims: [1] }}]'
    with pytest.raises(InvalidInput) as caught:
        plan_shapes(config_from_pbtxt(text))
    assert caught.value.field == "model_version" and expected in caught.value.detail


def test_the_plan_is_served_by_the_tensorrt_backend_with_the_same_tensors_and_batching():
    onnx_config = config_from_pbtxt(
        ADDER_CONFIG + 'optimization { execution_accelerators { cpu_execution_accelerator: [{ name: "openvino" }] } }'
    )
    config = plan_config(onnx_config)
    assert (config.platform, config.backend, config.default_model_filename) == (
        "tensorrt_plan",
        "tensorrt",
        "model.plan",
    )
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching")
    assert [t.name for t in config.input] == ["x"] and not config.HasField("optimization")


def test_the_job_and_its_secret_are_valid_kubernetes_objects_that_ask_one_gpu_of_the_product():
    spec = PlanJobSpec(
        plan_id=7,
        team="acme",
        namespace="conch",
        image="nvcr.io/nvidia/tensorrt:24.10-py3",
        gpu_product="NVIDIA-A10",
        shapes=plan_shapes(config_from_pbtxt(ADDER_CONFIG)),
        fp16=True,
    )
    job = plan_job_manifest(spec)
    kubernetes_validate.validate(job, "1.33", strict=True)
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A10"}
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert (
        container["command"][:2] == ["python3", "-c"]
        and container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    )
    assert pod["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    secret = plan_request_secret_manifest(spec, {"plan_url": "http://s3/x"}, owner_uid="u-1")
    kubernetes_validate.validate(secret, "1.33", strict=True)
    assert secret["metadata"]["ownerReferences"][0] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "conch-plan-7",
        "uid": "u-1",
    }
    with pytest.raises(InvalidInput) as caught:
        plan_job_manifest(PlanJobSpec(plan_id=1, team="a", namespace="n", image="i", gpu_product="", shapes=()))
    assert caught.value.field == "gpu_product"


def test_trtexec_outputs_are_read_in_the_models_datatypes_with_non_finite_values():
    text = '[\n  { "name" : "y"\n  , "dimensions" : "2x2"\n  , "values" : [ 1.5, nan, -inf, 4 ]\n  }\n]\n'
    [(name, array)] = read_trtexec_outputs(text, {"y": "FP32"}).items()
    assert name == "y" and array.dtype == np.float32 and array.shape == (2, 2)
    assert array[0, 0] == 1.5 and np.isnan(array[0, 1]) and np.isneginf(array[1, 0])
    with pytest.raises(InvalidInput, match="holds 3 values for dimensions 2x2"):
        read_trtexec_outputs('[{"name": "y", "dimensions": "2x2", "values": [1, 2, 3]}]', {"y": "FP32"})


def test_the_plans_comparison_reads_back_the_inputs_its_job_ran_and_refuses_gone_or_resized_ones(settings, tmp_path):
    from types import SimpleNamespace

    from conch.errors import NotFound
    from deployments.services.plans import _input_key, _PlanRun, _stored_inputs
    from tritonserving.config import ModelConfig

    settings.CONCH_STORAGE_URL = f"file://{tmp_path}"
    store = get_object_store()
    plan = SimpleNamespace(pk=7)
    run = _PlanRun(config=ModelConfig(), shapes=(), inputs={"x": np.zeros((2, 3), np.float32)})
    # given the bytes the Job was given for x, as _start_job wrote them
    sent = np.arange(6, dtype=np.float32).reshape(2, 3)
    store.put_bytes(_input_key(7, 0), sent.tobytes())
    # then they come back in the run's datatype and shape
    (back,) = _stored_inputs(plan, run).values()
    assert back.dtype == np.float32 and back.tolist() == sent.tolist()
    # and an input of another size, or one gone, is refused
    store.put_bytes(_input_key(7, 0), sent.tobytes()[:8])
    with pytest.raises(InvalidInput, match="the stored input 'x' holds 8 bytes, not the 24 of its run"):
        _stored_inputs(plan, run)
    store.delete(_input_key(7, 0))
    with pytest.raises(NotFound):
        _stored_inputs(plan, run)


def test_the_tensorrt_image_is_the_one_of_the_clusters_triton_release():
    assert tensorrt_image_of("nvcr.io/nvidia/tritonserver:24.10-py3") == "nvcr.io/nvidia/tensorrt:24.10-py3"
    assert (
        tensorrt_image_of("mirror.local:5000/nvidia/tritonserver:25.01-py3")
        == "mirror.local:5000/nvidia/tensorrt:25.01-py3"
    )
    assert tensorrt_image_of("nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3") is None
    assert tensorrt_image_of("example.com/triton:latest") is None


# --- the Job's life on the test cluster -----------------------------------------------------------------------


@pytest.fixture
def plan_env(k8s_env):
    """The test cluster registered as `local`, storage on the test S3 server (tests/deployments/conftest.py). Once
    the test is over, its deployments are deleted and their containers waited for, so the next test on the shared
    cluster starts with the kubelet running what it ran before."""
    before = set(k8s_env.kubelet.running_processes())
    yield k8s_env
    close_edge_connections()  # else each pod's Triton waits 30 s for them
    runtime = get_runtime("kubernetes")
    for workload in runtime.list_owned():
        runtime.delete(workload.state)
    deadline = time.monotonic() + 60
    while set(k8s_env.kubelet.running_processes()) - before and time.monotonic() < deadline:
        time.sleep(0.2)


def _ask(caller, capture, version, **extra):
    body = {"model_version": version.pk, "cluster": "local", "gpu_product": "NVIDIA-A10", **extra}
    with capture(execute=True):
        return caller.client.post("/api/v1/tensorrt-plans/", body, format="json")


def _until_over(caller, plan_id: int, *, timeout_s: float = 90.0, now=None) -> dict:
    """Look at the plans as beat does (once a second) until this one is over; return it as the API shows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        advance_tensorrt_plans(now=now)
        seen = caller.client.get(f"/api/v1/tensorrt-plans/{plan_id}/").json()
        if seen["status"] in ("succeeded", "failed"):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {seen['status']}: {seen['message']}")
        time.sleep(1.0)


def _left_behind(kube_cluster, plan_id: int) -> dict[str, list[str]]:
    api = kube_cluster.api_client()
    selector = f"conch.io/plan={plan_id}"
    jobs = k8s.BatchV1Api(api).list_namespaced_job("conch", label_selector=selector).items
    secrets = k8s.CoreV1Api(api).list_namespaced_secret("conch", label_selector=selector).items
    pods = k8s.CoreV1Api(api).list_namespaced_pod("conch", label_selector=selector).items
    return {
        "jobs": [j.metadata.name for j in jobs],
        "secrets": [s.metadata.name for s in secrets],
        "pods": [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None],
    }


def _wait_for_nothing_left(kube_cluster, plan_id: int, timeout_s: float = 30.0) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout_s
    while (left := _left_behind(kube_cluster, plan_id)) != {"jobs": [], "secrets": [], "pods": []}:
        if time.monotonic() > deadline:
            return left
        time.sleep(0.5)
    return left


def _store_keys(plan_id: int) -> list[str]:
    return get_object_store().list_keys(f"plans/{plan_id}/")


@pytest.mark.kube
@pytest.mark.e2e
def test_a_plan_built_by_a_job_on_the_gpu_product_is_compared_stored_and_served_there(
    alice, plan_env, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(
        alice.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0), BuildOptions(max_batch_size=4)
    )
    # when a plan for the cluster's A10s is asked for
    asked = _ask(alice, capture, version)
    assert asked.status_code == 202, asked.content
    plan = asked.json()
    assert plan["image"] == "nvcr.io/nvidia/tensorrt:24.10-py3" and plan["gpu_product"] == "NVIDIA-A10"
    # then its Job runs (the stand-in trtexec) on the A10 node, and the plan is compared and stored
    done = _until_over(alice, plan["id"])
    assert done["status"] == "succeeded", done["message"]
    [comparison] = done["report"]["comparison"]
    assert comparison["output"] == "y" and comparison["ok"] and comparison["max_abs_diff"] == 0.0
    assert done["report"]["shapes"] == [{"name": "x", "min": [1, 4], "opt": [4, 4], "max": [4, 4], "run": [2, 4]}]
    assert done["tensorrt_version"] == "0.0.0"  # what the stand-in says it is
    assert "within tolerance of the ONNX model" in done["message"]
    keys = _store_keys(plan["id"])
    assert keys == [
        f"plans/{plan['id']}/repository/adder/1/model.plan",
        f"plans/{plan['id']}/repository/adder/config.pbtxt",
    ]
    assert done["plan_bytes"] > 0
    # and nothing of the Job is left on the cluster
    assert _wait_for_nothing_left(plan_env, plan["id"]) == {"jobs": [], "secrets": [], "pods": []}
    # and the model page lists it
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(f"/models/{version.model_id}/").content.decode()
    assert 'data-testid="plans-1"' in page and "NVIDIA-A10" in page and "succeeded" in page
    # and the same plan again is refused while this one exists
    again = _ask(alice, capture, version)
    assert again.status_code == 409 and again.json()["field"] == "gpu_product"

    # when the version is deployed on the A10s, the deployment serves the plan (through the stand-in backend)
    body = {
        "name": "fast",
        "team": "acme",
        "model_version": version.pk,
        "runtime": "kubernetes",
        "cluster": "local",
        "cpu": "250m",
        "memory": "1Gi",
        "gpu": {"product": "NVIDIA-A10", "count": 1},
    }
    with capture(execute=True):
        created = alice.client.post("/api/v1/deployments/", body, format="json")
    assert created.status_code == 201, created.content
    deployment = created.json()
    assert deployment["tensorrt_plan"] == plan["id"] and 'platform: "tensorrt_plan"' in deployment["config_pbtxt"]
    deadline = time.monotonic() + 120
    while (seen := alice.client.get(f"/api/v1/deployments/{deployment['id']}/").json())["status"] != "ready":
        assert time.monotonic() < deadline, (seen["status"], seen["status_message"], seen["log_tail"])
        with capture(execute=True):
            reconcile_deployments()
        time.sleep(1.0)
    request = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.5, 0.5, 0.5]}]}
    answer = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer/", request, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [1.5, 1.5, 1.5, 1.5]
    # and the plan cannot be deleted while it serves
    refused = alice.client.delete(f"/api/v1/tensorrt-plans/{plan['id']}/")
    assert refused.status_code == 409 and "fast" in refused.json()["detail"]
    # and a deployment without that GPU product, or on another one, keeps the ONNX model
    cluster = Cluster.objects.get(name="local")
    assert usable_plan(version, cluster, None) is None
    assert usable_plan(version, cluster, "NVIDIA-A100-SXM4-40GB") is None
    assert usable_plan(version, cluster, "NVIDIA-A10").pk == plan["id"]
    with capture(execute=True):
        alice.client.delete(f"/api/v1/deployments/{deployment['id']}/")
    assert Deployment.objects.get(pk=deployment["id"]).tensorrt_plan_id == plan["id"]


def _scaler(path):
    """y = (x - 0) * 2 with ai.onnx.ml's Scaler: an operator TensorRT's ONNX parser has no importer for."""
    graph = helper.make_graph(
        [helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=[0.0], scale=[2.0])],
        "scaler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.kube
@pytest.mark.e2e
def test_a_plan_fails_saying_what_to_do_when_trtexec_fails_the_image_cannot_be_pulled_or_no_gpu_frees_up(
    alice, plan_env, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    capture = django_capture_on_commit_callbacks
    # when trtexec cannot parse an operator, the plan fails with its words and what to do
    scaler = write_built_version(alice.team, "scaler", _scaler(tmp_path / "scaler.onnx"))
    scaler.builds.update(config_pbtxt=ADDER_CONFIG.replace('"adder"', '"scaler"'))
    plan = _ask(alice, capture, scaler).json()
    failed = _until_over(alice, plan["id"])
    assert failed["status"] == "failed"
    assert "trtexec could not make the plan (exit status 1)" in failed["message"]
    assert "No importer registered for op: Scaler" in failed["message"] and "serve the ONNX model" in failed["message"]
    assert _wait_for_nothing_left(plan_env, plan["id"]) == {"jobs": [], "secrets": [], "pods": []}
    assert _store_keys(plan["id"]) == []
    # and a failed plan may be asked for again (it is a new plan)
    assert _ask(alice, capture, scaler).status_code == 202

    # when the nodes cannot pull the TensorRT image, the plan fails naming the image and what to do
    adder = write_built_version(
        alice.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0), BuildOptions(max_batch_size=4)
    )
    register_cluster(
        name="local",
        kubeconfig=plan_env.kubeconfig_path.read_text(),
        namespace="conch",
        triton_image="registry.invalid/nvidia/tritonserver:24.10-py3",
    )
    plan = _ask(alice, capture, adder).json()
    failed = _until_over(alice, plan["id"])
    assert failed["status"] == "failed"
    assert "cannot pull registry.invalid/nvidia/tensorrt:24.10-py3 (ImagePullBackOff" in failed["message"]
    assert "--image-pull-secret" in failed["message"]
    assert _wait_for_nothing_left(plan_env, plan["id"]) == {"jobs": [], "secrets": [], "pods": []}
    assert _store_keys(plan["id"]) == []

    # when every A10 is taken, the plan waits saying so, then fails once the wait is over
    register_cluster(name="local", kubeconfig=plan_env.kubeconfig_path.read_text(), namespace="conch")
    core = k8s.CoreV1Api(plan_env.api_client())
    holder = {
        "metadata": {"name": "holds-the-a10s", "labels": {"test": "plans"}},
        "spec": {
            "nodeName": "gpu-a",
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "holder",
                    "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
                    "command": ["sleep", "600"],
                    "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }
    core.create_namespaced_pod("conch", holder)
    try:
        plan = _ask(alice, capture, adder, fp16=True).json()
        advance_tensorrt_plans()
        deadline = time.monotonic() + 30
        while "Insufficient nvidia.com/gpu" not in (seen := TensorRTPlan.objects.get(pk=plan["id"])).message:
            assert time.monotonic() < deadline, seen.message
            time.sleep(0.5)
            advance_tensorrt_plans()
        assert seen.status == "building" and seen.message.startswith("waiting for a free NVIDIA-A10 GPU: 0/3 nodes")
        later = seen.started_at + timedelta(seconds=settings.CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS + 1)
        failed = _until_over(alice, plan["id"], now=later)
        assert failed["status"] == "failed"
        assert "No NVIDIA-A10 node of local had a free GPU within 15 minutes" in failed["message"]
        assert "Insufficient nvidia.com/gpu" in failed["message"] and "stop a deployment" in failed["message"]
        assert _wait_for_nothing_left(plan_env, plan["id"]) == {"jobs": [], "secrets": [], "pods": []}
    finally:
        core.delete_namespaced_pod("holds-the-a10s", "conch", grace_period_seconds=0)


@pytest.mark.kube
def test_plans_are_refused_for_what_cannot_become_one(
    alice, bob, plan_env, tmp_path, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(
        alice.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0), BuildOptions(max_batch_size=4)
    )
    # a GPU product no node offers whole GPUs of (the A100 node offers MIG slices only)
    refused = _ask(alice, capture, version, gpu_product="NVIDIA-A100-SXM4-40GB")
    assert refused.status_code == 400 and refused.json()["field"] == "gpu_product"
    assert "it offers NVIDIA-A10" in refused.json()["detail"]
    # the console's form says the same on the model page
    browser = Client()
    browser.force_login(alice.user)
    page = browser.post(
        f"/models/{version.model_id}/versions/{version.pk}/optimize/",
        {"cluster": "local", "gpu_product": "NVIDIA-T4"},
    )
    assert page.status_code == 400 and "offers whole GPUs of product &#x27;NVIDIA-T4&#x27;" in page.content.decode()
    # a dynamic axis besides the batch axis
    version.builds.update(config_pbtxt=ADDER_CONFIG.replace("dims: [4] }]\noutput", "dims: [-1] }]\noutput"))
    refused = _ask(alice, capture, version)
    assert refused.status_code == 400 and refused.json()["field"] == "model_version"
    assert "Input 'x' has a dynamic axis 1" in refused.json()["detail"]
    # an unknown cluster, another team's version
    version.builds.update(config_pbtxt=ADDER_CONFIG)
    assert _ask(alice, capture, version, cluster="nope").status_code == 404
    assert _ask(bob, capture, version).status_code == 404
    assert TensorRTPlan.objects.count() == 0

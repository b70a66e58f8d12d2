"""The Kubernetes runtime on a real API server, scheduler and controller-manager, with pods run as real local
Tritons by the test kubelet (tests/kube), reading their model repository from a real S3 protocol server.

Everything goes through Conch's REST API and services; reconcile is called the way beat calls it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from kubernetes import client as k8s

from builds.services import served_repository_prefix
from conch.errors import Unavailable
from deployments.models import Deployment
from deployments.observe import scrape_deployment
from deployments.runtimes import get_runtime
from deployments.runtimes.kubernetes import api as kube_api
from deployments.services import reconcile_deployments
from deployments.services.clusters import register_cluster
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tenancy.models import AuditEntry
from tenancy.quotas import set_quota
from tests import real_models
from tests.deployments.conftest import write_adder_versions, write_built_version
from tritonserving.client import TritonClient

pytestmark = [pytest.mark.kube, pytest.mark.e2e]


ADDER_REQUEST = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.5, 0.5, 0.5]}]}


def _create(caller, capture, version, **extra) -> dict:
    body = {
        "name": "web",
        "team": caller.team.slug,
        "model_version": version.pk,
        "runtime": "kubernetes",
        "cluster": "local",
        "cpu": "250m",
        "memory": "1Gi",
        **extra,
    }
    with capture(execute=True):
        response = caller.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _reconcile_until(caller, deployment_id: int, done, *, timeout_s: float = 120.0, capture=None) -> dict:
    """Run reconcile ticks (as beat would, every second) until `done(deployment)`; return the deployment."""
    deadline = time.monotonic() + timeout_s
    while True:
        if capture is not None:
            with capture(execute=True):
                reconcile_deployments()
        else:
            reconcile_deployments()
        seen = caller.client.get(f"/api/v1/deployments/{deployment_id}/").json()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {seen['status']}: {seen['status_message']} {seen['pods']}")
        time.sleep(1.0)


def _pod_uids(kube_cluster, deployment_id: int) -> dict[str, str]:
    core = k8s.CoreV1Api(kube_cluster.api_client())
    pods = core.list_namespaced_pod("conch", label_selector=f"conch.io/deployment={deployment_id}").items
    return {pod.metadata.name: pod.metadata.uid for pod in pods if pod.metadata.deletion_timestamp is None}


def test_two_replicas_serve_scale_to_three_hot_update_under_load_and_delete_leaves_nothing(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    capture = django_capture_on_commit_callbacks
    v1, v2 = write_adder_versions(alice.team, tmp_path)
    # when a kubernetes deployment with 2 replicas is created
    created = _create(alice, capture, v1, replicas=2)
    assert created["runtime"] == "kubernetes" and created["cluster"] == "local"
    ready = _reconcile_until(
        alice, created["id"], lambda d: d["replicas"] == {"desired": 2, "ready": 2}, capture=capture
    )
    # then both pods run Triton and are ready, in words too
    assert ready["replicas"] == {"desired": 2, "ready": 2}
    assert ready["status_message"] == "ready 2/2"
    assert len(ready["pods"]) == 2 and all(p["ready"] and p["node"] for p in ready["pods"])
    # and inferences through Conch are answered by the pods, in turn
    for _ in range(4):
        answer = alice.client.post(f"/api/v1/deployments/{created['id']}/infer/", ADDER_REQUEST, format="json")
        assert answer.status_code == 200, answer.content
        assert answer.json()["outputs"][0]["data"] == [1.5, 1.5, 1.5, 1.5]
    # a pod listed at an address where nothing answers (a stale endpoint) costs no request: it goes to the other
    core = k8s.CoreV1Api(k8s_env.api_client())
    stale = core.list_namespaced_pod("conch", label_selector=f"conch.io/deployment={created['id']}").items[0]
    real_ip = stale.status.pod_ip
    core.patch_namespaced_pod_status(stale.metadata.name, "conch", {"status": {"podIP": "127.0.0.250"}})
    time.sleep(2.1)  # past the routing cache
    for _ in range(4):
        answer = alice.client.post(f"/api/v1/deployments/{created['id']}/infer/", ADDER_REQUEST, format="json")
        assert answer.status_code == 200, answer.content
    core.patch_namespaced_pod_status(stale.metadata.name, "conch", {"status": {"podIP": real_ip}})
    time.sleep(2.1)
    # and each pod's metrics are scraped, summed per deployment and broken down by pod
    row = Deployment.objects.get(pk=created["id"])
    assert scrape_deployment(deployment=row) >= 2
    time.sleep(1.1)
    assert scrape_deployment(deployment=row) >= 2
    summary = alice.client.get(f"/api/v1/deployments/{created['id']}/metrics/?window=60").json()
    assert {server["server"] for server in summary["servers"]} == {pod["name"] for pod in ready["pods"]}
    # scaling to 3 adds a pod and keeps the two
    before = _pod_uids(k8s_env, created["id"])
    with capture(execute=True):
        patched = alice.client.patch(f"/api/v1/deployments/{created['id']}/", {"replicas": 3}, format="json")
    assert patched.status_code == 202, patched.content
    scaled = _reconcile_until(
        alice,
        created["id"],
        lambda d: d["replicas"] == {"desired": 3, "ready": 3} and d["status"] == "ready",
        capture=capture,
    )
    assert len(scaled["pods"]) == 3
    assert set(before.items()) <= set(_pod_uids(k8s_env, created["id"]).items())
    # when version 2 is swapped in while a client sends inferences to every pod in turn
    row.refresh_from_db()
    uids, processes = _pod_uids(k8s_env, created["id"]), sorted(k8s_env.kubelet.running_processes())
    runtime = get_runtime("kubernetes")
    answers: list[object] = []
    stop = threading.Event()

    def keep_inferring() -> None:
        x = np.full((1, 4), 0.5, dtype=np.float32)
        while not stop.is_set():
            try:
                with TritonClient(runtime.internal_url(row.runtime_state), timeout_s=30) as client:
                    answers.append(float(client.infer_numpy("adder", {"x": x})["y"][0, 0]))
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                answers.append(f"{type(exc).__name__}: {exc}")

    sender = threading.Thread(target=keep_inferring, daemon=True)
    sender.start()
    time.sleep(0.5)
    with capture(execute=True):
        updated = alice.client.patch(f"/api/v1/deployments/{created['id']}/", {"model_version": v2.pk}, format="json")
    time.sleep(0.5)
    stop.set()
    sender.join(timeout=60)
    # then no request failed, every pod serves version 2, and no pod restarted
    assert updated.status_code == 202, updated.content
    failures = [a for a in answers if not isinstance(a, float)]
    assert failures == [] and len(answers) > 10
    assert answers[0] == 1.5 and answers[-1] == 2.5
    shown = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert (shown["update_status"], shown["model_version"]) == ("succeeded", v2.pk), shown["update_error"]
    assert _pod_uids(k8s_env, created["id"]) == uids
    assert sorted(k8s_env.kubelet.running_processes()) == processes
    for server in runtime.servers(row.runtime_state):
        with TritonClient(server.http_url, timeout_s=10, api_key=server.api_key) as admin:
            assert admin.ready_versions("adder") == {2}
    # when it is deleted, nothing with its labels is left in the namespace
    with capture(execute=True):
        assert alice.client.delete(f"/api/v1/deployments/{created['id']}/").status_code == 202
    deadline = time.monotonic() + 60
    while (left := runtime.leftovers(row.runtime_state)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == {}
    stopped = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert (stopped["status"], stopped["status_message"], stopped["pods"]) == ("stopped", "stopped", [])
    assert stopped["replicas"] == {"desired": 0, "ready": 0}


def test_more_gpus_than_a_node_has_is_refused_and_unschedulable_is_worded(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    body = {"name": "big", "team": "acme", "model_version": version.pk, "runtime": "kubernetes", "cluster": "local"}
    # a request no node could ever hold is refused at once, naming the field
    for gpu, field in (
        ({"product": "NVIDIA-A10", "count": 3}, "gpu.count"),
        ({"product": "NVIDIA-H100", "count": 1}, "gpu.product"),
        ({"count": 0.5}, "gpu.count"),
        ({"mig_profile": "3g.40gb"}, "gpu.mig_profile"),
    ):
        response = alice.client.post("/api/v1/deployments/", {**body, "gpu": gpu}, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["field"] == field
    bad = alice.client.post(
        "/api/v1/deployments/",
        {**body, "autoscaling": {"min_replicas": 3, "max_replicas": 2, "target_queue_time_us": 5}},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["field"] == "autoscaling.min_replicas"
    # 2 pods of 2 A10 each fit on no node together with a third: the third waits, in words
    created = _create(alice, capture, version, name="gpus", replicas=2, gpu={"product": "NVIDIA-A10", "count": 2})
    seen = _reconcile_until(
        alice, created["id"], lambda d: any("waiting for a GPU" in p["message"] for p in d["pods"]), capture=capture
    )
    assert seen["status"] in ("degraded", "pending")
    assert "0/1 nodes have 2 free nvidia.com/gpu (NVIDIA-A10)" in seen["status_message"]
    assert "Insufficient nvidia.com/gpu" in seen["status_message"]


def test_a_triton_that_exits_at_once_is_failed_with_its_termination_message(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    # a model file Triton cannot read: --load-model fails and Triton exits at once, again after every restart
    from models_registry.storage import get_object_store

    get_object_store().put_bytes(
        f"{served_repository_prefix(version)}/classifier/{version.number}/model.onnx", b"not onnx"
    )
    created = _create(alice, capture, version, name="crash", replicas=1)
    seen = _reconcile_until(alice, created["id"], lambda d: d["status"] == "failed", capture=capture, timeout_s=90)
    assert "Triton keeps exiting" in seen["status_message"] or "exit code" in seen["status_message"]
    assert seen["pods"][0]["restarts"] >= 1
    assert any("classifier" in line for line in seen["log_tail"]), seen["log_tail"]
    # and the audit log has the change to failed that reconcile observed
    audited = AuditEntry.objects.filter(action="deployment.failed", object_id=str(created["id"])).first()
    assert audited is not None and audited.after["status"] == "failed" and audited.before["status"] != "failed"
    assert (audited.actor, audited.team_slug) == ("system", "acme")


def test_api_server_down_and_back_recovers_without_duplicates(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    created = _create(alice, capture, version, name="steady", replicas=1)
    _reconcile_until(alice, created["id"], lambda d: d["status"] == "ready", capture=capture)
    k8s_env.stop_apiserver()
    try:
        with capture(execute=True):
            counts = reconcile_deployments()
        seen = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
        # unknown is not failure: the status stays, the message says why
        assert seen["status"] == "ready"
        assert "cannot be reached" in seen["status_message"] or "answered" in seen["status_message"]
        assert counts["failed"] == 0
    finally:
        k8s_env.start_apiserver()
    seen = _reconcile_until(alice, created["id"], lambda d: d["status_message"] == "ready 1/1", capture=capture)
    assert seen["status"] == "ready"
    apps = k8s.AppsV1Api(k8s_env.api_client())
    found = apps.list_namespaced_deployment("conch", label_selector=f"conch.io/deployment={created['id']}").items
    assert len(found) == 1


@pytest.fixture
def conflicting_proxy(k8s_env):
    """An HTTP proxy in front of the test API server that answers the first PATCH of a Deployment with a real
    409 Conflict Status (as an API server does when an object changed under a writer), then forwards everything."""
    import base64
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import urllib3

    config = json.loads(open(k8s_env.kubeconfig_path).read())
    upstream = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"]["token"]
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
    pool = urllib3.PoolManager(ca_cert_data=ca)
    seen = {"conflicts": 0, "patches": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PATCH" and "/deployments/" in self.path:
                seen["patches"] += 1
                if not seen["conflicts"]:
                    seen["conflicts"] += 1
                    status = {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": "Operation cannot be fulfilled: the object has been modified",
                        "reason": "Conflict",
                        "code": 409,
                    }
                    data = json.dumps(status).encode()
                    self.send_response(409)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            answer = pool.request(self.command, upstream + self.path, body=body or None, headers=headers)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(answer.data)))
            self.end_headers()
            self.wfile.write(answer.data)

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 - http.server's names

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "admin"}}],
        "current-context": "proxy",
    }
    register_cluster(name="flaky", namespace="conch", kubeconfig=json.dumps(kubeconfig))
    yield seen
    server.shutdown()


def test_apply_retries_a_conflict_and_takes_over_a_field_changed_by_another_manager(alice, k8s_env, conflicting_proxy):
    from deployments.services import create_deployment, deployment_spec

    version = write_built_version(alice.team, "classifier", real_models.classifier())
    deployment = create_deployment(
        user=alice.user,
        request=DeploymentRequest(
            team_slug="acme",
            name="conflict",
            model_version_id=version.pk,
            placement=PlacementRequest(runtime="kubernetes", cluster="flaky", replicas=1, cpu="100m", memory="512Mi"),
        ),
    )
    runtime = get_runtime("kubernetes")
    spec = deployment_spec(deployment)
    # when the first apply of the Deployment meets a 409, it is retried and succeeds
    state = runtime.apply(spec, {})
    assert conflicting_proxy["conflicts"] == 1 and conflicting_proxy["patches"] >= 2
    apps = k8s.AppsV1Api(k8s_env.api_client())
    assert apps.read_namespaced_deployment(state["name"], "conch").spec.replicas == 1
    # someone else (another field manager) changes a field Conch owns; applying again takes it back, idempotently
    apps.patch_namespaced_deployment(
        state["name"], "conch", {"spec": {"replicas": 5}}, _content_type="application/strategic-merge-patch+json"
    )
    assert runtime.apply(spec, state) == state
    assert apps.read_namespaced_deployment(state["name"], "conch").spec.replicas == 1
    runtime.delete(state)


def test_a_4xx_from_the_api_server_fails_with_its_message(alice, k8s_env):
    from conch.errors import InvalidInput

    api = kube_api.cluster_api(get_runtime("kubernetes").directory.get("local"))
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "Not_A_Valid_Name", "namespace": "conch"},
        "stringData": {"a": "b"},
    }
    with pytest.raises(InvalidInput) as refused:
        api.apply(manifest)
    assert "Not_A_Valid_Name" in refused.value.detail


def test_unreachable_cluster_is_unavailable_not_a_crash(alice, k8s_env):
    runtime = get_runtime("kubernetes")
    k8s_env.stop_apiserver()
    try:
        with pytest.raises(Unavailable):
            runtime.servers({"cluster": "local", "namespace": "conch", "name": "x", "deployment_id": 1})
    finally:
        k8s_env.start_apiserver()


def _listed(client, api_version: str, kind: str, selector: str) -> list[dict]:
    """Objects of a kind the typed client no longer has (v2beta2, v1beta1), through the dynamic client."""
    from kubernetes.dynamic import DynamicClient

    resource = DynamicClient(client).resources.get(api_version=api_version, kind=kind)
    return resource.get(namespace="conch", label_selector=selector).to_dict()["items"]


def test_autoscaling_applies_the_servers_hpa_and_pdb_versions_and_fixed_replicas_remove_them(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    scaling = {"min_replicas": 2, "max_replicas": 4, "target_queue_time_us": 2000}
    created = _create(alice, capture, version, name="auto", autoscaling=scaling)
    assert created["autoscaling"] == scaling
    selector = f"conch.io/deployment={created['id']}"
    client = k8s_env.api_client()
    # the 1.20 test server offers autoscaling/v2beta2 and policy/v1beta1: discovery picks those
    hpas = _listed(client, "autoscaling/v2beta2", "HorizontalPodAutoscaler", selector)
    assert [(h["spec"]["minReplicas"], h["spec"]["maxReplicas"]) for h in hpas] == [(2, 4)]
    assert hpas[0]["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton_queue_time_per_request_us"
    assert len(_listed(client, "policy/v1beta1", "PodDisruptionBudget", selector)) == 1
    # bad bounds in a PATCH name the field; fixed replicas replace autoscaling and remove the HPA and the PDB
    bad = alice.client.patch(
        f"/api/v1/deployments/{created['id']}/",
        {"autoscaling": {"min_replicas": 0, "max_replicas": 2, "target_queue_time_us": 5}},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["field"] == "autoscaling.min_replicas"
    with capture(execute=True):
        patched = alice.client.patch(f"/api/v1/deployments/{created['id']}/", {"replicas": 1}, format="json")
    assert patched.status_code == 202, patched.content
    assert patched.json()["autoscaling"] is None
    assert _listed(client, "autoscaling/v2beta2", "HorizontalPodAutoscaler", selector) == []
    assert _listed(client, "policy/v1beta1", "PodDisruptionBudget", selector) == []
    apps = k8s.AppsV1Api(client)
    assert apps.list_namespaced_deployment("conch", label_selector=selector).items[0].spec.replicas == 1
    with capture(execute=True):
        alice.client.delete(f"/api/v1/deployments/{created['id']}/")


def test_clusters_api_shows_gpu_offers_and_the_triton_release_check(alice, k8s_env):
    listed = alice.client.get("/api/v1/clusters/")
    assert listed.status_code == 200
    (local,) = [c for c in listed.json()["results"] if c["name"] == "local"]
    assert local["namespace"] == "conch"
    assert local["triton_release"] == local["verified_triton_release"] == "2.51"
    assert local["image_mismatch"] == ""
    offers = {(o["product"], o["resource"]): o for o in local["gpu_offers"]}
    assert offers[("NVIDIA-A10", "nvidia.com/gpu")]["most_on_one_node"] == 2
    assert offers[("NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.10gb")]["mig_profile"] == "1g.10gb"
    assert "kubeconfig" not in str(listed.json())
    assert alice.client.get("/api/v1/clusters/nowhere/").status_code == 404


def test_offers_show_the_clusters_gpus_and_the_gpu_quota_and_check_refuses_past_it(alice, k8s_env):
    # given a team allowed 2 GPUs and a built classifier
    set_quota(team=alice.team, limits={"gpu": 2})
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    # when the deploy form's data is asked for
    offers = alice.client.get("/api/v1/deployments/offers?team=acme")
    # then kubernetes is available, with the GPUs the cluster's Nodes offer, and the team's GPU quota
    assert offers.status_code == 200, offers.content
    body = offers.json()
    assert [(runtime["name"], runtime["available"]) for runtime in body["runtimes"]] == [
        ("local", True),
        ("kubernetes", True),
    ]
    (local,) = [cluster for cluster in body["clusters"] if cluster["name"] == "local"]
    assert local["error"] == ""
    assert local["gpu_offers"] == [
        {
            "product": "NVIDIA-A10",
            "resource": "nvidia.com/gpu",
            "mig_profile": None,
            "most_on_one_node": 2,
            "total": 2,
            "nodes": 1,
        },
        {
            "product": "NVIDIA-A100-SXM4-40GB",
            "resource": "nvidia.com/mig-1g.10gb",
            "mig_profile": "1g.10gb",
            "most_on_one_node": 7,
            "total": 7,
            "nodes": 1,
        },
    ]
    gpu = [line for line in body["quota"] if line["field"] == "gpu"]
    assert gpu == [
        {"field": "gpu", "name": "GPU", "unit": "nvidia.com/gpu", "limit": 2, "used": 0, "free": 2, "is_default": False}
    ]
    # when more GPUs than the quota are checked, as whole GPUs and as MIG slices
    body = {"name": "web", "team": "acme", "model_version": version.pk, "runtime": "kubernetes", "cluster": "local"}
    a10 = {"product": "NVIDIA-A10", "count": 1}
    whole = alice.client.post("/api/v1/deployments/check", {**body, "replicas": 3, "gpu": a10}, format="json")
    autoscaling = {"min_replicas": 1, "max_replicas": 3, "target_queue_time_us": 2000}
    slices = alice.client.post(
        "/api/v1/deployments/check",
        {**body, "autoscaling": autoscaling, "gpu": {"mig_profile": "1g.10gb"}},
        format="json",
    )
    # then each is refused as the create would be, naming the resource and the numbers (autoscaling counts at its
    # most pods)
    assert whole.status_code == 409, whole.content
    refusal = {
        "detail": "GPU quota exceeded: team 'acme' uses 0 of 2 nvidia.com/gpu; this deployment needs 3",
        "field": "gpu",
        "quota": {"limit": 2, "used": 0, "requested": 3},
    }
    assert whole.json() == {**refusal, "errors": [refusal]}
    assert slices.status_code == 409, slices.content
    assert slices.json()["detail"] == (
        "GPU quota exceeded: team 'acme' uses 0 of 2 nvidia.com/mig-1g.10gb; this deployment needs 3"
    )
    # and pods asking for more GPUs than a node holds are refused naming gpu.count (CPU instances are fine there);
    # GPU instances in pods without GPUs and a bad name are named at once
    kinds = alice.client.post(
        "/api/v1/deployments/check",
        {**body, "replicas": 1, "gpu": {"product": "NVIDIA-A10", "count": 3}, "instance_kind": "KIND_CPU"},
        format="json",
    )
    assert [error["field"] for error in kinds.json()["errors"]] == ["gpu.count"]
    cpu_pods = alice.client.post(
        "/api/v1/deployments/check", {**body, "name": "Web", "replicas": 1, "instance_kind": "KIND_GPU"}, format="json"
    )
    assert cpu_pods.status_code == 400, cpu_pods.content
    assert [error["field"] for error in cpu_pods.json()["errors"]] == ["name", "instance_kind"]
    # and within the quota it fits, saying what it takes, and nothing is created
    fits = alice.client.post("/api/v1/deployments/check", {**body, "replicas": 2, "gpu": a10}, format="json")
    assert fits.status_code == 200, fits.content
    assert fits.json()["fits"] is True
    assert fits.json()["requested"] == {
        "deployments": 1,
        "gpu": {"nvidia.com/gpu": 2},
        "storage_bytes": fits.json()["requested"]["storage_bytes"],
    }
    assert fits.json()["requested"]["storage_bytes"] > version.source_size_bytes  # its copy of the model file
    assert not Deployment.objects.exists()


def test_a_version_one_pod_cannot_load_rolls_every_pod_back(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    from models_registry.storage import get_object_store

    capture = django_capture_on_commit_callbacks
    v1, v2 = write_adder_versions(alice.team, tmp_path)
    get_object_store().put_bytes(f"{served_repository_prefix(v2)}/adder/2/model.onnx", b"not onnx")
    created = _create(alice, capture, v1, name="rollback", replicas=2)
    _reconcile_until(alice, created["id"], lambda d: d["replicas"] == {"desired": 2, "ready": 2}, capture=capture)
    uids = _pod_uids(k8s_env, created["id"])
    with capture(execute=True):
        response = alice.client.patch(f"/api/v1/deployments/{created['id']}/", {"model_version": v2.pk}, format="json")
    assert response.status_code == 202, response.content
    shown = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
    # the update failed naming the pod and Triton's message; every pod serves version 1 alone, none restarted
    assert (shown["update_status"], shown["model_version"]) == ("failed", v1.pk)
    assert any(shown["update_error"].startswith(f"Server {name} could not serve version 2") for name in uids)
    # (a pod's readiness probe may have failed while its Triton tried version 2 and loaded version 1 again: at a
    # probe period of 1 s and three failures that takes a busy machine only seconds; the probe brings it back)
    _reconcile_until(alice, created["id"], lambda d: d["replicas"] == {"desired": 2, "ready": 2}, capture=capture)
    row = Deployment.objects.get(pk=created["id"])
    servers = get_runtime("kubernetes").servers(row.runtime_state)
    assert len(servers) == 2
    for server in servers:
        with TritonClient(server.http_url, timeout_s=10, api_key=server.api_key) as admin:
            assert admin.ready_versions("adder") == {1}
    assert _pod_uids(k8s_env, created["id"]) == uids
    answer = alice.client.post(f"/api/v1/deployments/{created['id']}/infer/", ADDER_REQUEST, format="json")
    assert answer.json()["outputs"][0]["data"] == [1.5, 1.5, 1.5, 1.5]


def test_an_image_the_nodes_cannot_pull_is_failed_in_words(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    register_cluster(
        name="typo",
        namespace="conch",
        kubeconfig=k8s_env.kubeconfig_path.read_text(),
        triton_image="nvcr.io/nvidia/tritonserverr:24.10-py3",
    )
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    created = _create(alice, capture, version, name="pull", cluster="typo")
    seen = _reconcile_until(alice, created["id"], lambda d: d["status"] == "failed", capture=capture, timeout_s=60)
    assert "cannot pull image nvcr.io/nvidia/tritonserverr:24.10-py3" in seen["status_message"]
    assert "image pull secrets" in seen["status_message"]


def test_a_pod_monitor_is_applied_once_its_crd_exists_and_deleted_with_the_deployment(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    extensions = k8s.ApiextensionsV1Api(k8s_env.api_client())
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podmonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": "podmonitors", "singular": "podmonitor", "kind": "PodMonitor"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    extensions.create_custom_resource_definition(crd)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conditions = extensions.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            time.sleep(0.2)
        for client in kube_api._clients.values():
            client._versions = None  # what the discovery cache would see within its TTL
        version = write_built_version(alice.team, "classifier", real_models.classifier())
        created = _create(alice, capture, version, name="monitored")
        objects = k8s.CustomObjectsApi(k8s_env.api_client())
        selector = f"conch.io/deployment={created['id']}"
        found = objects.list_namespaced_custom_object(
            "monitoring.coreos.com", "v1", "conch", "podmonitors", label_selector=selector
        )["items"]
        assert [m["spec"]["podMetricsEndpoints"][0]["port"] for m in found] == ["metrics"]
        with capture(execute=True):
            alice.client.delete(f"/api/v1/deployments/{created['id']}/")
        state = Deployment.objects.get(pk=created["id"]).runtime_state
        deadline = time.monotonic() + 60
        while (left := get_runtime("kubernetes").leftovers(state)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == {}
    finally:
        extensions.delete_custom_resource_definition(crd["metadata"]["name"])
        for client in kube_api._clients.values():
            client._versions = None


def test_a_namespace_that_does_not_exist_fails_saying_so(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    register_cluster(name="elsewhere", namespace="no-such-namespace", kubeconfig=k8s_env.kubeconfig_path.read_text())
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    created = _create(alice, capture, version, name="lost", cluster="elsewhere")
    seen = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert seen["status"] == "failed"
    assert "namespace 'no-such-namespace'" in seen["error"] and "Create the namespace" in seen["error"]
    # the refusal is permanent: reconcile does not apply it again and again
    with capture(execute=True):
        reconcile_deployments()
    assert alice.client.get(f"/api/v1/deployments/{created['id']}/").json()["status"] == "failed"


def test_cpu_autoscaling_applies_an_hpa_on_cpu_utilization(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    scaling = {"min_replicas": 1, "max_replicas": 3, "target_cpu_percent": 70}
    created = _create(alice, capture, version, name="cpu-auto", autoscaling=scaling)
    shown = alice.client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert shown["status"] != "failed", shown["error"]
    hpas = _listed(
        k8s_env.api_client(), "autoscaling/v2beta2", "HorizontalPodAutoscaler", f"conch.io/deployment={created['id']}"
    )
    assert [h["spec"]["metrics"][0]["resource"]["name"] for h in hpas] == ["cpu"]
    assert hpas[0]["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70


def test_a_network_policy_is_applied_with_the_deployment_and_deleted_with_it(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given the operator's selectors for Conch's pods (its own namespace) and for Prometheus
    settings.CONCH_KUBERNETES_CONCH_POD_SELECTOR = {"app.kubernetes.io/name": "conch"}
    settings.CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR = {"conch.io/role": "console"}
    settings.CONCH_KUBERNETES_MONITORING_POD_SELECTOR = {"app.kubernetes.io/name": "prometheus"}
    settings.CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR = {"conch.io/role": "monitoring"}
    capture = django_capture_on_commit_callbacks
    version = write_built_version(alice.team, "classifier", real_models.classifier())

    # when
    created = _create(alice, capture, version, name="fenced")

    # then the API server took the policy as Conch wrote it. The test cluster has no network plugin, so what the
    # policy admits or denies cannot be observed here: only that it is stored, its content, and its deletion.
    selector = f"conch.io/deployment={created['id']}"
    networking = k8s.NetworkingV1Api(k8s_env.api_client())
    policies = networking.list_namespaced_network_policy("conch", label_selector=selector).items
    assert len(policies) == 1
    stored = k8s_env.api_client().sanitize_for_serialization(policies[0])["spec"]
    pods = k8s.AppsV1Api(k8s_env.api_client()).list_namespaced_deployment("conch", label_selector=selector).items
    assert stored["podSelector"] == {"matchLabels": pods[0].spec.selector.match_labels}
    assert stored["policyTypes"] == ["Ingress"]
    assert [(rule["from"], [port["port"] for port in rule["ports"]]) for rule in stored["ingress"]] == [
        (
            [
                {
                    "namespaceSelector": {"matchLabels": {"conch.io/role": "console"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "conch"}},
                }
            ],
            [8000, 8001, 8002],
        ),
        (
            [
                {
                    "namespaceSelector": {"matchLabels": {"conch.io/role": "monitoring"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
            [8002],
        ),
    ]

    # when the deployment is deleted, the policy goes with it
    with capture(execute=True):
        alice.client.delete(f"/api/v1/deployments/{created['id']}/")
    assert networking.list_namespaced_network_policy("conch", label_selector=selector).items == []


def test_a_tensorrt_plan_deploys_only_on_its_gpu_product_and_tensorrt_version(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.builds.test_tensorrt_builds import DECLARED, PLAN

    # given a TensorRT plan built for NVIDIA-A10 with TensorRT 10.7.0 (a stand-in file: see test_tensorrt_builds)
    model = alice.client.post("/api/v1/models/", {"name": "detector", "team": "acme"}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        uploaded = alice.client.post(
            f"/api/v1/models/{model['id']}/versions/", {"file": SimpleUploadedFile("d.plan", PLAN), **DECLARED}
        )
    version = alice.client.get(f"/api/v1/versions/{uploaded.json()['id']}/").json()
    assert version["status"] == "built", version["error"]
    body = {"name": "web", "team": "acme", "model_version": version["id"], "runtime": "kubernetes", "cluster": "local"}
    a10 = {"product": "NVIDIA-A10", "count": 1}

    def errors(**extra) -> list[tuple[str, str]]:
        response = alice.client.post("/api/v1/deployments/check", {**body, **extra}, format="json")
        return [(error["field"], error["detail"]) for error in response.json().get("errors", [])]

    # when the cluster's image is a release Conch knows no TensorRT of (24.10, the default), it is refused saying so
    [(field, detail)] = errors(replicas=1, gpu=a10)
    assert field == "cluster" and "Conch does not know which TensorRT cluster 'local'" in detail
    assert "Register the cluster with --tensorrt-version" in detail
    # when the cluster says its TensorRT, another GPU product and no GPU at all are refused naming gpu.product
    register_cluster(
        name="local",
        kubeconfig=k8s_env.kubeconfig_path.read_text(),
        namespace="conch",
        tensorrt_version="10.7.0.23",
    )
    # (the test cluster's A100 offers MIG slices only, so whole A100s are refused by gpu.count as well)
    found = dict(errors(replicas=1, gpu={"product": "NVIDIA-A100-SXM4-40GB", "count": 1}))
    assert "the deployment asks for gpu.product NVIDIA-A100-SXM4-40GB" in found["gpu.product"]
    [(field, detail)] = errors(replicas=1)
    assert field == "gpu.product" and "the deployment asks for no gpu.product. Give gpu.product NVIDIA-A10" in detail
    # and on its GPU product with its TensorRT it fits
    fits = alice.client.post("/api/v1/deployments/check", {**body, "replicas": 1, "gpu": a10}, format="json")
    assert fits.status_code == 200 and fits.json()["fits"] is True, fits.content
    # and an image known to carry another TensorRT (24.05: 10.0.1.6) is refused naming both versions
    register_cluster(
        name="local",
        kubeconfig=k8s_env.kubeconfig_path.read_text(),
        namespace="conch",
        triton_image="nvcr.io/nvidia/tritonserver:24.05-py3",
    )
    [(field, detail)] = errors(replicas=1, gpu=a10)
    assert field == "cluster" and "runs nvcr.io/nvidia/tritonserver:24.05-py3 with TensorRT 10.0.1.6" in detail
    assert "Build the plan again with TensorRT 10.0.1.6" in detail


def test_a_python_model_s_pods_read_its_environment_with_the_repository_and_install_nothing(
    alice, k8s_env, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from models_registry.models import ModelVersion
    from tests.builds.test_python_models import CONFIG, MODEL_PY, _archive, _wheel

    capture = django_capture_on_commit_callbacks
    # given a Python model whose model.py imports a package only its environment holds, built on S3 storage
    _wheel(tmp_path / "wheels", "conch-scaler", "1.0", {"conch_scaler/__init__.py": "FACTOR = 3.0\n"})
    settings.CONCH_ENVIRONMENT_FIND_LINKS = (str(tmp_path / "wheels"),)
    model = alice.client.post("/api/v1/models/", {"name": "scaler", "team": alice.team.slug}, format="json").json()
    archive = _archive({"model.py": MODEL_PY, "config.pbtxt": CONFIG, "requirements.txt": b"conch-scaler==1.0\n"})
    with capture(execute=True):
        uploaded = alice.client.post(
            f"/api/v1/models/{model['id']}/versions/", {"file": SimpleUploadedFile("scaler.zip", archive)}
        )
    assert uploaded.status_code in (201, 202), uploaded.content
    version = ModelVersion.objects.get(pk=uploaded.json()["id"])
    assert version.status == "built", alice.client.get(f"/api/v1/versions/{version.pk}/").json()["error"]
    # when it is deployed on the cluster
    created = _create(alice, capture, version, name="py", replicas=1)
    ready = _reconcile_until(alice, created["id"], lambda d: d["status"] == "ready", capture=capture, timeout_s=120)
    # then the pod's Triton read the environment from the repository on S3 and ran the code with it
    assert ready["replicas"] == {"desired": 1, "ready": 1}
    request = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    answer = alice.client.post(f"/api/v1/deployments/{created['id']}/infer/", request, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [3.0, 6.0, 9.0]
    # and the pod spec starts Triton alone: no init step installs packages
    apps = k8s.AppsV1Api(k8s_env.api_client())
    [workload] = apps.list_namespaced_deployment("conch", label_selector=f"conch.io/deployment={created['id']}").items
    spec = workload.spec.template.spec
    assert not spec.init_containers and all("pip" not in " ".join(c.command or c.args or []) for c in spec.containers)

"""`CONCH_DEMO_RUNTIME=kubernetes make demo`: the demo against a running local Kubernetes test cluster.

The demo registers the cluster as `local`, starts its own S3 protocol server, deploys the demo model there with 2
replicas and infers through Conch; Ctrl-C deletes the deployment's objects from the cluster and stops the demo's
processes. Without a cluster it stops at once, saying how to start one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.conf import settings
from kubernetes import client as k8s

from tests.test_embedded_demo import Demo, _infer, _leftovers

START_CLUSTER = "start the cluster first with `make cluster` in another terminal"


def _demo_env(var: Path) -> dict[str, str]:
    """A clean environment for a kubernetes demo in `var`: no database, broker or storage variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_", "DJANGO_"))}
    env.update(
        {
            "CONCH_VAR_DIR": str(var),
            "CONCH_INSTANCE_ID": f"conchk8sdemotest{os.getpid()}",
            "CONCH_DEMO_RUNTIME": "kubernetes",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _run_demo(env: dict[str, str], kubeconfig: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "run_demo", "--port", "0", "--kubeconfig", str(kubeconfig)],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_kubeconfig_the_kubernetes_demo_says_to_start_the_cluster(tmp_path):
    # when the kubernetes demo runs and no cluster wrote its kubeconfig
    missing = tmp_path / "cluster" / "kubeconfig"
    finished = _run_demo(_demo_env(tmp_path / "var"), missing)
    # then it stops at once, before starting anything, saying what to do
    assert finished.returncode == 1
    assert f"there is no kubeconfig at {missing}: {START_CLUSTER}." in finished.stderr
    assert "started" not in finished.stdout


def test_when_the_api_server_does_not_answer_the_kubernetes_demo_says_to_start_the_cluster(tmp_path):
    # given a kubeconfig whose API server is not running (nothing listens on port 9, "discard")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: gone\n"
        "clusters: [{name: gone, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: admin, user: {token: demo}}]\n"
        "contexts: [{name: gone, context: {cluster: gone, user: admin}}]\n"
    )
    # when the kubernetes demo runs
    finished = _run_demo(_demo_env(tmp_path / "var"), kubeconfig)
    # then it stops at once with the same advice
    assert finished.returncode == 1
    assert f"the Kubernetes API server of {kubeconfig} does not answer: {START_CLUSTER}." in finished.stderr
    assert "started" not in finished.stdout


@pytest.mark.kube
@pytest.mark.e2e
def test_the_kubernetes_demo_serves_on_the_cluster_and_ctrl_c_deletes_its_pods(kube_cluster, tmp_path):
    var = tmp_path / "var"
    env = _demo_env(var)
    demo = Demo(env, "--kubeconfig", str(kube_cluster.kubeconfig_path))
    try:
        # when the kubernetes demo comes up
        found = demo.wait_until_up()
        # then it printed the same lines as the local demo, after an inference on the cluster
        assert found["CONCH_URL"].startswith("http://127.0.0.1:")
        assert found["CONCH_TOKEN"].startswith("conch_")
        deployment_id = found["CONCH_DEPLOYMENT"]
        assert any(line.startswith("inference: scores") for line in demo.lines)
        # and it said where its storage is and how the deployment came up
        assert any(re.fullmatch(r"S3 server at http://127\.0\.0\.1:\d+, bucket conch-demo .*", x) for x in demo.lines)
        assert f"deploying (id {deployment_id}) on cluster 'local', 2 replicas of 1 GPU each…" in demo.lines
        assert "  ready: ready 2/2" in demo.lines
        assert len([line for line in demo.lines if line.startswith("Pod:") and " on node gpu-a " in line]) == 2
        # and the API shows both pods ready, and serves inferences from them
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {found['CONCH_TOKEN']}"
        seen = api.get(f"{found['CONCH_URL']}/api/v1/deployments/{deployment_id}/", timeout=30).json()
        assert (seen["runtime"], seen["cluster"], seen["status"]) == ("kubernetes", "local", "ready")
        assert seen["replicas"] == {"desired": 2, "ready": 2}
        assert [pod["node"] for pod in seen["pods"]] == ["gpu-a", "gpu-a"]
        pods = {pod["name"] for pod in seen["pods"]}
        answer = _infer(demo)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [1, 4]
    finally:
        rest = demo.interrupt()
    # when Ctrl-C was pressed: the deployment was deleted from the cluster, and the demo's processes stopped
    assert demo.process.returncode == 0, rest
    assert f"deployment {deployment_id} stopped; its pods are deleted" in rest
    assert "stopped s3, web, gateway, worker, beat and 0 local Triton process(es); the cluster keeps running" in rest
    assert _leftovers(var, env["CONCH_INSTANCE_ID"]) == []
    core = k8s.CoreV1Api(kube_cluster.api_client())
    deadline = time.monotonic() + 60
    while pods & {pod.metadata.name for pod in core.list_namespaced_pod("conch").items}:
        assert time.monotonic() < deadline, "the demo's pods were not deleted"
        time.sleep(1)

"""The wizard's Kubernetes choices in Chromium against the local Kubernetes test cluster (tests/kube: a real API
server, scheduler and controller-manager; the test kubelet runs each pod as a local Triton reading the model
repository from the test S3 server).

The cluster's Nodes advertise GPUs as NVIDIA's device plugin does (devtools/cluster): `gpu-a` 2
`nvidia.com/gpu` (NVIDIA-A10), `gpu-b` 7 `nvidia.com/mig-1g.10gb` (NVIDIA-A100-SXM4-40GB), `cpu-a` none. The page
must show those, and the team's GPU quota, refuse before submit what the create would refuse, and follow the
deployment until its pods are ready; a test inference is then answered by the pods.

Celery tasks run inline (eager) as their transactions commit, so the deploy request applies the manifests; the test
runs reconcile once a second, as beat does, while the status page polls.
"""

from __future__ import annotations

import time

import pytest
from django.template.defaultfilters import filesizeformat

from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.services import reconcile_deployments
from deployments.services.clusters import register_cluster
from tenancy.quotas import set_quota
from tests import real_models
from tests.console.test_wizard_browser import MEAN, STD, onnxruntime_top_class, write_image
from tests.deployments.conftest import write_built_version

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.kube]

#: Two Tritons starting in pods (the classifier on the CPU backends) on a shared machine.
COME_UP_S = 180
#: A cluster whose API server does not answer (nothing listens on port 1).
UNREACHABLE_KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: lab
clusters: [{name: lab, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
contexts: [{name: lab, context: {cluster: lab, user: admin}}]
users: [{name: admin, user: {token: not-a-real-token}}]
"""


@pytest.fixture
def cluster_env(settings, s3_server, s3_bucket, kube_cluster):
    """S3 storage on the test S3 server (pods read their repository from it) and the test cluster registered as
    `local` (namespace `conch`); every workload of this installation is deleted afterwards (the cluster is
    shared by the session)."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key
    register_cluster(name="local", kubeconfig=kube_cluster.kubeconfig_path.read_text(), namespace="conch")
    yield kube_cluster
    runtime = get_runtime("kubernetes")
    for workload in runtime.list_owned():
        runtime.delete(workload.state)


def table_rows(locator) -> list[list[str]]:
    """The cells' texts of each body row of the table `locator` points at."""
    return [[cell.strip() for cell in row.locator("td").all_inner_texts()] for row in locator.locator("tbody tr").all()]


def enabled_options(select) -> list[str]:
    """The texts of the options of `select` a user can choose now."""
    return select.locator("option:not([disabled])").all_inner_texts()


def wait_for_verdict(page, testid: str) -> str:
    """Wait until the deploy check shows `testid` (`deploy-fit` or `deploy-refusal`) for the form as it is now;
    return its text."""
    shown = page.locator(f"#deploy-check [data-testid={testid}]")
    shown.wait_for()
    return shown.inner_text()


def test_a_user_deploys_on_the_cluster_with_the_gpus_it_offers_within_the_teams_gpu_quota(
    console_browser, alice, cluster_env, eager_tasks, screenshot, tmp_path
):
    # given a built classifier, a team allowed 2 GPUs, the test cluster registered, and a cluster `lab` whose API
    # server does not answer (listed first, by name)
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"gpu": 2})
    register_cluster(name="lab", namespace="conch", kubeconfig=UNREACHABLE_KUBECONFIG)
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    # then the page shows the team's GPU quota: none used of 2
    quota = {row[0]: row[1:] for row in table_rows(page.get_by_test_id("quota"))}
    assert quota["GPU (nvidia.com/gpu)"] == ["0", "2", "2"]
    product = page.get_by_label("GPU product")
    mig = page.get_by_label("MIG profile")

    # when she chooses to run it on a cluster
    page.get_by_test_id("deploy-runtime").select_option("kubernetes")
    # then the first cluster, lab, says it does not answer and offers no GPU to choose
    assert page.get_by_label("Cluster").input_value() == "lab"
    lab = page.locator(".cluster-offers[data-cluster=lab]")
    assert lab.is_visible() and "GPUs on lab" in lab.inner_text()
    assert lab.locator(".field-error").is_visible()
    assert not page.locator(".cluster-offers[data-cluster=local]").is_visible()
    assert enabled_options(product) == ["any"] and enabled_options(mig) == ["—"]

    # when she chooses the test cluster
    page.get_by_label("Cluster").select_option("local")
    # then she sees the GPUs its Nodes offer, and only those: kinds, most on one node, in all
    assert not lab.is_visible()
    offers = page.get_by_test_id("gpu-offers-local")
    assert offers.is_visible()
    assert table_rows(offers) == [
        ["NVIDIA-A10", "nvidia.com/gpu", "—", "2", "2", "1"],
        ["NVIDIA-A100-SXM4-40GB", "nvidia.com/mig-1g.10gb", "1g.10gb", "7", "7", "1"],
    ]
    # and the choices come from those offers, with the most GPUs a pod can have there
    assert enabled_options(product) == ["any", "NVIDIA-A10 (local)"]
    assert enabled_options(mig) == ["—", "1g.10gb (NVIDIA-A100-SXM4-40GB, local)"]
    page.get_by_label("whole GPUs").check()
    product.select_option("NVIDIA-A10")
    assert page.get_by_test_id("gpu-most").inner_text() == (
        "NVIDIA-A10: at most 2 per pod on local (the most one of its nodes has)"
    )
    assert page.get_by_label("GPUs per pod").get_attribute("max") == "2"

    # when she asks for 3 pods of 1 A10 each: 3 GPUs, more than the team's 2
    page.get_by_label("GPUs per pod").fill("1")
    page.get_by_label("Replicas", exact=True).fill("3")
    # then the page refuses before submit, with the create's own message, and Deploy is disabled
    refusal = wait_for_verdict(page, "deploy-refusal")
    assert refusal == "GPU quota exceeded: team 'acme' uses 0 of 2 nvidia.com/gpu; this deployment needs 3"
    assert page.get_by_test_id("deploy-submit").is_disabled()
    screenshot(page, "wizard-4-deploy-kubernetes-refused")
    # and more GPUs in one pod than any Node holds is refused naming the field
    page.get_by_label("Replicas", exact=True).fill("1")
    page.get_by_label("GPUs per pod").fill("3")
    refusal = page.locator("#deploy-check [data-testid=deploy-refusal][data-field='gpu.count']")
    refusal.wait_for()
    assert page.get_by_test_id("deploy-submit").is_disabled()

    # when she asks for 2 pods of 1 A10 each, within the quota
    page.get_by_label("GPUs per pod").fill("1")
    page.get_by_label("Replicas", exact=True).fill("2")
    fit = wait_for_verdict(page, "deploy-fit")
    stored = filesizeformat(version.source_size_bytes)  # its own copy of the model file (and a few bytes of config)
    assert fit == f"It fits: this deployment takes 1 deployment, 2 GPUs (nvidia.com/gpu), {stored} of storage."
    assert page.get_by_test_id("deploy-submit").is_enabled()
    screenshot(page, "wizard-4-deploy-kubernetes")
    with page.expect_navigation(timeout=60_000):
        page.get_by_test_id("deploy-submit").click()
    deployment = Deployment.objects.get(team=alice.team)
    assert (deployment.runtime, deployment.cluster.name) == ("kubernetes", "local")

    # then the status page follows it (it is `ready` once one pod serves) until both pods are ready, on the A10 node
    live = page.locator("#deployment-live")
    deadline = time.monotonic() + COME_UP_S
    while "Pods ready: 2 of 2" not in live.inner_text():
        assert time.monotonic() < deadline, live.inner_text()
        reconcile_deployments()
        time.sleep(1)
    assert page.get_by_test_id("deployment-status").get_attribute("data-status") == "ready"
    assert "(updating live)" not in live.inner_text()
    pods = table_rows(page.get_by_test_id("pods"))
    assert [(row[1], row[2], row[3]) for row in pods] == [("gpu-a", "Running", "yes")] * 2
    screenshot(page, "wizard-5-status-kubernetes")
    # and a test inference with an image is answered by the pods, with onnxruntime's top class
    page.get_by_test_id("wizard-next").click()
    page.wait_for_url("**/test/")
    image = write_image(tmp_path / "image.png")
    page.get_by_test_id("infer-input").set_input_files(str(image))
    page.get_by_label("Mean (R, G, B)").fill(", ".join(str(v) for v in MEAN))
    page.get_by_label("Std (R, G, B)").fill(", ".join(str(v) for v in STD))
    page.get_by_test_id("infer-submit").click()
    first = page.get_by_test_id("infer-output").locator("table.top-k tbody tr").first
    first.wait_for(timeout=60_000)
    assert int(first.get_attribute("data-class")) == onnxruntime_top_class(image)
    # and the deployment page lists the same pods, ready
    page.goto(f"/deployments/{deployment.pk}/")
    listed = table_rows(page.locator("section[aria-labelledby=pods-heading] table"))
    assert sorted(row[0] for row in listed) == sorted(row[0] for row in pods)
    assert [(row[1], row[2], row[4]) for row in listed] == [("Running", "yes", "gpu-a")] * 2
    # and the team's quota now counts the 2 GPUs
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    quota = {row[0]: row[1:] for row in table_rows(page.get_by_test_id("quota"))}
    assert quota["GPU (nvidia.com/gpu)"] == ["2", "2", "0"]

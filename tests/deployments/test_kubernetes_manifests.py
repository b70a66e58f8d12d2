"""Kubernetes manifests of a Triton deployment: pure functions, validated strictly against the official schemas of
every Kubernetes minor from 1.27 to the newest `kubernetes-validate` bundles (tier 1 of ../shared/K8S-TESTING.md)."""

from __future__ import annotations

import dataclasses
import re

import kubernetes_validate
import pytest
from kubernetes_validate.utils import major_minor

from conch.errors import InvalidInput
from deployments.runtimes.kubernetes.manifests import (
    API_KEY_ENV,
    Autoscaling,
    GpuRequest,
    PeerSelector,
    TritonPodSpec,
    api_key_secret_manifest,
    deployment_manifest,
    dns_label,
    hpa_manifest,
    labels,
    network_policy_manifest,
    object_name,
    pdb_manifest,
    pod_monitor_manifest,
    s3_secret_manifest,
    service_manifest,
)

NEWEST = major_minor(kubernetes_validate.latest_version())
VERSIONS = [f"1.{minor}" for minor in range(27, int(NEWEST.split(".")[1]) + 1)]

SPEC = TritonPodSpec(
    deployment_id=42,
    team="acme",
    name="classifier",
    model_name="classifier",
    namespace="models",
    image="nvcr.io/nvidia/tritonserver:24.10-py3",
    repository="s3://https://minio.example:9000/conch/deployments/42",
    s3_secret_name="acme-classifier-42-s3",
    replicas=2,
    gpu=GpuRequest(count=1, product="NVIDIA-A10"),
    image_pull_secrets=("ngc",),
)

CONCH_PODS = PeerSelector(pod_labels={"app.kubernetes.io/part-of": "conch"})
PROMETHEUS = PeerSelector(
    pod_labels={"app.kubernetes.io/name": "prometheus"},
    namespace_labels={"kubernetes.io/metadata.name": "monitoring"},
)


def _all_manifests(spec: TritonPodSpec) -> list[dict]:
    made = [
        deployment_manifest(spec),
        service_manifest(spec),
        api_key_secret_manifest(spec, "k" * 64),
        s3_secret_manifest(spec, access_key_id="AKIA", secret_access_key="s3cr3t", region="us-east-1"),
        hpa_manifest(spec),
        pdb_manifest(spec),
        network_policy_manifest(spec, conch=CONCH_PODS, monitoring=PROMETHEUS),
    ]
    return [manifest for manifest in made if manifest is not None]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        dataclasses.replace(SPEC, gpu=GpuRequest(mig_profile="1g.10gb", product="NVIDIA-A100-SXM4-40GB")),
        dataclasses.replace(SPEC, gpu=None, replicas=1),
        dataclasses.replace(SPEC, autoscaling=Autoscaling(min_replicas=2, max_replicas=6, target_queue_time_us=2000)),
        dataclasses.replace(SPEC, autoscaling=Autoscaling(min_replicas=1, max_replicas=3, target_cpu_percent=70)),
    ],
    ids=["gpu", "mig", "cpu", "autoscaling", "autoscaling-cpu"],
)
def test_every_manifest_is_valid_in_strict_mode_for_every_kubernetes_minor(spec, version):
    for manifest in _all_manifests(spec):
        kubernetes_validate.validate(manifest, version, strict=True)


def test_a_typo_is_caught_by_the_strict_validation_the_tests_rely_on():
    manifest = deployment_manifest(SPEC)
    manifest["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, NEWEST, strict=True)


def test_the_container_runs_triton_on_the_s3_repository_locked_down_and_without_auto_complete():
    container = deployment_manifest(SPEC)["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[:5] == [
        "--model-repository=s3://https://minio.example:9000/conch/deployments/42",
        "--model-control-mode=explicit",
        "--load-model=classifier",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
    ]
    categories = "model-repository,model-config,shared-memory,statistics,trace,logging"
    assert f"--http-restricted-api={categories}:X-Conch-Key=$({API_KEY_ENV})" in args
    assert f"--grpc-restricted-protocol={categories}:x-conch-key=$({API_KEY_ENV})" in args
    # the key comes from the deployment's own Secret, the S3 credentials from theirs
    [key_env] = container["env"]
    assert key_env == {
        "name": API_KEY_ENV,
        "valueFrom": {"secretKeyRef": {"name": "acme-classifier-42-api-key", "key": "api-key"}},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "acme-classifier-42-s3"}}]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("http", 8000),
        ("grpc", 8001),
        ("metrics", 8002),
    ]


def test_probes_use_tritons_health_endpoints_with_a_generous_startup():
    container = deployment_manifest(SPEC)["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200  # 20 minutes to load a large model


def test_gpus_are_whole_requested_and_limited_alike_with_product_selector_and_toleration():
    pod = deployment_manifest(SPEC)["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A10"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_a_mig_slice_is_its_own_resource():
    spec = dataclasses.replace(SPEC, gpu=GpuRequest(mig_profile="1g.10gb"))
    resources = deployment_manifest(spec)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/mig-1g.10gb"] == resources["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    assert "nvidia.com/gpu" not in resources["requests"]


def test_a_cpu_pod_asks_for_no_gpu_and_tolerates_no_gpu_taint():
    pod = deployment_manifest(dataclasses.replace(SPEC, gpu=None))["spec"]["template"]["spec"]
    assert not any(name.startswith("nvidia.com/") for name in pod["containers"][0]["resources"]["requests"])
    assert "tolerations" not in pod and "nodeSelector" not in pod


def test_pods_are_locked_down_and_get_a_memory_backed_shm():
    pod = deployment_manifest(SPEC)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {"drop": ["ALL"]}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]


def test_rolling_updates_never_go_below_the_ready_count():
    strategy = deployment_manifest(SPEC)["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_names_and_labels_are_deterministic_and_select_only_this_deployment():
    deployment, service = deployment_manifest(SPEC), service_manifest(SPEC)
    assert deployment == deployment_manifest(SPEC)
    assert object_name(SPEC) == deployment["metadata"]["name"] == service["metadata"]["name"] == "acme-classifier-42"
    assert labels(SPEC) == {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": "acme-classifier-42",
        "app.kubernetes.io/managed-by": "conch",
        "conch.io/team": "acme",
        "conch.io/deployment": "42",
    }
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert all(m["metadata"]["labels"] == labels(SPEC) for m in _all_manifests(SPEC))


@pytest.mark.parametrize(
    "text",
    ["a" * 63 + "-team-model-1", "Team_With.Caps/and spaces", "x" * 200],
)
def test_long_or_odd_names_become_dns_labels_with_a_hash_suffix(text):
    label = dns_label(text)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", label) and len(label) <= 63
    assert label != dns_label(text + "2")  # cut names still differ
    assert label == dns_label(text)


def test_a_short_valid_name_is_kept_as_it_is():
    assert dns_label("acme-classifier-7") == "acme-classifier-7"


def test_replicas_come_from_the_autoscaler_when_there_is_one():
    spec = dataclasses.replace(SPEC, autoscaling=Autoscaling(min_replicas=1, max_replicas=4, target_queue_time_us=500))
    assert "replicas" not in deployment_manifest(spec)["spec"]
    hpa = hpa_manifest(spec)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "acme-classifier-42",
    }
    assert hpa["spec"]["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "500"}
    assert hpa_manifest(spec, api_version="autoscaling/v2beta2")["apiVersion"] == "autoscaling/v2beta2"
    assert hpa_manifest(SPEC) is None
    assert pdb_manifest(spec) is None  # min 1 replica: a budget would block node drains


def test_a_disruption_budget_only_with_two_replicas_or_more():
    assert pdb_manifest(dataclasses.replace(SPEC, replicas=1)) is None
    pdb = pdb_manifest(SPEC)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": deployment_manifest(SPEC)["spec"]["selector"]["matchLabels"]},
    }
    assert pdb_manifest(SPEC, api_version="policy/v1beta1")["apiVersion"] == "policy/v1beta1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpu": GpuRequest(count=0.5)}, "gpu.count"),
        ({"gpu": GpuRequest(count=-1)}, "gpu.count"),
        ({"gpu": GpuRequest(count=1, mig_profile="1g.10gb")}, "gpu"),
        ({"gpu": GpuRequest(mig_profile="half")}, "gpu.mig_profile"),
        ({"replicas": -1}, "replicas"),
        ({"memory": "lots"}, "memory"),
        ({"cpu": "1.5 cores"}, "cpu"),
        (
            {"autoscaling": Autoscaling(min_replicas=5, max_replicas=2, target_queue_time_us=100)},
            "autoscaling.min_replicas",
        ),
        (
            {"autoscaling": Autoscaling(min_replicas=1, max_replicas=2, target_queue_time_us=0)},
            "autoscaling.target_queue_time_us",
        ),
    ],
)
def test_values_no_cluster_could_run_are_refused_naming_the_field(change, field):
    with pytest.raises(InvalidInput) as caught:
        deployment_manifest(dataclasses.replace(SPEC, **change))
    assert caught.value.field == field


def test_cpu_autoscaling_targets_utilization_and_needs_exactly_one_target():
    spec = dataclasses.replace(SPEC, autoscaling=Autoscaling(min_replicas=1, max_replicas=3, target_cpu_percent=70))
    metric = hpa_manifest(spec)["spec"]["metrics"][0]
    assert metric == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
    }
    both = Autoscaling(min_replicas=1, max_replicas=3, target_cpu_percent=70, target_queue_time_us=10)
    with pytest.raises(InvalidInput):
        hpa_manifest(dataclasses.replace(SPEC, autoscaling=both))


def test_pod_monitor_scrapes_the_metrics_port_of_the_deployments_pods():
    monitor = pod_monitor_manifest(SPEC)
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["selector"]["matchLabels"] == deployment_manifest(SPEC)["spec"]["selector"]["matchLabels"]
    assert monitor["metadata"]["labels"] == labels(SPEC)


@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_pods_may_read_the_store_as_a_service_account_without_credentials(version):
    spec = dataclasses.replace(
        SPEC, s3_secret_name="", service_account="triton-reader", environment={"AWS_DEFAULT_REGION": "eu-west-1"}
    )
    manifest = deployment_manifest(spec)
    kubernetes_validate.validate(manifest, version, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "triton-reader"
    container = pod["containers"][0]
    assert "envFrom" not in container
    assert {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"} in container["env"]


def test_network_policy_admits_conch_on_every_port_and_monitoring_on_metrics_only():
    # when
    policy = network_policy_manifest(SPEC, conch=CONCH_PODS, monitoring=PROMETHEUS)

    # then: it selects exactly the deployment's pods, and denies any ingress no rule names
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"] == {"name": object_name(SPEC), "namespace": "models", "labels": labels(SPEC)}
    assert policy["spec"]["podSelector"] == deployment_manifest(SPEC)["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: the pods read the store
    assert policy["spec"]["ingress"] == [
        {
            # no namespaceSelector: Conch's pods in the deployment's own namespace only
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "conch"}}}],
            "ports": [
                {"protocol": "TCP", "port": 8000},
                {"protocol": "TCP", "port": 8001},
                {"protocol": "TCP", "port": 8002},
            ],
        },
        {
            "from": [
                {
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8002}],
        },
    ]
    container_ports = deployment_manifest(SPEC)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {port["name"]: port["containerPort"] for port in container_ports} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }


def test_network_policy_with_empty_pod_selectors_admits_every_pod_of_the_selected_namespaces():
    # given: Conch runs in a namespace of its own, and every pod of the monitoring namespace may scrape
    conch = PeerSelector(namespace_labels={"kubernetes.io/metadata.name": "conch"})
    monitoring = PeerSelector(namespace_labels={"team": "observability"})

    # when
    policy = network_policy_manifest(SPEC, conch=conch, monitoring=monitoring)

    # then
    kubernetes_validate.validate(policy, VERSIONS[-1], strict=True)
    assert [rule["from"] for rule in policy["spec"]["ingress"]] == [
        [
            {
                "podSelector": {"matchLabels": {}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "conch"}},
            }
        ],
        [{"podSelector": {"matchLabels": {}}, "namespaceSelector": {"matchLabels": {"team": "observability"}}}],
    ]

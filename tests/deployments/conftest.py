"""Fixtures for deployment tests: a built classifier version, written the way a build writes it (`devtools.seed`), and
`k8s_env`: the test cluster registered as `local` with storage on the test S3 server."""

from __future__ import annotations

import pytest

from builds.model_config import BuildOptions
from deployments.runtimes import get_runtime
from deployments.services.clusters import register_cluster
from devtools.seed import add_constant, write_built_version
from models_registry.models import ModelVersion
from tests import real_models

# `write_built_version` (a version stored as built, no verify Triton) lives in the development tooling, which
# bench/reconcile.py uses too; the tests import it from here.


def write_adder_versions(team, folder) -> list[ModelVersion]:
    """Built versions 1 (y = x + 1) and 2 (y = x + 2) of model `adder` (x, y FP32 [batch, 4], batches up to 4),
    their ONNX files written under `folder`: two versions whose answers tell them apart."""
    return [
        write_built_version(
            team, "adder", add_constant(folder / f"v{n}.onnx", float(n)), BuildOptions(max_batch_size=4)
        )
        for n in (1, 2)
    ]


@pytest.fixture
def built_classifier(alice) -> ModelVersion:
    return write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))


def close_edge_connections() -> None:
    """Close this process's inference edge's keep-alive connections to the Tritons it relayed to: a Triton told to
    stop (its pod deleted) waits for open connections up to --exit-timeout-secs (30 s) before it exits."""
    from deployments.services import inference

    if inference._edge is not None:
        inference._edge.run(inference._edge.relay.close())


@pytest.fixture
def k8s_env(settings, s3_server, s3_bucket, kube_cluster, alice):
    """S3 storage on the test S3 server and cluster `local` registered from the test cluster's kubeconfig."""
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key
    register_cluster(name="local", kubeconfig=kube_cluster.kubeconfig_path.read_text(), namespace="conch")
    yield kube_cluster
    close_edge_connections()
    # Nothing a test started outlives it: every workload of this installation goes (the cluster is shared).
    runtime = get_runtime("kubernetes")
    for workload in runtime.list_owned():
        runtime.delete(workload.state)

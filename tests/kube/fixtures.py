"""The `kube_cluster` fixture: one local Kubernetes test cluster (`devtools.cluster`) for the test session.

It yields the running `Cluster`: `kubeconfig_path` (absolute), `namespace` ("conch"), `api_client()` (a new
`kubernetes.client.ApiClient` as the cluster admin), `stop_apiserver()` / `start_apiserver()` (the API server down
and back, same port and data), and `kubelet` (the test kubelet; `running_processes()` lists its containers' pids).
Probe periods run at a fifth of the manifests' values and the crash-loop back-off starts at 1 s instead of 10 s,
so tests do not wait on a kubelet's real timers; thresholds and the order of events are unchanged.

When the Kubernetes binaries are missing and cannot be built (no apt with deb-src access), tests that use the
fixture fail with the reason when `CI` is set and are skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from devtools.cluster import REPO_ROOT, Cluster, ClusterError, ensure_binaries

# One folder per test process: two sessions on one machine (or one checkout) run clusters of their own.
STATE_DIR = REPO_ROOT / "var" / "test" / f"kube-cluster-{os.getpid()}"


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[Cluster]:
    """Start etcd, the control plane, three fake Nodes and the test kubelet; stop them after the session."""
    try:
        bin_dir = ensure_binaries()
    except ClusterError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the Kubernetes test cluster cannot run: {exc}")
        pytest.skip(f"the Kubernetes test cluster cannot run: {exc}")
    cluster = Cluster(STATE_DIR, bin_dir=bin_dir, backoff_base_s=1.0, probe_scale=0.2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(STATE_DIR, ignore_errors=True)

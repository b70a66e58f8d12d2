"""The local Kubernetes test cluster (development tooling, docs/test-cluster.md): real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from Debian's source package (`build.sh`), fake GPU Nodes, and the
test kubelet (`kubelet.py`) that runs their pods as local Tritons.

One harness for every user: the `kube_cluster` pytest fixture (tests/kube/fixtures.py), bench/reconcile.py, and
`make cluster` (`python -m devtools.cluster`). Nothing here imports `tests`; no product code imports this.
"""

from devtools.cluster.control_plane import (
    NAMESPACE,
    NODES,
    REPO_ROOT,
    Cluster,
    ClusterError,
    FakeNode,
    ensure_binaries,
    free_port,
)

__all__ = ["NAMESPACE", "NODES", "REPO_ROOT", "Cluster", "ClusterError", "FakeNode", "ensure_binaries", "free_port"]

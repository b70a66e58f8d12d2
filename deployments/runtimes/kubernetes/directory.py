"""The clusters the Kubernetes runtime may use: `Cluster` registrations read as `ClusterAccess` (kubeconfig
decrypted in memory only, never written anywhere)."""

from __future__ import annotations

import hashlib

import yaml

from conch.crypto import decrypt_text
from conch.errors import NotFound
from deployments.models import Cluster
from deployments.runtimes.kubernetes.api import ClusterAccess
from deployments.runtimes.kubernetes.runtime import ClusterDirectory

__all__ = ["RegisteredClusters", "access_of"]


def access_of(cluster: Cluster) -> ClusterAccess:
    """`ClusterAccess` of a registration. Raises `conch.crypto.SecretUnreadable` when its kubeconfig cannot be
    decrypted (the encryption keys changed)."""
    kubeconfig = None if cluster.in_cluster else yaml.safe_load(decrypt_text(cluster.kubeconfig_encrypted))
    fingerprint = hashlib.sha256(
        f"{cluster.pk}:{cluster.updated_at.isoformat()}:{cluster.kubeconfig_encrypted}".encode()
    ).hexdigest()[:16]
    return ClusterAccess(
        name=cluster.name,
        namespace=cluster.namespace,
        kubeconfig=kubeconfig,
        context=cluster.context,
        in_cluster=cluster.in_cluster,
        triton_image=cluster.triton_image,
        image_pull_secrets=tuple(cluster.image_pull_secrets or ()),
        s3_endpoint=cluster.s3_endpoint,
        s3_secret_name=cluster.s3_secret_name,
        pod_service_account=cluster.pod_service_account,
        fingerprint=fingerprint,
    )


class RegisteredClusters(ClusterDirectory):
    """Clusters registered in Conch's database (`manage.py register_cluster`, the admin)."""

    def get(self, name: str) -> ClusterAccess:
        """Raises NotFound (field `cluster`) for a name that is not registered."""
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise NotFound(
                f"There is no cluster {name!r}; register it with manage.py register_cluster.", field="cluster"
            )
        return access_of(cluster)

    def all(self) -> list[ClusterAccess]:
        return [access_of(cluster) for cluster in Cluster.objects.all()]

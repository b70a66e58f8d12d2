"""What deployments tell the model registry about the versions they use, so a version in use is never deleted.

Registered from DeploymentsConfig.ready (`register_version_user`): a deployment not `stopped` uses the version it
serves and the one a hot update is moving it to; a stopped deployment only remembers its version, and goes with it
(its own repository first, then its row and metric samples).
"""

from __future__ import annotations

from django.db.models import Q

from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from deployments.services.repository import delete_deployment_repository
from models_registry.deletion import VersionUse, VersionUser, register_version_user


def _naming(version_ids: list[int]) -> Q:
    return Q(model_version_id__in=version_ids) | Q(target_model_version_id__in=version_ids)


def deployments_using(version_ids: list[int]) -> list[VersionUse]:
    """Deployments not stopped that serve one of `version_ids` or are being updated to one, oldest first."""
    rows = (
        Deployment.objects.filter(_naming(version_ids))
        .exclude(status=DeploymentStatus.STOPPED)
        .order_by("pk")
        .values_list("pk", "name", "model_version_id", "target_model_version_id", "status")
    )
    return [
        VersionUse(
            kind="deployment",
            id=pk,
            name=name,
            version_id=current if current in version_ids else target,
            ending=status == DeploymentStatus.STOPPING,
        )
        for pk, name, current, target, status in rows
    ]


def forget_versions(version_ids: list[int]) -> None:
    """Remove the stopped deployments of `version_ids` (repository, then row); a stopped one that was only being
    updated to one of them forgets that target. Idempotent; raises Unavailable when the store fails."""
    stopped = Deployment.objects.filter(status=DeploymentStatus.STOPPED)
    stopped.filter(target_model_version_id__in=version_ids).exclude(model_version_id__in=version_ids).update(
        target_model_version=None
    )
    for deployment_id in stopped.filter(model_version_id__in=version_ids).values_list("pk", flat=True):
        delete_deployment_repository(deployment_id=deployment_id)
        Deployment.objects.filter(pk=deployment_id, status=DeploymentStatus.STOPPED).delete()


def register_version_users() -> None:
    """Tell the registry how deployments use model versions (from AppConfig.ready)."""
    register_version_user(VersionUser(kind="deployment", uses=deployments_using, forget=forget_versions))

"""Where a team can deploy now: the runtimes this installation offers, the registered clusters with the GPUs their
Nodes offer, and the team's quota use; what a deploy form shows before anything is submitted.

Nothing is decided here that `create_deployment` decides again: whether a request fits is asked of
`check_deployment_fits`, which runs the create's own checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings

from conch.errors import InvalidInput
from deployments.choices import RuntimeName
from deployments.runtimes.kubernetes.runtime import pod_repository_location
from deployments.runtimes.local import local_gpu_count
from deployments.services.clusters import describe_cluster, list_clusters
from deployments.services.records import ENABLED_RUNTIMES
from models_registry.storage import get_object_store
from tenancy.quotas import FIELDS, team_usage
from tenancy.services import TokenGrant, get_team_for_user

if TYPE_CHECKING:
    from django.contrib.auth.models import User

__all__ = ["deployment_offers"]

_RUNTIME_LABELS = {
    RuntimeName.LOCAL: "This machine (a local Triton on the worker host)",
    RuntimeName.KUBERNETES: "A Kubernetes cluster (Triton pods)",
}


def deployment_offers(*, user: User, team_slug: str, token: TokenGrant | None = None) -> dict[str, Any]:
    """What `team_slug`'s deploy form offers, for a caller who may see the team (NotFound otherwise).

    Returns {"runtimes": [{"name", "label", "available", "reason"}], "clusters": [describe_cluster(...) each: name,
    namespace, gpu_offers (product, resource, mig_profile, most_on_one_node, total, nodes) or error],
    "quota": [{"field", "name", "unit", "limit", "used", "free", "is_default"}], "instance_kinds": {"local": [...],
    "kubernetes": [...]} each [{"kind" ("" = as built), "label", "available", "reason"}] (KIND_GPU: locally only
    with a GPU on the worker host, on kubernetes only when a cluster offers GPUs)}. A cluster that does not answer
    is listed with its `error` (one API request per cluster).
    """
    team = get_team_for_user(user=user, slug=team_slug, token=token)
    kubernetes_reason = ""
    try:
        pod_repository_location(get_object_store().triton_repository_location("check"), "")
    except InvalidInput as exc:
        kubernetes_reason = exc.detail
    clusters = list_clusters()
    if not clusters and not kubernetes_reason:
        kubernetes_reason = "No cluster is registered; a platform admin registers one (manage.py register_cluster)."
    runtimes = []
    for name in ENABLED_RUNTIMES:
        reason = kubernetes_reason if name == RuntimeName.KUBERNETES else ""
        runtimes.append({"name": str(name), "label": _RUNTIME_LABELS[name], "available": not reason, "reason": reason})
    quota = [
        {
            "field": line.field,
            "name": FIELDS[line.field][3],
            "unit": line.unit,
            "limit": line.limit,
            "used": line.used,
            "free": max(0, line.limit - line.used),
            "is_default": line.is_default,
        }
        for line in team_usage(team=team)
    ]
    described = [describe_cluster(cluster) for cluster in clusters] if not kubernetes_reason else []
    return {
        "team": team.slug,
        "runtimes": runtimes,
        "clusters": described,
        "quota": quota,
        "instance_kinds": {
            "local": _instance_kinds(local_gpu_reason()),
            "kubernetes": _instance_kinds(
                ""
                if any(cluster.get("gpu_offers") for cluster in described)
                else "no registered cluster offers GPUs to pods"
            ),
        },
    }


def local_gpu_reason() -> str:
    """Why GPU instances cannot run on the local runtime ("" when the worker host has a GPU)."""
    if local_gpu_count() > 0:
        return ""
    if settings.CONCH_LOCAL_GPUS == "auto":
        return "this machine has no GPU (no /dev/nvidia device found; CONCH_LOCAL_GPUS=auto)"
    return f"this machine is set up without GPUs (CONCH_LOCAL_GPUS={settings.CONCH_LOCAL_GPUS})"


def _instance_kinds(gpu_reason: str) -> list[dict[str, Any]]:
    """The instance kinds a deploy form offers (`check_instance_kind` decides): "" keeps the build's kind."""
    return [
        {
            "kind": "",
            "label": "as built (KIND_AUTO: Triton picks: GPU when there is one, else CPU)",
            "available": True,
            "reason": "",
        },
        {"kind": "KIND_CPU", "label": "KIND_CPU: model instances on the CPU", "available": True, "reason": ""},
        {
            "kind": "KIND_GPU",
            "label": "KIND_GPU: model instances on the GPU",
            "available": not gpu_reason,
            "reason": gpu_reason,
        },
    ]

"""What deployments count against their team's quotas (`tenancy.quotas`), and what one deployment requests.

- `deployments`: the team's deployments that are not `stopped` (a deployment is `stopped` only once its
  workload is gone: its Triton process has exited, or its Kubernetes objects are deleted).
- `instances`: model instances of local deployments not `stopped`, the sum of the instance group counts of each
  one's effective model configuration (Triton "Instance Groups").
- `gpu`: over Kubernetes deployments not `stopped`, pods × GPUs per pod, pods being `replicas`, or
  `autoscaling.max_replicas` with autoscaling; whole GPUs count as `nvidia.com/gpu`, a MIG slice as one
  `nvidia.com/mig-<profile>` (a separate count per profile, each against the team's GPU limit).
- `storage_bytes` (its part; uploads and builds count theirs): the bytes of each deployment's own model repository
  (`Deployment.repository_bytes`: reserved when the deployment is created or a hot update asked for, then measured
  once written), stopped deployments included until their repository is deleted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db.models import Count, QuerySet, Sum

from deployments.choices import DeploymentStatus, RuntimeName
from deployments.models import Deployment
from tenancy.quotas import register_usage_counter
from tritonserving.config import ModelConfig, config_from_pbtxt

if TYPE_CHECKING:
    from tenancy.models import Team


def gpu_request(
    *, replicas: int, autoscaling: Mapping[str, Any] | None, gpu: Mapping[str, Any] | None
) -> dict[str, int]:
    """GPUs a Kubernetes deployment may hold at most: {resource name: count}; empty for CPU only.

    Autoscaling counts at `max_replicas`, since the autoscaler may scale up to it without asking Conch.
    """
    if not gpu:
        return {}
    pods = autoscaling["max_replicas"] if autoscaling else replicas
    if gpu.get("mig_profile"):
        return {f"nvidia.com/mig-{gpu['mig_profile']}": pods}
    return {"nvidia.com/gpu": pods * int(gpu.get("count") or 0)}


def instance_request(config: ModelConfig) -> int:
    """Model instances a configuration runs: the sum of its instance group counts (a group's count 0 means 1)."""
    return sum(group.count or 1 for group in config.instance_group) or 1


def _active(team_ids: Sequence[int]) -> QuerySet[Deployment]:
    return Deployment.objects.filter(team_id__in=team_ids).exclude(status=DeploymentStatus.STOPPED).order_by()


# Each count is written once, for many teams (one query; the admin's page of teams); a single team's count, used
# under the quota lock, is the same function asked about one team.


def count_teams_deployments(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    rows = _active(team_ids).values("team_id").annotate(n=Count("pk")).values_list("team_id", "n")
    return {team_id: {"deployments": n} for team_id, n in rows}


def count_teams_instances(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    total: Counter[int] = Counter()
    rows = _active(team_ids).filter(runtime=RuntimeName.LOCAL).values_list("team_id", "config_pbtxt")
    for team_id, text in rows:
        if text:
            total[team_id] += instance_request(config_from_pbtxt(text))
    return {team_id: {"model instances": n} for team_id, n in total.items()}


def count_teams_gpus(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    total: defaultdict[int, Counter[str]] = defaultdict(Counter)
    rows = _active(team_ids).filter(runtime=RuntimeName.KUBERNETES, gpu__isnull=False)
    for team_id, replicas, autoscaling, gpu in rows.values_list("team_id", "replicas", "autoscaling", "gpu"):
        total[team_id].update(gpu_request(replicas=replicas, autoscaling=autoscaling, gpu=gpu))
    return {team_id: dict(units) for team_id, units in total.items()}


def count_teams_repository_bytes(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    rows = (
        Deployment.objects.filter(team_id__in=team_ids, repository_bytes__gt=0)
        .order_by()
        .values("team_id")
        .annotate(total=Sum("repository_bytes"))
        .values_list("team_id", "total")
    )
    return {team_id: {"bytes of storage": total or 0} for team_id, total in rows}


def count_team_repository_bytes(team: Team) -> dict[str, int]:
    return count_teams_repository_bytes([team.pk]).get(team.pk, {"bytes of storage": 0})


def count_team_deployments(team: Team) -> dict[str, int]:
    return count_teams_deployments([team.pk]).get(team.pk, {"deployments": 0})


def count_team_instances(team: Team) -> dict[str, int]:
    return count_teams_instances([team.pk]).get(team.pk, {"model instances": 0})


def count_team_gpus(team: Team) -> dict[str, int]:
    return count_teams_gpus([team.pk]).get(team.pk, {})


def register_quota_counters() -> None:
    """Tell tenancy how this app's quotas are counted (from AppConfig.ready)."""
    register_usage_counter("deployments", count_team_deployments, for_teams=count_teams_deployments)
    register_usage_counter("instances", count_team_instances, for_teams=count_teams_instances)
    register_usage_counter("gpu", count_team_gpus, for_teams=count_teams_gpus)
    register_usage_counter("storage_bytes", count_team_repository_bytes, for_teams=count_teams_repository_bytes)

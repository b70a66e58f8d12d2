"""What deployments count against their team's quotas (`tenancy.quotas`), and what one deployment requests.

- `deployments`: the team's deployments that are not `stopped` (a deployment is `stopped` only once its
  workload is gone: its Triton process has exited, or its Kubernetes objects are deleted).
- `instances`: model instances of local deployments not `stopped`, the sum of the instance group counts of each
  one's effective model configuration (Triton "Instance Groups").
- `gpu`: over Kubernetes deployments not `stopped`, pods × GPUs per pod, pods being `replicas`, or
  `autoscaling.max_replicas` with autoscaling; whole GPUs count as `nvidia.com/gpu`, a MIG slice as one
  `nvidia.com/mig-<profile>` (a separate count per profile, each against the team's GPU limit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from deployments.choices import DeploymentStatus, RuntimeName
from deployments.models import Deployment
from tenancy.quotas import register_usage_counter
from tritonserving.config import ModelConfig, config_from_pbtxt


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


def _active(team: Any):
    return Deployment.objects.filter(team=team).exclude(status=DeploymentStatus.STOPPED)


def count_team_deployments(team: Any) -> dict[str, int]:
    return {"deployments": _active(team).count()}


def count_team_instances(team: Any) -> dict[str, int]:
    configs = _active(team).filter(runtime=RuntimeName.LOCAL).values_list("config_pbtxt", flat=True)
    return {"model instances": sum(instance_request(config_from_pbtxt(text)) for text in configs if text)}


def count_team_gpus(team: Any) -> dict[str, int]:
    total: Counter[str] = Counter()
    rows = _active(team).filter(runtime=RuntimeName.KUBERNETES, gpu__isnull=False)
    for replicas, autoscaling, gpu in rows.values_list("replicas", "autoscaling", "gpu"):
        total.update(gpu_request(replicas=replicas, autoscaling=autoscaling, gpu=gpu))
    return dict(total)


def register_quota_counters() -> None:
    """Tell tenancy how this app's quotas are counted (from AppConfig.ready)."""
    register_usage_counter("deployments", count_team_deployments)
    register_usage_counter("instances", count_team_instances)
    register_usage_counter("gpu", count_team_gpus)

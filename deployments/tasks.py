"""Celery tasks of the deployments app: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from deployments import observe, services

# No max_retries: these tasks never retry (no autoretry_for, no self.retry); a failed start is retried by
# the periodic reconcile instead.
_COMMON = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(name="deployments.start_deployment", **_COMMON)
def start_deployment(deployment_id: int) -> str:
    """Start (or adopt) the deployment's Triton and load its model."""
    return services.ensure_deployment_started(deployment_id=deployment_id)


@shared_task(name="deployments.stop_deployment", **_COMMON)
def stop_deployment(deployment_id: int) -> None:
    """Stop the deployment's Triton and free its ports."""
    services.stop_deployment(deployment_id=deployment_id)


@shared_task(name="deployments.update_model_version", **_COMMON)
def update_model_version(deployment_id: int) -> str:
    """Move the deployment's servers to its target model version without restarting them."""
    return services.ensure_model_version_updated(deployment_id=deployment_id)


@shared_task(name="deployments.reconcile_deployments", **_COMMON)
def reconcile_deployments() -> dict[str, int]:
    """Periodic: compare deployments with their processes, restart failed ones, kill orphans."""
    return services.reconcile_deployments()


@shared_task(name="deployments.scrape_metrics", **_COMMON)
def scrape_metrics() -> int:
    """Periodic: scrape every ready deployment's Triton /metrics."""
    return observe.scrape_ready_deployments()


@shared_task(name="deployments.prune_metric_samples", **_COMMON)
def prune_metric_samples() -> int:
    """Periodic: delete metric samples older than the retention."""
    return observe.prune_metric_samples()


@shared_task(name="deployments.collect_repository_garbage", **_COMMON)
def collect_repository_garbage() -> int:
    """Periodic: delete build repositories that neither their version nor any deployment uses."""
    return services.collect_repository_garbage()


@shared_task(name="deployments.advance_tensorrt_plan", **_COMMON)
def advance_tensorrt_plan(plan_id: int) -> str:
    """Move one TensorRT plan on: create its Job, or read what the Job did."""
    return services.advance_tensorrt_plan(plan_id=plan_id)


@shared_task(name="deployments.advance_tensorrt_plans", **_COMMON)
def advance_tensorrt_plans() -> int:
    """Periodic: move every TensorRT plan that is not finished on (heals a task lost with its worker)."""
    return services.advance_tensorrt_plans()

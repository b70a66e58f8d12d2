"""Deployment lifecycle: create, start, update, reconcile, stop, infer; runtime-agnostic.

A deployment says what to serve (a built model version, pinned to the repository prefix its build wrote), how
(instances, batching: the effective model configuration) and where (a runtime, see `deployments.runtimes`).
Starting and reconciling talk to the runtime only through its interface; no database lock is held while a
runtime spawns, stops or waits on a server, or while the network is used.
"""

from deployments.services.clusters import describe_cluster, get_cluster, list_clusters
from deployments.services.gateway import gateway_address, gateway_usage
from deployments.services.inference import infer
from deployments.services.lifecycle import (
    collect_repository_garbage,
    deployment_spec,
    ensure_deployment_started,
    reconcile_deployments,
    restart_backoff_seconds,
    stop_all_local_servers,
    stop_deployment,
)
from deployments.services.offers import deployment_offers
from deployments.services.plans import (
    advance_tensorrt_plan,
    advance_tensorrt_plans,
    delete_tensorrt_plan,
    get_tensorrt_plan,
    request_tensorrt_plan,
    visible_plans,
)
from deployments.services.records import (
    ENABLED_RUNTIMES,
    LOG_TAIL_LINES,
    DeploymentPlan,
    check_deployment_fits,
    create_deployment,
    deployment_events,
    effective_settings,
    endpoints,
    get_deployment,
    internal_url,
    log_tail,
    plan_deployment,
    request_stop,
    require_deployment_access,
    rescale_deployment,
    serving_servers,
    visible_deployments,
)
from deployments.services.repository import deployment_repository_prefix, ensure_deployment_repository
from deployments.services.requests import DeploymentRequest, PlacementRequest
from deployments.services.updates import (
    ensure_model_version_updated,
    ensure_servers_serve_current_version,
    update_deployment,
    update_model_version,
)

__all__ = [
    "advance_tensorrt_plan",
    "advance_tensorrt_plans",
    "delete_tensorrt_plan",
    "get_tensorrt_plan",
    "request_tensorrt_plan",
    "visible_plans",
    "DeploymentRequest",
    "PlacementRequest",
    "ENABLED_RUNTIMES",
    "LOG_TAIL_LINES",
    "DeploymentPlan",
    "check_deployment_fits",
    "collect_repository_garbage",
    "gateway_address",
    "gateway_usage",
    "create_deployment",
    "deployment_events",
    "describe_cluster",
    "get_cluster",
    "list_clusters",
    "deployment_offers",
    "deployment_repository_prefix",
    "deployment_spec",
    "effective_settings",
    "endpoints",
    "ensure_deployment_repository",
    "ensure_deployment_started",
    "ensure_model_version_updated",
    "ensure_servers_serve_current_version",
    "get_deployment",
    "plan_deployment",
    "infer",
    "internal_url",
    "log_tail",
    "reconcile_deployments",
    "request_stop",
    "require_deployment_access",
    "rescale_deployment",
    "serving_servers",
    "restart_backoff_seconds",
    "stop_all_local_servers",
    "stop_deployment",
    "update_deployment",
    "update_model_version",
    "visible_deployments",
]

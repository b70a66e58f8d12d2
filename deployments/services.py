"""Deployment lifecycle: create, start, reconcile, stop, infer; runtime-agnostic.

A deployment says what to serve (a built model version, pinned to the repository prefix its build wrote), how
(instances, batching: the effective model configuration) and where (a runtime, see `deployments.runtimes`).
Starting and reconciling talk to the runtime only through its interface; no database lock is held while a
runtime spawns, stops or waits on a server, or while the network is used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from builds import services as builds
from builds.model_config import apply_deployment_overrides, parse_build_options
from builds.services import stop_verify_servers
from conch.errors import ConchError, Conflict, InvalidInput, NotFound
from deployments.choices import DeploymentStatus, DesiredState, RuntimeName
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.runtimes.base import DeploymentSpec, Endpoints, Phase, Runtime
from models_registry.choices import VersionStatus
from models_registry.naming import validate_model_name
from models_registry.services import get_version
from models_registry.storage import get_object_store
from tenancy.services import get_team_for_user, teams_for_user
from tritonserving.client import InferenceResponse, TritonClient
from tritonserving.config import config_from_pbtxt, config_to_json, config_to_pbtxt

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
#: Runtimes this installation can run deployments on.
ENABLED_RUNTIMES = (RuntimeName.LOCAL,)


# --- queries ---------------------------------------------------------------------


def visible_deployments(*, user: AbstractBaseUser) -> QuerySet[Deployment]:
    """Deployments of the caller's teams."""
    return Deployment.objects.filter(team__in=teams_for_user(user=user)).select_related("team", "model_version__model")


def get_deployment(*, user: AbstractBaseUser, deployment_id: int) -> Deployment:
    """Return a deployment the caller may see. Raises NotFound."""
    deployment = visible_deployments(user=user).filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(f"Deployment {deployment_id} does not exist or is not in one of your teams.")
    return deployment


def log_tail(deployment: Deployment, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of the deployment's Triton log (empty when there is none yet)."""
    return get_runtime(deployment.runtime).log_tail(deployment.runtime_state, lines)


def endpoints(deployment: Deployment) -> Endpoints:
    """Where clients reach the deployment's Triton; empty while it is not starting or ready."""
    if deployment.status not in (DeploymentStatus.STARTING, DeploymentStatus.READY):
        return Endpoints()
    return get_runtime(deployment.runtime).endpoints(deployment.runtime_state)


def internal_url(deployment: Deployment, port: str = "http", path: str = "") -> str:
    """URL by which Conch's own processes reach the deployment's Triton `port` ("http", "metrics") + `path`."""
    return get_runtime(deployment.runtime).internal_url(deployment.runtime_state, port, path)


def effective_settings(deployment: Deployment) -> dict[str, Any]:
    """Batching and instance settings of the deployment's effective model configuration.

    Returns max_batch_size, instance_count (summed over instance groups), dynamic_batching
    (bool) and max_queue_delay_microseconds (None without a dynamic batcher).
    """
    if not deployment.config_pbtxt:
        return {}
    config = config_from_pbtxt(deployment.config_pbtxt)
    batching = config.HasField("dynamic_batching")
    return {
        "max_batch_size": config.max_batch_size,
        "instance_count": sum(group.count or 1 for group in config.instance_group) or 1,
        "dynamic_batching": batching,
        "max_queue_delay_microseconds": config.dynamic_batching.max_queue_delay_microseconds if batching else None,
    }


# --- create / delete ---------------------------------------------------------------


def create_deployment(
    *,
    user: AbstractBaseUser,
    team_slug: str,
    name: str,
    model_version_id: Any,
    runtime: str = RuntimeName.LOCAL,
    instance_count: Any = None,
    max_batch_size: Any = None,
    max_queue_delay_microseconds: Any = None,
) -> Deployment:
    """Create a deployment of a built model version and queue its start.

    `max_batch_size` and `max_queue_delay_microseconds` override the version's model
    configuration (Triton "Model Configuration": max_batch_size, dynamic_batching
    max_queue_delay_microseconds); `instance_count` sets the instance group count
    (concurrent model execution). Raises InvalidInput naming the field, NotFound for a
    team or version the caller cannot see, Conflict for a version that is not built or
    a name already used by an active deployment of the team.
    """
    validate_model_name(name)
    team = get_team_for_user(user=user, slug=team_slug)
    if runtime not in RuntimeName.values:
        raise InvalidInput(f"runtime must be one of {', '.join(RuntimeName.values)}.", field="runtime")
    if runtime not in ENABLED_RUNTIMES:
        raise InvalidInput(
            f"The '{runtime}' runtime is not enabled on this installation; use 'local'.", field="runtime"
        )
    try:
        version_id = int(model_version_id)
    except (TypeError, ValueError):
        raise InvalidInput("model_version must be the id of a model version.", field="model_version") from None
    try:
        version = get_version(user=user, version_id=version_id)
    except NotFound as exc:
        raise NotFound(exc.detail, field="model_version") from None
    if version.model.team_id != team.pk:
        raise InvalidInput(
            f"Model version {version_id} belongs to team '{version.model.team.slug}', not '{team.slug}'.",
            field="model_version",
        )
    if version.status != VersionStatus.BUILT:
        raise Conflict(
            f"Model version {version_id} is '{version.status}'; only a built version can be deployed"
            + (f" (build error: {version.error})" if version.error else "")
            + ".",
            field="model_version",
        )
    # One definition of the option bounds: the build's (builds.model_config MAX_* constants).
    overrides = parse_build_options(
        {
            "instance_count": instance_count,
            "max_batch_size": max_batch_size,
            "max_queue_delay_microseconds": max_queue_delay_microseconds,
        }
    )
    instance_count = overrides.instance_count
    max_batch_size = overrides.max_batch_size
    delay = overrides.max_queue_delay_microseconds
    config = apply_deployment_overrides(
        config_from_pbtxt(version.config_pbtxt),
        instance_count=instance_count,
        max_batch_size=max_batch_size,
        max_queue_delay_microseconds=delay,
    )
    try:
        with transaction.atomic():
            deployment = Deployment.objects.create(
                team=team,
                name=name,
                model_version=version,
                runtime=runtime,
                instance_count=instance_count or 1,
                max_batch_size=max_batch_size,
                max_queue_delay_microseconds=delay,
                config_pbtxt=config_to_pbtxt(config),
                repository_prefix=version.repository_prefix,
                created_by=user,
            )
            _queue_start(deployment.pk)
    except IntegrityError:
        raise Conflict(f"Team '{team.slug}' already has an active deployment named '{name}'.", field="name") from None
    log.info("deployment.created", extra={"deployment_id": deployment.pk})
    return deployment


def request_stop(*, deployment: Deployment) -> Deployment:
    """Ask for a deployment to stop; a task ends its Triton and frees its ports."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if deployment.status == DeploymentStatus.STOPPED:
            return deployment
        deployment.desired_state = DesiredState.STOPPED
        deployment.status = DeploymentStatus.STOPPING
        deployment.save(update_fields=["desired_state", "status", "updated_at"])
        pk = deployment.pk
        _queue_task("deployments.stop_deployment", pk)
    return deployment


def _queue_task(name: str, *args: object) -> None:
    """Queue a deployments task by its name once the transaction commits (tasks import this module)."""
    transaction.on_commit(lambda: current_app.signature(name, args=args).delay())


def _queue_start(deployment_id: int) -> None:
    _queue_task("deployments.start_deployment", deployment_id)


# --- runtime lifecycle -----------------------------------------------------------


def deployment_spec(deployment: Deployment) -> DeploymentSpec:
    """What the deployment's runtime should run: its pinned repository and effective configuration."""
    store = get_object_store()
    prefix = deployment.repository_prefix or deployment.model_version.repository_prefix
    return DeploymentSpec(
        deployment_id=deployment.pk,
        model_name=deployment.model_name,
        repository=store.triton_repository_location(prefix),
        config_json=config_to_json(config_from_pbtxt(deployment.config_pbtxt)),
        instance_count=deployment.instance_count,
        environment=store.triton_environment(),
    )


def _locked(deployment_id: int) -> Deployment:
    return (
        Deployment.objects.select_for_update(of=("self",)).select_related("model_version__model").get(pk=deployment_id)
    )


def _heartbeat_is_fresh(deployment: Deployment, now: datetime) -> bool:
    limit = timedelta(seconds=settings.CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS)
    return deployment.heartbeat_at is not None and now - deployment.heartbeat_at < limit


def _touch(deployment_id: int) -> Callable[[], None]:
    def heartbeat() -> None:
        Deployment.objects.filter(pk=deployment_id).update(heartbeat_at=timezone.now())

    return heartbeat


def ensure_deployment_started(*, deployment_id: int) -> str:
    """Bring a deployment to `ready`: apply its spec on its runtime, wait for it, load the model.

    Idempotent: a ready deployment, or one another task is starting (fresh heartbeat), is left alone; a server
    that still runs is adopted, not duplicated. Returns the resulting status. A start that fails marks the
    deployment `failed` with the runtime's message and Triton's last log lines; `permanent_failure` is set when
    Triton refused the model (reconcile then stops retrying).
    """
    now = timezone.now()
    with transaction.atomic():
        deployment = _locked(deployment_id)
        runtime = get_runtime(deployment.runtime)
        if deployment.desired_state != DesiredState.RUNNING or not runtime.manages_here(deployment.runtime_state):
            return deployment.status
        if deployment.status == DeploymentStatus.READY:
            return deployment.status
        if deployment.status == DeploymentStatus.STARTING and _heartbeat_is_fresh(deployment, now):
            return deployment.status
        deployment.status = DeploymentStatus.STARTING
        deployment.heartbeat_at = now
        deployment.error = ""
        deployment.save(update_fields=["status", "heartbeat_at", "error", "updated_at"])
        spec = deployment_spec(deployment)
        previous_state = deployment.runtime_state
    try:
        state = runtime.apply(spec, previous_state)
    except ConchError as exc:
        _record_failure(deployment_id, f"Triton could not be started: {exc.detail}", state=None)
        return DeploymentStatus.FAILED
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.desired_state != DesiredState.RUNNING:
            transaction.on_commit(lambda: runtime.delete(state))
            return deployment.status
        deployment.runtime_state = state
        deployment.heartbeat_at = timezone.now()
        deployment.save(update_fields=["runtime_state", "heartbeat_at", "updated_at"])
    log.info("deployment.starting", extra={"deployment_id": deployment_id})
    observation = runtime.wait_until_ready(
        spec, state, timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS, heartbeat=_touch(deployment_id)
    )
    if observation.phase != Phase.READY:
        _record_failure(deployment_id, observation.message, state=state, permanent=observation.permanent)
        runtime.delete(state)
        return DeploymentStatus.FAILED
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.runtime_state != state or deployment.desired_state != DesiredState.RUNNING:
            return deployment.status
        deployment.status = DeploymentStatus.READY
        deployment.ready_at = timezone.now()
        deployment.permanent_failure = False
        deployment.save(update_fields=["status", "ready_at", "permanent_failure", "updated_at"])
    log.info("deployment.ready", extra={"deployment_id": deployment_id})
    return DeploymentStatus.READY


def _record_failure(
    deployment_id: int, message: str, *, state: dict | None, permanent: bool = False, expect_status: str | None = None
) -> bool:
    """Mark a deployment `failed` with `message` and Triton's last log lines; returns whether it did.

    Nothing is written when the deployment meanwhile runs another workload than `state` (None: any), is no
    longer wanted, or (with `expect_status`) has moved on.
    """
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if state is not None and deployment.runtime_state != state:
            return False
        if deployment.desired_state != DesiredState.RUNNING:
            return False
        if expect_status is not None and deployment.status != expect_status:
            return False
        tail = log_tail(deployment)
        text = message + ("\nLast lines of Triton's log:\n" + "\n".join(tail) if tail else "")
        deployment.status = DeploymentStatus.FAILED
        deployment.error = text
        deployment.last_failure = text
        deployment.failed_at = timezone.now()
        deployment.permanent_failure = permanent
        deployment.save(
            update_fields=["status", "error", "last_failure", "failed_at", "permanent_failure", "updated_at"]
        )
    log.warning("deployment.failed", extra={"deployment_id": deployment_id, "permanent": permanent})
    return True


def stop_deployment(*, deployment_id: int) -> None:
    """Delete a deployment's workload on its runtime (its ports are freed) and mark it `stopped`."""
    with transaction.atomic():
        deployment = _locked(deployment_id)
        deployment.desired_state = DesiredState.STOPPED
        if deployment.status != DeploymentStatus.STOPPED:
            deployment.status = DeploymentStatus.STOPPING
        deployment.save(update_fields=["desired_state", "status", "updated_at"])
        runtime, state = get_runtime(deployment.runtime), deployment.runtime_state
    if not runtime.manages_here(state):
        return  # the worker host that owns it stops it on its next reconcile
    runtime.delete(state)
    with transaction.atomic():
        deployment = _locked(deployment_id)
        deployment.status = DeploymentStatus.STOPPED
        deployment.save(update_fields=["status", "updated_at"])
    log.info("deployment.stopped", extra={"deployment_id": deployment_id})


def restart_backoff_seconds(restart_count: int) -> float:
    """Wait before restart number `restart_count + 1` of a failed deployment: 0 s, then 5 s doubling to 300 s."""
    if restart_count == 0:
        return 0.0
    return float(min(300, 5 * 2 ** (restart_count - 1)))


def reconcile_deployments() -> dict[str, int]:
    """Compare every deployment this worker host manages with what its runtime observes, and act.

    Run periodically by beat. For each deployment not stopped:
    - desired stopped: queue its stop (again, if the last stop task got lost);
    - `starting` with a stale heartbeat (the start task died): queue a start, which adopts the running server;
    - `pending` for a while (the start was never queued or got lost): queue a start;
    - `ready`: observe; a workload that is gone or whose model is not ready marks it `failed` with the
      runtime's message; ready for `CONCH_RESTART_BACKOFF_RESET_SECONDS` resets the restart count;
    - `failed` (not permanent): queue a restart after the backoff (`restart_backoff_seconds`).
    Deployments whose workload belongs to another worker host are left to that host. Then workloads of this
    installation that no running deployment owns (orphans) are deleted. Returns counts of what it did.
    """
    counts = {"failed": 0, "restarted": 0, "stopped": 0, "orphans_killed": 0}
    now = timezone.now()
    running_states: dict[str, list[dict]] = {}
    ids = list(Deployment.objects.exclude(status=DeploymentStatus.STOPPED).values_list("pk", flat=True))
    for deployment_id in ids:
        deployment = Deployment.objects.select_related("model_version__model").filter(pk=deployment_id).first()
        if deployment is None:
            continue
        runtime = get_runtime(deployment.runtime)
        if not runtime.manages_here(deployment.runtime_state):
            continue
        if deployment.desired_state == DesiredState.RUNNING:
            running_states.setdefault(deployment.runtime, []).append(deployment.runtime_state)
        action = _reconcile_one(deployment, runtime, now)
        if action:
            counts[action] += 1
    for name in ENABLED_RUNTIMES:
        runtime, states = get_runtime(name), running_states.get(name, [])
        for workload in runtime.list_owned():
            if any(runtime.same_workload(state, workload) for state in states):
                continue
            runtime.delete(workload.state)
            counts["orphans_killed"] += 1
            log.warning("deployment.orphan_killed", extra={"workload": workload.key})
    counts["orphans_killed"] += stop_verify_servers(only_abandoned=True)
    return counts


def _reconcile_one(deployment: Deployment, runtime: Runtime, now: datetime) -> str | None:
    """Reconcile one deployment (see `reconcile_deployments`); returns the count it adds to, if any."""
    pk = deployment.pk
    if deployment.desired_state == DesiredState.STOPPED:
        quiet = (now - deployment.updated_at).total_seconds() > settings.CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS
        if deployment.status != DeploymentStatus.STOPPING or quiet:
            with transaction.atomic():
                _queue_task("deployments.stop_deployment", pk)
            return "stopped"
        return None
    if deployment.status == DeploymentStatus.STARTING:
        if _heartbeat_is_fresh(deployment, now):
            return None
        log.warning("deployment.start_stalled", extra={"deployment_id": pk})
        with transaction.atomic():
            _queue_task("deployments.start_deployment", pk)
        return "restarted"
    if deployment.status == DeploymentStatus.PENDING:
        if (now - deployment.updated_at).total_seconds() > 15:
            # A start that was never queued or got lost (e.g. Conch was shut down); starting is idempotent.
            with transaction.atomic():
                _queue_task("deployments.start_deployment", pk)
            return "restarted"
        return None
    if deployment.status == DeploymentStatus.READY:
        observation = runtime.observe(deployment_spec(deployment), deployment.runtime_state)
        if observation.phase == Phase.READY:
            stable = (now - (deployment.ready_at or now)).total_seconds()
            if deployment.restart_count and stable >= settings.CONCH_RESTART_BACKOFF_RESET_SECONDS:
                Deployment.objects.filter(pk=pk, status=DeploymentStatus.READY).update(restart_count=0)
            return None
        if observation.phase == Phase.UNKNOWN:
            return None
        failed = _record_failure(
            pk,
            observation.message,
            state=deployment.runtime_state,
            permanent=observation.permanent,
            expect_status=DeploymentStatus.READY,
        )
        if not failed:
            return None
        log.warning("deployment.not_ready", extra={"deployment_id": pk, "phase": str(observation.phase)})
        deployment.refresh_from_db()
        _restart_if_due(deployment, now)
        return "failed"
    if deployment.status == DeploymentStatus.FAILED:
        return "restarted" if _restart_if_due(deployment, now) else None
    return None


def _restart_if_due(deployment: Deployment, now: datetime) -> bool:
    """Queue a restart of a failed deployment once its backoff has passed, unless the failure is permanent."""
    if deployment.permanent_failure:
        return False
    waited = max(0.0, (now - (deployment.failed_at or now)).total_seconds())
    if waited < restart_backoff_seconds(deployment.restart_count):
        return False
    with transaction.atomic():
        updated = Deployment.objects.filter(
            pk=deployment.pk, status=DeploymentStatus.FAILED, restart_count=deployment.restart_count
        ).update(restart_count=deployment.restart_count + 1, updated_at=now)
        if updated:
            _queue_task("deployments.start_deployment", deployment.pk)
    return bool(updated)


def collect_repository_garbage() -> int:
    """Delete repository prefixes of old build attempts that no deployment pins (see
    `builds.services.collect_repository_garbage`); returns how many prefixes were deleted."""
    pinned = set(
        Deployment.objects.exclude(status=DeploymentStatus.STOPPED)
        .exclude(repository_prefix="")
        .values_list("repository_prefix", flat=True)
    )
    return builds.collect_repository_garbage(keep=pinned)


def stop_all_local_servers() -> int:
    """Stop every Triton this Conch instance started on this host, when Conch itself shuts down (the demo's Ctrl-C).

    Deployments that should keep running go back to `pending` (not `failed`): the next reconcile after Conch
    starts again brings them up without counting a crash. Build verify servers are stopped too.
    """
    runtime = get_runtime("local")
    workloads = runtime.list_owned()
    for workload in workloads:
        runtime.delete(workload.state)
    stopped = len(workloads) + stop_verify_servers(only_abandoned=False)
    Deployment.objects.filter(runtime="local", desired_state=DesiredState.RUNNING).exclude(
        status=DeploymentStatus.STOPPED
    ).update(status=DeploymentStatus.PENDING, error="", heartbeat_at=None, updated_at=timezone.now())
    return stopped


# --- inference -------------------------------------------------------------------


def infer(*, deployment: Deployment, body: bytes, header_length: int | None = None) -> InferenceResponse:
    """Forward a KServe v2 / Open Inference Protocol request body to the deployment's Triton, unchanged.

    `body`: JSON, or (`header_length` set, Triton's `Inference-Header-Content-Length`) a JSON header followed by
    binary tensor data. Returns Triton's response as Triton wrote it (`InferenceResponse`). Raises Conflict when
    the deployment is not ready, InvalidInput naming the field or tensor at fault (Triton's own message when
    Triton rejects the request), Unavailable when Triton cannot be reached.
    """
    if deployment.status != DeploymentStatus.READY:
        raise Conflict(f"Deployment {deployment.pk} is '{deployment.status}', not ready.", field=None)
    client = TritonClient(internal_url(deployment), timeout_s=60)
    return client.infer_request_body(deployment.model_name, body, header_length=header_length)

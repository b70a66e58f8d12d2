"""Deployment lifecycle on its runtime: start (apply, wait, load), stop, reconcile, garbage collection.

Starting and reconciling talk to the runtime only through its interface (`deployments.runtimes`); no database
lock is held while a runtime spawns, stops or waits on a server, or while the network is used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from builds import services as builds
from builds.services import stop_verify_servers
from conch.errors import ConchError, Unavailable
from deployments.choices import DeploymentStatus, DesiredState
from deployments.models import Deployment
from deployments.runtimes import get_runtime
from deployments.runtimes.base import DeploymentSpec, OwnedWorkload, Phase, Runtime
from deployments.services import plans
from deployments.services.records import ENABLED_RUNTIMES, log_tail, queue_task
from deployments.services.repository import (
    collect_deployment_repositories,
    delete_deployment_repository,
    deployment_repository_prefix,
    ensure_deployment_repository,
    measure_unmeasured_repositories,
    served_config,
)
from deployments.services.updates import (
    UPDATES_IN_PROGRESS,
    ensure_servers_serve_current_version,
    update_is_stale,
)
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tritonserving.config import config_to_json

log = logging.getLogger(__name__)


def deployment_spec(deployment: Deployment) -> DeploymentSpec:
    """What the deployment's runtime should run: its own repository (`ensure_deployment_repository` fills it from
    the build it pins) and its effective configuration, serving exactly its current version."""
    store = get_object_store()
    return DeploymentSpec(
        deployment_id=deployment.pk,
        model_name=deployment.model_name,
        repository=store.triton_repository_location(deployment_repository_prefix(deployment.pk)),
        config_json=config_to_json(served_config(deployment)),
        instance_count=deployment.instance_count,
        environment=store.triton_environment(),
        team=deployment.team.slug,
        name=deployment.name,
        cluster=deployment.cluster.name if deployment.cluster is not None else "",
        replicas=deployment.replicas,
        autoscaling=deployment.autoscaling,
        gpu=deployment.gpu,
        cpu=deployment.cpu,
        memory=deployment.memory,
        backends=builds.custom_backends_of(
            deployment.model_version, repository_prefix=deployment.repository_prefix or None
        ),
    )


def _locked(deployment_id: int) -> Deployment:
    return (
        Deployment.objects.select_for_update(of=("self",))
        .select_related("model_version__model", "team", "cluster")
        .get(pk=deployment_id)
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
    Triton refused the model (reconcile then stops retrying). Ready clears `error` and `status_message`: a past
    failure stays in `last_failure` and the history (audit `deployment.failed`, then `deployment.recovered`).
    """
    now = timezone.now()
    kind = Deployment.objects.filter(pk=deployment_id).values_list("runtime", flat=True).first()
    if kind is not None and not get_runtime(kind).waits_for_ready:
        return _start_observed(deployment_id)
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
        deployment.status_message = "starting Triton and loading the model"
        deployment.save(update_fields=["status", "heartbeat_at", "error", "status_message", "updated_at"])
        spec = deployment_spec(deployment)
        previous_state = deployment.runtime_state
    if not _fill_repository(deployment):
        return DeploymentStatus.FAILED
    try:
        state = runtime.apply(spec, previous_state)
    except ConchError as exc:
        _record_failure(deployment_id, f"Triton could not be started: {exc.detail}", state=None)
        return DeploymentStatus.FAILED
    unwanted = _save_state(deployment_id, runtime, state)
    if unwanted is not None:
        return unwanted
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
        # Ready after a failure (a restart): a recovery, recorded in the history next to that failure.
        failed_at = deployment.failed_at
        recovered_from = (
            failed_at
            if failed_at is not None and (deployment.ready_at is None or failed_at > deployment.ready_at)
            else None
        )
        deployment.status = DeploymentStatus.READY
        deployment.ready_at = timezone.now()
        deployment.permanent_failure = False
        # A past failure is history (`last_failure`, the audit entries), not the current status.
        deployment.error = ""
        deployment.status_message = ""
        deployment.save(
            update_fields=["status", "ready_at", "permanent_failure", "error", "status_message", "updated_at"]
        )
        if recovered_from is not None:
            record_audit(
                action=AuditAction.DEPLOYMENT_RECOVERED,
                team=deployment.team,
                target=deployment,
                before={"status": DeploymentStatus.FAILED, "failed_at": recovered_from.isoformat()},
                after={"status": DeploymentStatus.READY, "restart_count": deployment.restart_count},
            )
    log.info("deployment.ready", extra={"deployment_id": deployment_id})
    return DeploymentStatus.READY


def _fill_repository(deployment: Deployment) -> bool:
    """Fill the deployment's own repository from its pinned build (`ensure_deployment_repository`); when that
    fails, mark the deployment `failed` saying what to do and return False.

    A store that was only unreachable is a transient failure: the restart after the backoff fills the repository
    again, so its reserved bytes stay counted and the restart still fits the team's storage. Any other failure (the
    build's files are gone) is permanent: nothing restarts the deployment, so what was written of its repository is
    deleted and its bytes stop counting at once, not only when it is stopped (a store that fails then leaves the
    objects to `collect_repository_garbage` once the deployment is stopped).
    """
    try:
        ensure_deployment_repository(deployment=deployment)
    except ConchError as exc:
        permanent = not isinstance(exc, Unavailable)
        _record_failure(
            deployment.pk,
            f"The deployment's model repository could not be written: {exc.detail} If the build's files are gone, "
            "rebuild the version (POST /api/v1/versions/{id}/rebuild/) and deploy it again.",
            state=None,
            permanent=permanent,
        )
        if permanent:
            try:
                delete_deployment_repository(deployment_id=deployment.pk)
            except ConchError as error:
                log.warning(
                    "deployment.repository.not_deleted", extra={"deployment_id": deployment.pk, "error": error.detail}
                )
        return False
    return True


def _save_state(deployment_id: int, runtime: Runtime, state: dict) -> str | None:
    """Record the runtime's state of a workload just applied; when the deployment is no longer wanted, delete that
    workload (after the commit) and return its status instead (None when recorded)."""
    with transaction.atomic():
        deployment = _locked(deployment_id)
        if deployment.desired_state != DesiredState.RUNNING:
            transaction.on_commit(lambda: runtime.delete(state))
            return deployment.status
        deployment.runtime_state = state
        deployment.heartbeat_at = timezone.now()
        deployment.save(update_fields=["runtime_state", "heartbeat_at", "updated_at"])
    return None


def _start_observed(deployment_id: int) -> str:
    """Start (or bring up to date) a deployment on a runtime that reconcile observes (Kubernetes): apply its spec
    and return at once; reconcile moves the status as the runtime reports progress. Applying is idempotent, so
    this also carries a changed spec (replicas, autoscaling) to the cluster.

    A spec the cluster refuses (4xx) marks the deployment `failed` with the API server's message (permanent: an
    apply again would be refused again); an unreachable cluster leaves it `starting` with the reason, and
    reconcile queues the start again once its heartbeat is stale. Returns the status.
    """
    with transaction.atomic():
        deployment = _locked(deployment_id)
        runtime = get_runtime(deployment.runtime)
        if deployment.desired_state != DesiredState.RUNNING:
            return deployment.status
        if deployment.status in (DeploymentStatus.PENDING, DeploymentStatus.FAILED):
            deployment.status = DeploymentStatus.STARTING
            deployment.status_message = "applying the Kubernetes objects"
            deployment.error = ""
            deployment.permanent_failure = False
        deployment.heartbeat_at = timezone.now()
        deployment.save(
            update_fields=["status", "status_message", "heartbeat_at", "error", "permanent_failure", "updated_at"]
        )
        spec, previous_state = deployment_spec(deployment), deployment.runtime_state
    if not _fill_repository(deployment):
        return DeploymentStatus.FAILED
    try:
        state = runtime.apply(spec, previous_state)
    except Unavailable as exc:
        Deployment.objects.filter(pk=deployment_id).update(status_message=exc.detail, updated_at=timezone.now())
        log.warning("deployment.apply_unavailable", extra={"deployment_id": deployment_id, "error": exc.detail})
        return DeploymentStatus.STARTING
    except ConchError as exc:
        _record_failure(deployment_id, f"The cluster refused the deployment: {exc.detail}", state=None, permanent=True)
        return DeploymentStatus.FAILED
    unwanted = _save_state(deployment_id, runtime, state)
    if unwanted is not None:
        return unwanted
    log.info("deployment.applied", extra={"deployment_id": deployment_id})
    return Deployment.objects.filter(pk=deployment_id).values_list("status", flat=True).first() or ""


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
        previous = deployment.status
        deployment.status = DeploymentStatus.FAILED
        deployment.error = text
        deployment.status_message = message.splitlines()[0] if message else "failed"
        deployment.last_failure = text
        deployment.failed_at = timezone.now()
        deployment.permanent_failure = permanent
        deployment.save(
            update_fields=[
                "status",
                "error",
                "status_message",
                "last_failure",
                "failed_at",
                "permanent_failure",
                "updated_at",
            ]
        )
        record_audit(
            action=AuditAction.DEPLOYMENT_FAILED,
            team=deployment.team,
            target=deployment,
            before={"status": previous},
            after={"status": deployment.status, "message": deployment.status_message, "permanent": permanent},
        )
    log.warning("deployment.failed", extra={"deployment_id": deployment_id, "permanent": permanent})
    return True


def stop_deployment(*, deployment_id: int) -> None:
    """Delete a deployment's workload on its runtime (its ports are freed) and its own repository, and mark it
    `stopped`."""
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
    try:
        delete_deployment_repository(deployment_id=deployment_id)
    except ConchError:
        # Nothing reads it any more; collect_repository_garbage deletes it later.
        log.warning("deployment.repository.not_deleted", extra={"deployment_id": deployment_id})
    with transaction.atomic():
        deployment = _locked(deployment_id)
        deployment.status = DeploymentStatus.STOPPED
        # What was last observed (pods, replicas, their words) no longer holds.
        deployment.status_message = "stopped"
        deployment.observed = {}
        deployment.save(update_fields=["status", "status_message", "observed", "updated_at"])
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
      runtime's message; ready for `CONCH_RESTART_BACKOFF_RESET_SECONDS` resets the restart count; a ready
      server serving another version than the current one is told to load it, and a version update whose
      task died is queued again;
    - `failed` (not permanent): queue a restart after the backoff (`restart_backoff_seconds`).
    Deployments whose workload belongs to another worker host are left to that host. Then workloads of this
    installation that no running deployment owns (orphans) are deleted. Returns counts of what it did.
    """
    counts = {"failed": 0, "restarted": 0, "stopped": 0, "orphans_killed": 0}
    now = timezone.now()
    running_states: dict[str, list[dict]] = {}
    observed: dict[str, list[Deployment]] = {}
    # One query for the whole pass (no query per deployment); what a deployment's own step changes it reads again.
    deployments = Deployment.objects.exclude(status=DeploymentStatus.STOPPED).select_related(
        "model_version__model", "team", "cluster"
    )
    for deployment in deployments.order_by("pk"):
        runtime = get_runtime(deployment.runtime)
        if not runtime.manages_here(deployment.runtime_state):
            continue
        if deployment.desired_state == DesiredState.RUNNING:
            running_states.setdefault(deployment.runtime, []).append(deployment.runtime_state)
        if not runtime.waits_for_ready and deployment.desired_state == DesiredState.RUNNING:
            observed.setdefault(deployment.runtime, []).append(deployment)
            continue
        action = _reconcile_one(deployment, runtime, now)
        if action:
            counts[action] += 1
    for name, watched in observed.items():
        for action in _reconcile_observed(get_runtime(name), watched, now):
            counts[action] += 1
    for name in ENABLED_RUNTIMES:
        runtime, states = get_runtime(name), running_states.get(name, [])
        running_ids = {d.pk for d in observed.get(name, [])}
        for workload in runtime.list_owned():
            if any(runtime.same_workload(state, workload) for state in states):
                continue
            if not runtime.waits_for_ready and workload.deployment_id in running_ids:
                continue  # applied a moment ago, its state not saved yet: it is not an orphan
            if _being_started(runtime, workload):
                continue
            try:
                runtime.delete(workload.state)
            except ConchError as exc:
                log.warning("deployment.orphan_not_deleted", extra={"workload": workload.key, "error": exc.detail})
                continue
            counts["orphans_killed"] += 1
            log.warning("deployment.orphan_killed", extra={"workload": workload.key})
    counts["orphans_killed"] += stop_verify_servers(only_abandoned=True)
    return counts


def _being_started(runtime: Runtime, workload: OwnedWorkload) -> bool:
    """Whether `workload`, found with no deployment recording it, may belong to a start still in progress.

    The states were read at the start of the reconcile pass, and a start saves its workload's state only after the
    runtime's `apply` returns; so the deployment is read again now: its workload if the state saved since records
    it, and any workload of a deployment that is `starting` under a fresh heartbeat (the start may have made it a
    moment ago). A start that died lets its heartbeat go stale; its workload is then an orphan like any other.
    """
    if workload.deployment_id is None:
        return False
    deployment = Deployment.objects.filter(pk=workload.deployment_id).first()
    if deployment is None or deployment.desired_state != DesiredState.RUNNING:
        return False
    if runtime.same_workload(deployment.runtime_state, workload):
        return True
    return deployment.status == DeploymentStatus.STARTING and _heartbeat_is_fresh(deployment, timezone.now())


def _reconcile_one(deployment: Deployment, runtime: Runtime, now: datetime) -> str | None:
    """Reconcile one deployment (see `reconcile_deployments`); returns the count it adds to, if any."""
    pk = deployment.pk
    if deployment.desired_state == DesiredState.STOPPED:
        quiet = (now - deployment.updated_at).total_seconds() > settings.CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS
        if deployment.status != DeploymentStatus.STOPPING or quiet:
            with transaction.atomic():
                queue_task("deployments.stop_deployment", pk)
            return "stopped"
        return None
    if deployment.status == DeploymentStatus.STARTING:
        if _heartbeat_is_fresh(deployment, now):
            return None
        log.warning("deployment.start_stalled", extra={"deployment_id": pk})
        with transaction.atomic():
            queue_task("deployments.start_deployment", pk)
        return "restarted"
    if deployment.status == DeploymentStatus.PENDING:
        if (now - deployment.updated_at).total_seconds() > 15:
            # A start that was never queued or got lost (e.g. Conch was shut down); starting is idempotent.
            with transaction.atomic():
                queue_task("deployments.start_deployment", pk)
            return "restarted"
        return None
    if deployment.status == DeploymentStatus.READY:
        observation = runtime.observe(deployment_spec(deployment), deployment.runtime_state)
        if observation.phase == Phase.READY:
            stable = (now - (deployment.ready_at or now)).total_seconds()
            if deployment.restart_count and stable >= settings.CONCH_RESTART_BACKOFF_RESET_SECONDS:
                Deployment.objects.filter(pk=pk, status=DeploymentStatus.READY).update(restart_count=0)
            _keep_servers_on_current_version(deployment)
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


class ObservedWorkload(TypedDict):
    """What reconcile last observed of a deployment whose runtime it observes (Kubernetes), as stored in
    `Deployment.observed`: `replicas` {"desired", "ready"} pod counts (None when the runtime gives none) and `pods`,
    each pod's state as the runtime reports it (`Observation.pods`: name, ready, ...)."""

    replicas: dict[str, int] | None
    pods: list[dict[str, Any]]


#: Our status for each phase a runtime observed (UNKNOWN and ABSENT are handled apart).
_STATUS_OF_PHASE = {
    Phase.READY: DeploymentStatus.READY,
    Phase.DEGRADED: DeploymentStatus.DEGRADED,
    Phase.PENDING: DeploymentStatus.PENDING,
    Phase.STARTING: DeploymentStatus.STARTING,
    Phase.FAILED: DeploymentStatus.FAILED,
}


def _reconcile_observed(runtime: Runtime, deployments: list[Deployment], now: datetime) -> list[str]:
    """Reconcile running deployments of a runtime that reconcile observes (Kubernetes), in one batch.

    One `observe_many` call (a constant number of API requests per cluster); each deployment's status, message,
    replicas and pods follow the observation, written only when they changed. A deployment never applied (or whose
    objects are gone) gets its start queued again once its heartbeat is stale; a cluster that does not answer
    changes nothing but the message. Returns the counts' keys of what it did.
    """
    actions = []
    applied = [d for d in deployments if d.runtime_state.get("name")]
    observations = runtime.observe_many([(deployment_spec(d), d.runtime_state) for d in applied]) if applied else {}
    for deployment in deployments:
        observation = observations.get(deployment.pk)
        stale = not _heartbeat_is_fresh(deployment, now)
        if observation is None or observation.phase == Phase.ABSENT:
            if deployment.permanent_failure:
                continue  # the cluster refused the spec: only a changed spec (PATCH) applies it again
            if stale and (now - deployment.updated_at).total_seconds() > 15:
                with transaction.atomic():
                    queue_task("deployments.start_deployment", deployment.pk)
                actions.append("restarted")
            continue
        if observation.phase == Phase.UNKNOWN:
            if deployment.status_message != observation.message:
                Deployment.objects.filter(pk=deployment.pk).update(status_message=observation.message)
            continue
        status = _STATUS_OF_PHASE[observation.phase]
        seen: ObservedWorkload = {
            "replicas": {"desired": observation.replicas[0], "ready": observation.replicas[1]}
            if observation.replicas
            else None,
            "pods": [dict(pod) for pod in observation.pods],
        }
        # A pod that became ready may have read the repository's configuration while a version update ran: have
        # the new ones serve the current version (an API request only when the ready pods changed).
        was_ready = {pod["name"] for pod in (deployment.observed or {}).get("pods") or [] if pod.get("ready")}
        now_ready = {pod["name"] for pod in seen["pods"] if pod["ready"]}
        serving = status in (DeploymentStatus.READY, DeploymentStatus.DEGRADED)
        if serving and (now_ready - was_ready or deployment.update_status in UPDATES_IN_PROGRESS):
            _keep_servers_on_current_version(deployment)
        if (deployment.status, deployment.status_message, deployment.observed) == (status, observation.message, seen):
            continue
        changes = {"status": status, "status_message": observation.message, "observed": seen, "updated_at": now}
        if status == DeploymentStatus.READY and deployment.status != DeploymentStatus.READY:
            changes["ready_at"] = now
            changes["error"] = ""
        if status == DeploymentStatus.FAILED:
            changes["error"] = observation.message
            if deployment.status != DeploymentStatus.FAILED:
                changes.update(last_failure=observation.message, failed_at=now)
                actions.append("failed")
        elif deployment.status == DeploymentStatus.FAILED:
            changes["error"] = ""
        with transaction.atomic():
            updated = Deployment.objects.filter(pk=deployment.pk, desired_state=DesiredState.RUNNING).update(**changes)
            if updated and deployment.status != status:
                _audit_observed_status(deployment, status, observation.message)
        if deployment.status != status:
            log.info(
                "deployment.status",
                extra={"deployment_id": deployment.pk, "status": str(status), "was": deployment.status},
            )
    return actions


#: Audited status changes that reconcile observes: into `failed` or `degraded`, and back to `ready` from them.
_OBSERVED_STATUS_ACTIONS = {
    DeploymentStatus.FAILED: AuditAction.DEPLOYMENT_FAILED,
    DeploymentStatus.DEGRADED: AuditAction.DEPLOYMENT_DEGRADED,
}


def _audit_observed_status(deployment: Deployment, status: DeploymentStatus, message: str) -> None:
    action = _OBSERVED_STATUS_ACTIONS.get(status)
    if action is None and status == DeploymentStatus.READY and deployment.status in _OBSERVED_STATUS_ACTIONS:
        action = AuditAction.DEPLOYMENT_RECOVERED
    if action is not None:
        record_audit(
            action=action,
            team=deployment.team,
            target=deployment,
            before={"status": deployment.status},
            after={"status": status, "message": message},
        )


def _keep_servers_on_current_version(deployment: Deployment) -> None:
    """Queue again an update whose task died; otherwise have every ready server serve the current version."""
    if deployment.update_status in UPDATES_IN_PROGRESS:
        if update_is_stale(deployment):
            log.warning("deployment.update.stalled", extra={"deployment_id": deployment.pk})
            with transaction.atomic():
                queue_task("deployments.update_model_version", deployment.pk)
        return
    try:
        ensure_servers_serve_current_version(deployment)
    except ConchError as exc:
        log.warning("deployment.server_version.unknown", extra={"deployment_id": deployment.pk, "detail": exc.detail})


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
            record_audit(
                action=AuditAction.DEPLOYMENT_RESTARTED,
                team=deployment.team,
                target=deployment,
                before={"status": deployment.status, "restart_count": deployment.restart_count},
                after={"restart_count": deployment.restart_count + 1, "waited_s": round(waited, 1)},
            )
            queue_task("deployments.start_deployment", deployment.pk)
    return bool(updated)


def collect_repository_garbage() -> int:
    """Delete repository prefixes of old build attempts that no deployment pins and no TensorRT plan still reads (see
    `builds.services.collect_repository_garbage`), the own repositories of stopped deployments and the store
    folders of deleted or failed TensorRT plans; returns how many prefixes were deleted. Also records the size of
    serving repositories not counted yet (`measure_unmeasured_repositories`)."""
    pinned = (
        set(
            Deployment.objects.exclude(status=DeploymentStatus.STOPPED)
            .exclude(repository_prefix="")
            .values_list("repository_prefix", flat=True)
        )
        | plans.building_prefixes()
    )
    deleted = builds.collect_repository_garbage(keep=pinned) + collect_deployment_repositories()
    deleted += plans.collect_plan_garbage()
    measure_unmeasured_repositories()
    return deleted


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

"""Deployment lifecycle on the local runtime: create, start, reconcile, stop, infer.

A deployment on the `local` runtime is one `tritonserver` process (see
`tritonserving.server`) started detached by a Celery worker, with
`--model-control-mode=explicit`: Conch loads the model through Triton's repository
API with the deployment's effective configuration (Triton "Model Repository" doc,
"Model Control Mode EXPLICIT"; repository extension `load` with a `config` parameter).
The process is identified by (pid, create time) and by `--id=<instance>-dep-<id>`, so a
restarted Conch adopts its servers instead of starting duplicates, and kills the ones
no deployment owns.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from builds.model_config import apply_deployment_overrides
from builds.services import SERVER_ID_INFIX_VERIFY
from conch.errors import ConchError, Conflict, InvalidInput, NotFound
from deployments.choices import DeploymentStatus, DesiredState, Runtime
from deployments.models import Deployment
from models_registry.choices import VersionStatus
from models_registry.naming import validate_model_name
from models_registry.services import get_version
from models_registry.storage import get_object_store
from tenancy.services import get_team_for_user, teams_for_user
from tritonserving import server as triton_server
from tritonserving.client import InferenceResponse, TritonClient
from tritonserving.config import config_from_pbtxt, config_to_json, config_to_pbtxt

log = logging.getLogger(__name__)

# Server ids are "<CONCH_INSTANCE_ID>.dep.<id>" and "<CONCH_INSTANCE_ID>.verify.<hex>". Instance ids
# may not contain ".", so one installation's prefix never matches another's (e.g. "conch" vs "conch-b").
SERVER_ID_INFIX_DEPLOYMENT = ".dep."
LOG_TAIL_LINES = 30


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
    if not deployment.log_path:
        return []
    return triton_server.tail_log(Path(deployment.log_path), lines=lines)


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


def _check_count(value: Any, field: str, *, minimum: int, maximum: int) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise InvalidInput(f"{field} must be a whole number.", field=field) from None
    if not minimum <= value <= maximum:
        raise InvalidInput(f"{field} must be between {minimum} and {maximum}; got {value}.", field=field)
    return value


def create_deployment(
    *,
    user: AbstractBaseUser,
    team_slug: str,
    name: str,
    model_version_id: Any,
    runtime: str = Runtime.LOCAL,
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
    if runtime not in Runtime.values:
        raise InvalidInput(f"runtime must be one of {', '.join(Runtime.values)}.", field="runtime")
    if runtime != Runtime.LOCAL:
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
    instance_count = _check_count(instance_count, "instance_count", minimum=1, maximum=64)
    max_batch_size = _check_count(max_batch_size, "max_batch_size", minimum=0, maximum=4096)
    delay = _check_count(max_queue_delay_microseconds, "max_queue_delay_microseconds", minimum=0, maximum=10_000_000)
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
                created_by=user,
                host=settings.CONCH_TRITON_PUBLIC_HOST,
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


# --- local runtime ---------------------------------------------------------------


def _triton_dir() -> Path:
    root = Path(settings.CONCH_TRITON_DIR)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    return root


def _server_id(kind_infix: str, suffix: str) -> str:
    return f"{settings.CONCH_INSTANCE_ID}{kind_infix}{suffix}"


def _start_process(*, server_id: str, repository: str, environment: dict[str, str], log_path: Path):
    root = _triton_dir()
    backend_root = triton_server.ensure_backend_directory(root / "backends")
    http_port, grpc_port, metrics_port = triton_server.allocate_ports(3)
    return triton_server.start_server(
        server_id=server_id,
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=log_path,
        backend_root=backend_root,
        env=environment,
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
    )


def ensure_deployment_started(*, deployment_id: int) -> str:
    """Bring a local deployment to `ready`: start its Triton, wait for it, load the model.

    Idempotent: a ready deployment with a live process, or one a concurrent task is
    already starting, is left alone. Returns the resulting status. Start failures
    (Triton exits, the load is refused) mark it `failed` with Triton's last log lines.
    """
    store = get_object_store()
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().select_related("model_version__model").get(pk=deployment_id)
        if deployment.desired_state != DesiredState.RUNNING or deployment.runtime != Runtime.LOCAL:
            return deployment.status
        alive = bool(deployment.pid) and triton_server.is_alive(deployment.pid, deployment.process_create_time)
        if alive and deployment.status == DeploymentStatus.READY:
            return deployment.status
        recent = deployment.updated_at > timezone.now() - timedelta(
            seconds=settings.CONCH_TRITON_START_TIMEOUT_SECONDS + 30
        )
        if alive and deployment.status == DeploymentStatus.STARTING and recent:
            return deployment.status
        if alive:
            triton_server.stop_server(deployment.pid, deployment.process_create_time)
        log_path = _triton_dir() / "logs" / f"deployment-{deployment.pk}.log"
        if log_path.exists():
            log_path.replace(log_path.with_suffix(".previous.log"))
        version = deployment.model_version
        process = _start_process(
            server_id=_server_id(SERVER_ID_INFIX_DEPLOYMENT, str(deployment.pk)),
            repository=store.triton_repository_location(version.repository_prefix),
            environment=store.triton_environment(),
            log_path=log_path,
        )
        deployment.status = DeploymentStatus.STARTING
        deployment.error = ""
        deployment.server_id = process.server_id
        deployment.pid = process.pid
        deployment.process_create_time = process.create_time
        deployment.http_port = process.http_port
        deployment.grpc_port = process.grpc_port
        deployment.metrics_port = process.metrics_port
        deployment.host = settings.CONCH_TRITON_PUBLIC_HOST
        deployment.log_path = str(log_path)
        deployment.save()
    log.info("deployment.starting", extra={"deployment_id": deployment.pk, "pid": process.pid})
    try:
        triton_server.wait_until_ready(process, timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS)
        client = TritonClient(internal_url(process.http_port), timeout_s=300)
        config = config_from_pbtxt(deployment.config_pbtxt)
        client.load_model(deployment.model_name, config_json=config_to_json(config))
    except (ConchError, OSError) as exc:
        detail = exc.detail if isinstance(exc, ConchError) else str(exc)
        _mark_failed(deployment.pk, f"Triton did not become ready: {detail}", pid=process.pid)
        triton_server.stop_server(process.pid, process.create_time)
        return DeploymentStatus.FAILED
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        if deployment.pid != process.pid or deployment.desired_state != DesiredState.RUNNING:
            return deployment.status
        deployment.status = DeploymentStatus.READY
        deployment.ready_at = timezone.now()
        deployment.save(update_fields=["status", "ready_at", "updated_at"])
    log.info("deployment.ready", extra={"deployment_id": deployment.pk})
    return DeploymentStatus.READY


def internal_url(port: int, path: str = "") -> str:
    """URL by which Conch's own processes reach a local Triton port (CONCH_TRITON_INTERNAL_HOST)."""
    return f"http://{settings.CONCH_TRITON_INTERNAL_HOST}:{port}{path}"


def _mark_failed(deployment_id: int, message: str, *, pid: int | None) -> None:
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        if pid is not None and deployment.pid != pid:
            return
        tail = log_tail(deployment)
        text = message + ("\nLast lines of Triton's log:\n" + "\n".join(tail) if tail else "")
        deployment.status = DeploymentStatus.FAILED
        deployment.error = text
        deployment.last_failure = text
        deployment.failed_at = timezone.now()
        deployment.save(update_fields=["status", "error", "last_failure", "failed_at", "updated_at"])
    log.warning("deployment.failed", extra={"deployment_id": deployment_id})


def stop_deployment(*, deployment_id: int) -> None:
    """End a deployment's Triton process (if any), free its ports and mark it `stopped`."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        if deployment.pid:
            triton_server.stop_server(deployment.pid, deployment.process_create_time)
        deployment.status = DeploymentStatus.STOPPED
        deployment.desired_state = DesiredState.STOPPED
        deployment.pid = None
        deployment.process_create_time = None
        deployment.http_port = deployment.grpc_port = deployment.metrics_port = None
        deployment.save()
    log.info("deployment.stopped", extra={"deployment_id": deployment_id})


def restart_backoff_seconds(restart_count: int) -> float:
    """Wait before restart number `restart_count + 1` of a failed deployment: 0 s, then 5 s doubling to 300 s."""
    if restart_count == 0:
        return 0.0
    return float(min(300, 5 * 2 ** (restart_count - 1)))


def reconcile_deployments() -> dict[str, int]:
    """Compare local deployments with their processes and act; run periodically by beat.

    - desired running, recorded process gone: mark `failed` with Triton's last log lines,
      then restart it (with backoff between repeated failures);
    - desired stopped but a process left: stop it;
    - a `tritonserver` tagged with this Conch's id that no deployment owns (or a duplicate
      of one), or a build's verify server left by a dead worker: stop it.
    Returns counts of what it did.
    """
    counts = {"failed": 0, "restarted": 0, "stopped": 0, "orphans_killed": 0}
    now = timezone.now()
    for deployment_id in list(
        Deployment.objects.filter(runtime=Runtime.LOCAL)
        .exclude(status=DeploymentStatus.STOPPED)
        .values_list("pk", flat=True)
    ):
        with transaction.atomic():
            d = Deployment.objects.select_for_update().get(pk=deployment_id)
            alive = bool(d.pid) and triton_server.is_alive(d.pid, d.process_create_time)
            if d.desired_state == DesiredState.STOPPED:
                if d.status != DeploymentStatus.STOPPING or not alive:
                    _queue_task("deployments.stop_deployment", d.pk)
                    counts["stopped"] += 1
                continue
            if d.status in (DeploymentStatus.READY, DeploymentStatus.STARTING) and d.pid and not alive:
                tail = log_tail(d)
                text = "Triton exited unexpectedly" + ("; last lines of its log:\n" + "\n".join(tail) if tail else ".")
                d.status = DeploymentStatus.FAILED
                d.error = text
                d.last_failure = text
                d.failed_at = now
                d.save(update_fields=["status", "error", "last_failure", "failed_at", "updated_at"])
                counts["failed"] += 1
                log.warning("deployment.process_died", extra={"deployment_id": d.pk})
            if d.status == DeploymentStatus.FAILED:
                waited = (now - (d.failed_at or now)).total_seconds()
                if waited >= restart_backoff_seconds(d.restart_count):
                    d.restart_count += 1
                    d.save(update_fields=["restart_count", "updated_at"])
                    _queue_start(d.pk)
                    counts["restarted"] += 1
            elif d.status == DeploymentStatus.PENDING and not d.pid and (now - d.updated_at).total_seconds() > 15:
                # A start that was never queued or got lost (e.g. Conch was shut down); starting is idempotent.
                _queue_start(d.pk)
                counts["restarted"] += 1
    counts["orphans_killed"] = kill_orphan_servers()
    return counts


def kill_orphan_servers(*, verify_max_age_seconds: float = 900) -> int:
    """Stop `tritonserver` processes tagged with this Conch's id that nothing owns.

    A deployment server is an orphan when its deployment is gone, stopped, or records
    another process; a build's verify server when it is older than `verify_max_age_seconds`.
    """
    killed = 0
    prefix = settings.CONCH_INSTANCE_ID
    owned = {
        (d.pid, d.process_create_time)
        for d in Deployment.objects.filter(desired_state=DesiredState.RUNNING).exclude(pid=None)
    }
    now = timezone.now().timestamp()
    for server in triton_server.find_servers(prefix + SERVER_ID_INFIX_DEPLOYMENT):
        if any(pid == server.pid and abs((ct or 0) - server.create_time) < 0.5 for pid, ct in owned):
            continue
        triton_server.stop_server(server.pid, server.create_time)
        killed += 1
        log.warning("deployment.orphan_killed", extra={"pid": server.pid, "server_id": server.server_id})
    for server in triton_server.find_servers(prefix + SERVER_ID_INFIX_VERIFY):
        if now - server.create_time > verify_max_age_seconds:
            triton_server.stop_server(server.pid, server.create_time)
            killed += 1
    return killed


def stop_all_local_servers() -> int:
    """Stop every Triton this Conch instance started, when Conch itself shuts down (the demo's Ctrl-C).

    Deployments that should keep running go back to `pending` (not `failed`): the next
    reconcile after Conch starts again brings them up without counting a crash.
    """
    prefix = settings.CONCH_INSTANCE_ID
    servers = triton_server.find_servers(prefix + SERVER_ID_INFIX_DEPLOYMENT) + triton_server.find_servers(
        prefix + SERVER_ID_INFIX_VERIFY
    )
    for server in servers:
        triton_server.stop_server(server.pid, server.create_time)
    Deployment.objects.filter(runtime=Runtime.LOCAL, desired_state=DesiredState.RUNNING).exclude(
        status=DeploymentStatus.STOPPED
    ).update(
        status=DeploymentStatus.PENDING,
        pid=None,
        process_create_time=None,
        http_port=None,
        grpc_port=None,
        metrics_port=None,
        error="",
        updated_at=timezone.now(),
    )
    return len(servers)


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
    client = TritonClient(internal_url(deployment.http_port), timeout_s=60)
    return client.infer_request_body(deployment.model_name, body, header_length=header_length)

"""Hot version updates: a running deployment moves to another built version of its model without restarting a
server, on any runtime.

`update_model_version` checks the request, records it on the deployment (`target_model_version`, `update_status`)
and queues `deployments.update_model_version`, whose task runs `ensure_model_version_updated`:

1. the new version M's files are copied into the deployment's own repository (`deployments.services.repository`),
   beside the served version N;
2. on every ready server of the workload (`Runtime.servers`: the local process, or each ready pod), through the
   repository API with the server's key: load the model serving versions [N, M], then warm M up with one
   inference on `/v2/models/<name>/versions/<M>/infer`;
3. once every server has M loaded and warm, load serving [M] alone on each (N is unloaded there);
4. write `config.pbtxt` serving [M] into the repository (servers that start later load M by themselves) and
   record M, its build prefix and its effective configuration on the deployment, in one transaction.

Why this sequence (Triton "Model Management", "Model Control Mode EXPLICIT": a load of a loaded model is a reload;
"if the reload fails for any reason the already loaded model will be unchanged and will remain loaded. If the
reload succeeds, the newly loaded model will replace the already loaded model without any loss in availability"):
when N's and M's configurations are the same but for the version policy, loading [N, M] keeps N's loaded
instance serving (a version-policy-only change reloads no loaded version: core `ModelLifeCycle::AsyncLoad`,
checked on 2.51 in tests/tritonserving/test_versions.py) and adds M beside it; loading [M] then keeps M's
instance, warm, and unloads N once its in-flight requests are done. No request fails at any step. Requests
that name no version go to the highest ready version (core `ModelLifeCycle::GetModel`), so from step 2 on a
server answers them with M when M > N: the warm-up proves M runs before N is given up, not before M takes
traffic. When the configurations differ in more than the version policy (another batch size, other inputs),
one configuration cannot serve both files: each server loads [M] with M's configuration directly (Triton
swaps it in once loaded, per the doc above), then warms it.

A failure on any server (Triton refuses the load, or the warm-up inference fails) loads [N] with N's
configuration again on every server already touched, so all serve N, and marks the update `failed` with the
server's name and Triton's message; the deployment stays `ready` on N. A server that comes up during an update
reads the repository's `config.pbtxt`, which names N until the update succeeds; reconcile then tells it to load
the current version (`ensure_servers_serve_current_version`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from builds import services as builds
from builds.model_config import apply_deployment_overrides, instance_kind_of
from conch.errors import ConchError, Conflict, InvalidInput
from deployments.choices import DeploymentStatus, DesiredState, RuntimeName, UpdateStatus
from deployments.models import Deployment, TensorRTPlan
from deployments.runtimes import get_runtime
from deployments.runtimes.base import Server
from deployments.services.quotas import instance_request
from deployments.services.records import (
    queue_task,
    require_deployment_access,
    rescale_deployment,
    usable_plan,
    version_for_deployment,
)
from deployments.services.repository import (
    copy_version_files,
    deployment_repository_prefix,
    files_beside_config,
    has_deployment_repository,
    record_repository_bytes,
    remove_other_versions,
    served_config,
    version_files_bytes,
    write_repository_config,
)
from models_registry.choices import VersionStatus
from models_registry.services import lock_built_version
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tenancy.quotas import reserve_quota
from tenancy.services import TokenGrant
from tritonserving.client import TritonClient
from tritonserving.config import (
    ModelConfig,
    config_from_pbtxt,
    config_to_pbtxt,
    same_apart_from_versions,
    serving_versions,
)
from tritonserving.versions import load_versions, wait_until_ready_again, warm_up_version

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

#: Update statuses of an update that has not finished.
UPDATES_IN_PROGRESS = (UpdateStatus.QUEUED, UpdateStatus.UPDATING)


#: Fields of a deployment a PATCH may change, each with the service that changes it.
UPDATABLE_FIELDS = ("model_version", "replicas", "autoscaling")
#: Statuses in which a deployment serves and can change versions (degraded: some Kubernetes pods serve).
SERVING = (DeploymentStatus.READY, DeploymentStatus.DEGRADED)


def update_deployment(
    *, user: User, deployment: Deployment, changes: Mapping[str, Any], token: TokenGrant | None = None
) -> Deployment:
    """Apply a partial update of a deployment (`changes`: field name -> new value); returns the deployment.

    Raises Forbidden without the developer role (or, with a token, `deployments:write`), InvalidInput naming
    the first field that cannot be changed, or `request` when nothing is asked; otherwise what the field's
    service raises (`rescale_deployment`, `update_model_version`).
    """
    require_deployment_access(user=user, deployment=deployment, action="Changing a deployment", token=token)
    unknown = [name for name in changes if name not in UPDATABLE_FIELDS]
    if unknown:
        raise InvalidInput(
            f"{unknown[0]} cannot be changed on a deployment; send only {', '.join(UPDATABLE_FIELDS)}.",
            field=unknown[0],
        )
    if not changes:
        raise InvalidInput(f"Send at least one of {', '.join(UPDATABLE_FIELDS)} to change.", field="request")
    if "replicas" in changes or "autoscaling" in changes:
        deployment = rescale_deployment(
            user=user,
            deployment=deployment,
            replicas=changes.get("replicas"),
            autoscaling=changes.get("autoscaling"),
            token=token,
        )
    if "model_version" in changes:
        deployment = update_model_version(
            user=user, deployment=deployment, model_version_id=changes["model_version"], token=token
        )
    return deployment


def update_model_version(
    *, user: User, deployment: Deployment, model_version_id: Any, token: TokenGrant | None = None
) -> Deployment:
    """Ask for `deployment` to serve another built version of its model, without a restart; returns it.

    The update runs in a task (see the module docstring); its progress shows in `update_status` and, when it
    fails, `update_error`. Asking for the version the deployment serves changes nothing. Raises, naming field
    `model_version`: InvalidInput for a value that is no id, a version of another model, or one the
    deployment's overrides do not fit; NotFound for a version the caller cannot see; Conflict for a version that
    is not built, a deployment that is not ready, or one whose update is still running; QuotaExceeded (field
    `instances`) when a local deployment would run more model instances than its team's quota leaves, or (field
    `storage_bytes`) when the version's files, copied into the deployment's own repository beside the served
    version's, do not fit in its team's storage. Forbidden without the developer role (or, with a token,
    `deployments:write`).
    """
    require_deployment_access(user=user, deployment=deployment, action="Changing a deployment", token=token)
    version = version_for_deployment(user=user, model_version_id=model_version_id, token=token)
    # Its files are copied beside the served version's in the deployment's own repository, but for those already
    # there (a version it served before); read before the lock.
    store, name, number = get_object_store(), version.model.name, version.number
    added_bytes = max(
        0,
        version_files_bytes(
            store, build_prefix=builds.served_repository_prefix(version), model_name=name, number=number
        )
        - version_files_bytes(
            store, build_prefix=deployment_repository_prefix(deployment.pk), model_name=name, number=number
        ),
    )
    with transaction.atomic():
        deployment = (
            Deployment.objects.select_for_update(of=("self",))
            .select_related("model_version__model", "team")
            .get(pk=deployment.pk)
        )
        current = deployment.model_version
        if version.model_id != current.model_id:
            raise InvalidInput(
                f"Model version {version.pk} is a version of model '{version.model.name}'; deployment "
                f"'{deployment.name}' serves model '{current.model.name}' and can only move to one of its versions.",
                field="model_version",
            )
        if version.status != VersionStatus.BUILT:
            raise Conflict(
                f"Model version {version.pk} is '{version.status}'; only a built version can be served.",
                field="model_version",
            )
        target = deployment.target_model_version
        if deployment.update_status in UPDATES_IN_PROGRESS:
            toward = f" to version {target.number}" if target is not None else ""
            raise Conflict(
                f"Deployment '{deployment.name}' is already being updated{toward}; wait until its update_status "
                f"is no longer '{deployment.update_status}'.",
                field="model_version",
            )
        if version.pk == current.pk:
            return deployment
        if deployment.desired_state != DesiredState.RUNNING or deployment.status not in SERVING:
            raise Conflict(
                f"Deployment '{deployment.name}' is '{deployment.status}'; only a ready deployment can change "
                "versions without a restart.",
                field="model_version",
            )
        config = effective_config(deployment, version)  # refuses, now, a version the overrides do not fit
        if deployment.runtime == RuntimeName.LOCAL:
            reserve_quota(
                team=deployment.team,
                requested={"instances": instance_request(config)},
                released={"instances": instance_request(config_from_pbtxt(deployment.config_pbtxt))},
                what="this version",
            )
        reserve_quota(team=deployment.team, requested={"storage_bytes": added_bytes}, what="this version's files")
        if not has_deployment_repository(deployment):
            raise Conflict(
                f"Deployment '{deployment.name}' was started before deployments had their own model repository; "
                "stop it and deploy the version again.",
                field="model_version",
            )
        lock_built_version(version_id=version.pk)  # a deletion of the version either ran first or waits
        deployment.target_model_version = version
        deployment.update_status = UpdateStatus.QUEUED
        deployment.update_error = ""
        deployment.update_heartbeat_at = timezone.now()
        deployment.repository_bytes += added_bytes
        deployment.save(
            update_fields=[
                "repository_bytes",
                "target_model_version",
                "update_status",
                "update_error",
                "update_heartbeat_at",
                "updated_at",
            ]
        )
        record_audit(
            action=AuditAction.DEPLOYMENT_VERSION_UPDATE_REQUESTED,
            team=deployment.team,
            target=deployment,
            before={"model_version": current.pk, "number": current.number},
            after={"model_version": version.pk, "number": version.number},
        )
        queue_task("deployments.update_model_version", deployment.pk)
    log.info("deployment.update.queued", extra={"deployment_id": deployment.pk, "model_version_id": version.pk})
    return deployment


def effective_config(deployment: Deployment, version: ModelVersion, plan: TensorRTPlan | None = None) -> ModelConfig:
    """`version`'s configuration (its TensorRT `plan`'s, when it is given) with the deployment's overrides (as
    `create_deployment` applies them): its max_batch_size and queue delay overrides, and the instance count and
    kind it runs with now.

    Raises InvalidInput naming `model_version` when an override does not fit the version (e.g. a batch size
    for a version built without batching).
    """
    running = config_from_pbtxt(deployment.config_pbtxt)
    try:
        return apply_deployment_overrides(
            config_from_pbtxt(plan.config_pbtxt if plan is not None else builds.served_config_pbtxt(version)),
            instance_count=(running.instance_group[0].count or None) if running.instance_group else None,
            # the kind it was deployed with (builds write KIND_AUTO, so only a kind chosen at create is carried)
            instance_kind=kind if (kind := instance_kind_of(running)) in ("KIND_CPU", "KIND_GPU") else None,
            max_batch_size=deployment.max_batch_size,
            max_queue_delay_microseconds=deployment.max_queue_delay_microseconds,
        )
    except InvalidInput as exc:
        raise InvalidInput(
            f"Version {version.number} does not take this deployment's {exc.field}: {exc.detail}",
            field="model_version",
        ) from None


def update_is_stale(deployment: Deployment) -> bool:
    """Whether the deployment's update task stopped writing its heartbeat (it died, or was never run)."""
    limit = timedelta(seconds=settings.CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS)
    return deployment.update_heartbeat_at is None or timezone.now() - deployment.update_heartbeat_at > limit


def ensure_model_version_updated(*, deployment_id: int) -> str:
    """Run the deployment's queued version update (see the module docstring); returns the `update_status`.

    Idempotent: an update that is done, or that another task runs (fresh heartbeat), is left alone; a
    redelivered task whose worker died repeats the steps, which Triton takes again (same loads).
    """
    with transaction.atomic():
        deployment = (
            Deployment.objects.select_for_update(of=("self",))
            .select_related("model_version__model", "target_model_version")
            .get(pk=deployment_id)
        )
        target = deployment.target_model_version
        if deployment.update_status not in UPDATES_IN_PROGRESS or target is None:
            return deployment.update_status
        if deployment.update_status == UpdateStatus.UPDATING and not update_is_stale(deployment):
            return deployment.update_status
        if deployment.desired_state != DesiredState.RUNNING or deployment.status not in SERVING:
            _finish_failed(deployment, f"The deployment became '{deployment.status}' before its update started.")
            return UpdateStatus.FAILED
        deployment.update_status = UpdateStatus.UPDATING
        deployment.update_heartbeat_at = timezone.now()
        deployment.save(update_fields=["update_status", "update_heartbeat_at", "updated_at"])
    try:
        return _run_update(deployment, target)
    except Exception as exc:
        # The task's edge: an update must not stay 'updating' for a failure this module did not foresee.
        _record_update_failure(deployment_id, f"The update stopped on an unexpected error: {exc}")
        raise


def _run_update(deployment: Deployment, new: ModelVersion) -> str:
    """Move the deployment's servers from the version they serve to `new`, its `target_model_version` (read
    under the lock by `ensure_model_version_updated`). Returns the final `update_status`."""
    old = deployment.model_version
    name = deployment.model_name
    old_config = served_config(deployment)
    # On the cluster and GPU product of a TensorRT plan of the new version, the plan; else its ONNX model.
    new_plan = (
        usable_plan(new, deployment.cluster, (deployment.gpu or {}).get("product"))
        if deployment.runtime == RuntimeName.KUBERNETES
        else None
    )
    new_prefix = new_plan.repository_prefix if new_plan is not None else builds.served_repository_prefix(new)
    try:
        new_config = effective_config(deployment, new, new_plan)
        store = get_object_store()
        remove_other_versions(
            store,
            deployment_id=deployment.pk,
            model_name=name,
            keep={old.number, new.number},
            keep_files=files_beside_config(old_config) | files_beside_config(new_config),
        )
        copy_version_files(
            store,
            build_prefix=new_prefix,
            model_name=name,
            number=new.number,
            deployment_id=deployment.pk,
        )
        record_repository_bytes(deployment_id=deployment.pk)
        inputs = builds.make_version_sample(version=new, config=new_config)
        servers = get_runtime(deployment.runtime).servers(deployment.runtime_state)
    except ConchError as exc:
        _record_update_failure(deployment.pk, f"The update could not start: {exc.detail}")
        return UpdateStatus.FAILED
    if not servers:
        _record_update_failure(deployment.pk, "No server of the deployment is ready; try again once it is.")
        return UpdateStatus.FAILED
    side_by_side = same_apart_from_versions(old_config, new_config)
    touched: list[Server] = []
    current: Server | None = None
    try:
        for current in servers:
            client = _client(current)
            touched.append(current)
            load_versions(client, new_config, [old.number, new.number] if side_by_side else [new.number])
            warm_up_version(client, name, new.number, inputs)
            if not side_by_side:
                # Loaded with a configuration of its own, the new version replaced the old one, which unloads now:
                # the next server is touched (and the update told done) once this one is ready again.
                wait_until_ready_again(client, timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS)
            _touch_update(deployment.pk)
        if side_by_side:
            for current in servers:
                client = _client(current)
                load_versions(client, new_config, [new.number])
                # One server at a time: until version N has unloaded, a strict-readiness server says it is not
                # ready (its readiness probe may fail), so the next one waits for this one to be ready again.
                wait_until_ready_again(client, timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS)
    except ConchError as exc:
        where = current.name if current is not None else "?"
        message = f"Server {where} could not serve version {new.number}: {exc.detail}"
        problems = _roll_back(touched, old_config, old.number)
        log.warning("deployment.update.failed", extra={"deployment_id": deployment.pk, "server": where})
        _record_update_failure(deployment.pk, message + "".join(f"\n{line}" for line in problems))
        return UpdateStatus.FAILED
    write_repository_config(store, deployment_id=deployment.pk, config=serving_versions(new_config, [new.number]))
    try:
        record_repository_bytes(deployment_id=deployment.pk)
    except ConchError:
        # What was measured after the copy stands (a few bytes of configuration apart); the update succeeded.
        log.warning("deployment.repository.not_measured", extra={"deployment_id": deployment.pk})
    with transaction.atomic():
        row = Deployment.objects.select_for_update(of=("self",)).select_related("team").get(pk=deployment.pk)
        row.model_version = new
        row.repository_prefix = new_prefix
        row.tensorrt_plan = new_plan
        row.config_pbtxt = config_to_pbtxt(new_config)
        row.target_model_version = None
        row.update_status = UpdateStatus.SUCCEEDED
        row.update_error = ""
        row.save(
            update_fields=[
                "model_version",
                "repository_prefix",
                "tensorrt_plan",
                "config_pbtxt",
                "target_model_version",
                "update_status",
                "update_error",
                "updated_at",
            ]
        )
        record_audit(
            action=AuditAction.DEPLOYMENT_VERSION_UPDATED,
            team=row.team,
            target=row,
            before={"model_version": old.pk, "number": old.number},
            after={"model_version": new.pk, "number": new.number},
        )
    log.info("deployment.update.succeeded", extra={"deployment_id": deployment.pk, "model_version_id": new.pk})
    return UpdateStatus.SUCCEEDED


def _client(server: Server) -> TritonClient:
    return TritonClient(
        server.http_url, timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS, api_key=server.api_key or None
    )


def _roll_back(servers: list[Server], config: ModelConfig, number: int) -> list[str]:
    """Load `config` serving [number] on each of `servers` again; returns a line per server that refused."""
    problems = []
    for server in servers:
        try:
            load_versions(_client(server), config, [number])
        except ConchError as exc:
            problems.append(
                f"Server {server.name} could not be given version {number} back ({exc.detail}); reconcile retries."
            )
    return problems


def _touch_update(deployment_id: int) -> None:
    Deployment.objects.filter(pk=deployment_id).update(update_heartbeat_at=timezone.now())


def _finish_failed(deployment: Deployment, message: str) -> None:
    target = deployment.target_model_version
    deployment.update_status = UpdateStatus.FAILED
    deployment.update_error = message
    deployment.target_model_version = None
    deployment.save(update_fields=["update_status", "update_error", "target_model_version", "updated_at"])
    record_audit(
        action=AuditAction.DEPLOYMENT_VERSION_UPDATE_FAILED,
        team=deployment.team,
        target=deployment,
        before={"model_version": deployment.model_version_id},
        after={"target_model_version": target.pk if target else None, "error": message.splitlines()[0]},
    )


def _record_update_failure(deployment_id: int, message: str) -> None:
    """Mark the deployment's update `failed` with `message`, unless it is no longer running."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update(of=("self",)).get(pk=deployment_id)
        if deployment.update_status in UPDATES_IN_PROGRESS:
            _finish_failed(deployment, message)


def ensure_servers_serve_current_version(deployment: Deployment) -> int:
    """Tell every ready server of a deployment that serves another set of versions than its current one (e.g. a
    pod that started from the repository mid-update) to load the current configuration; returns how many were
    told. Nothing is done while an update runs. Raises `Unavailable` when the runtime cannot list its servers.
    """
    if deployment.update_status in UPDATES_IN_PROGRESS:
        return 0
    config = served_config(deployment)
    number = deployment.model_version.number
    fixed = 0
    for server in get_runtime(deployment.runtime).servers(deployment.runtime_state):
        client = _client(server)
        try:
            if client.ready_versions(deployment.model_name) == {number}:
                continue
            if Deployment.objects.filter(pk=deployment.pk, update_status__in=UPDATES_IN_PROGRESS).exists():
                return fixed  # an update started meanwhile: its servers load [N, M] on purpose
            load_versions(client, config, [number])
        except ConchError as exc:
            log.warning(
                "deployment.server_version.not_fixed",
                extra={"deployment_id": deployment.pk, "server": server.name, "detail": exc.detail},
            )
            continue
        fixed += 1
        log.info("deployment.server_version.fixed", extra={"deployment_id": deployment.pk, "server": server.name})
    return fixed

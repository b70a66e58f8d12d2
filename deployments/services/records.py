"""Deployment records: queries scoped to the caller's teams, creation, stop requests, what a deployment shows."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from builds import services as builds
from builds.model_config import apply_deployment_overrides, instance_kind_of, parse_build_options
from conch.errors import ConchError, Conflict, InvalidInput, NotFound, attempt, refuse_all
from deployments.choices import DeploymentStatus, DesiredState, PlanStatus, RuntimeName
from deployments.models import Cluster, Deployment, TensorRTPlan
from deployments.runtimes import get_runtime
from deployments.runtimes.base import Endpoints, Server
from deployments.runtimes.kubernetes.runtime import pod_repository_location
from deployments.services.clusters import TENSORRT_OF_RELEASE, cluster_tensorrt_version, tensorrt_versions_match
from deployments.services.placement import Placement, check_instance_kind, check_placement, parse_scaling
from deployments.services.quotas import gpu_request, instance_request
from deployments.services.repository import repository_request_bytes
from deployments.services.requests import DeploymentRequest
from models_registry.choices import VersionStatus
from models_registry.naming import validate_model_name
from models_registry.services import get_version, lock_built_version
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.quotas import quota_refusals, reserve_quota
from tenancy.services import TokenGrant, get_team_for_user, object_history, require_role, teams_for_user
from tritonserving.config import ModelConfig, config_from_pbtxt, config_to_pbtxt

if TYPE_CHECKING:
    from models_registry.models import ModelVersion
    from tenancy.models import AuditEntry, Team

log = logging.getLogger(__name__)


LOG_TAIL_LINES = 30
#: Runtimes this installation can run deployments on.
ENABLED_RUNTIMES = (RuntimeName.LOCAL, RuntimeName.KUBERNETES)


# --- queries ---------------------------------------------------------------------


def visible_deployments(*, user: User, token: TokenGrant | None = None) -> QuerySet[Deployment]:
    """Deployments of the caller's teams (of the token's team, for a request made with a team-bound token; only
    those it names, for a token limited to named deployments)."""
    teams = teams_for_user(user=user, token=token)
    deployments = Deployment.objects.filter(team__in=teams).select_related("team", "model_version__model")
    if token is not None and token.deployments:
        deployments = deployments.filter(name__in=token.deployments)
    return deployments


def get_deployment(*, user: User, deployment_id: int, token: TokenGrant | None = None) -> Deployment:
    """Return a deployment the caller may see. Raises NotFound."""
    deployment = visible_deployments(user=user, token=token).filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(f"Deployment {deployment_id} does not exist or is not in one of your teams.")
    return deployment


def require_deployment_access(
    *,
    user: User,
    deployment: Deployment,
    action: str,
    token: TokenGrant | None = None,
    scope: Scope = Scope.DEPLOYMENTS_WRITE,
) -> None:
    """Check that the caller may do `action` to `deployment`: the developer role in its team and, with a token,
    `scope` and (for a token limited to named deployments) the deployment's name. Raises Forbidden or NotFound.
    """
    require_role(
        user=user,
        team=deployment.team,
        role=Role.DEVELOPER,
        action=action,
        token=token,
        scope=scope,
        deployment_name=deployment.name,
    )


def deployment_events(deployment: Deployment, limit: int = 50) -> list[AuditEntry]:
    """The deployment's history, newest first: its audit entries (created, scaled, version updates, failed,
    degraded, recovered, restarted, stop requested), at most `limit`; `tenancy.models.AuditEntry` rows. The
    caller has checked that the deployment is visible to whoever sees them (`get_deployment`)."""
    return object_history(team=deployment.team, object_type="deployment", object_id=deployment.pk, limit=limit)


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


def serving_servers(deployment: Deployment) -> list[Server]:
    """The deployment's Tritons that are up and ready now (its local server, or one per ready pod), with the
    URLs and key Conch's own processes use. Raises Unavailable when the runtime cannot tell."""
    return get_runtime(deployment.runtime).servers(deployment.runtime_state)


def effective_settings(deployment: Deployment) -> dict[str, Any]:
    """Batching and instance settings of the deployment's effective model configuration.

    Returns max_batch_size, instance_count (summed over instance groups), instance_kind (the first group's:
    KIND_AUTO, KIND_CPU, KIND_GPU or KIND_MODEL), dynamic_batching
    (bool) and max_queue_delay_microseconds (None without a dynamic batcher).
    """
    if not deployment.config_pbtxt:
        return {}
    config = config_from_pbtxt(deployment.config_pbtxt)
    batching = config.HasField("dynamic_batching")
    return {
        "max_batch_size": config.max_batch_size,
        "instance_count": sum(group.count or 1 for group in config.instance_group) or 1,
        "instance_kind": instance_kind_of(config),
        "dynamic_batching": batching,
        "max_queue_delay_microseconds": config.dynamic_batching.max_queue_delay_microseconds if batching else None,
    }


# --- create / delete ---------------------------------------------------------------


def create_deployment(
    *,
    user: User,
    request: DeploymentRequest,
    token: TokenGrant | None = None,
) -> Deployment:
    """Create the deployment `request` describes (`DeploymentRequest`) of a built model version and queue its start.

    For the `kubernetes` runtime the request's placement names the cluster, the replicas or autoscaling, the GPUs
    and the cpu/memory per pod; see `deployments.services.placement.check_placement` for the rules and errors.

    `max_batch_size` and `max_queue_delay_microseconds` override the version's model
    configuration (Triton "Model Configuration": max_batch_size, dynamic_batching
    max_queue_delay_microseconds); `instance_count` sets the instance group count
    (concurrent model execution) and `instance_kind` (KIND_AUTO, KIND_CPU, KIND_GPU; None: as built) the kind
    of its instance groups, where it can run (`deployments.services.placement.check_instance_kind`: KIND_GPU
    needs a GPU on the worker host, or GPUs per pod). Raises InvalidInput naming the field, NotFound for a
    team or version the caller cannot see, Conflict for a version that is not built or
    a name already used by an active deployment of the team, QuotaExceeded naming `deployments`, `instances`,
    `gpu` or `storage_bytes` (the deployment's own copy of the build's files, see
    `deployments.services.repository`) when the team's quota has no room for it (see `deployments.services.quotas`
    for what counts).
    Needs the developer role in the team and, with a `token`, the `deployments:write` scope and (for a token
    limited to named deployments) `name` among them: Forbidden otherwise.
    """
    plan = plan_deployment(user=user, request=request, token=token)
    name, runtime, instance_kind = request.name, request.runtime, request.instance_kind
    team, version, placement, config = plan.team, plan.version, plan.placement, plan.config
    version_id = version.pk
    instance_count, max_batch_size, delay = plan.instance_count, plan.max_batch_size, plan.max_queue_delay_microseconds
    requested = plan.requested
    try:
        with transaction.atomic():
            reserve_quota(team=team, requested=requested, what="this deployment")
            lock_built_version(version_id=version.pk)  # a deletion of the version either ran first or waits
            deployment = Deployment.objects.create(
                team=team,
                name=name,
                model_version=version,
                runtime=runtime,
                cluster=placement.cluster,
                replicas=placement.replicas,
                autoscaling=placement.autoscaling,
                gpu=placement.gpu,
                cpu=placement.cpu,
                memory=placement.memory,
                instance_count=instance_count or 1,
                max_batch_size=max_batch_size,
                max_queue_delay_microseconds=delay,
                config_pbtxt=config_to_pbtxt(config),
                repository_prefix=(
                    plan.tensorrt_plan.repository_prefix
                    if plan.tensorrt_plan
                    else builds.served_repository_prefix(version)
                ),
                tensorrt_plan=plan.tensorrt_plan,
                repository_bytes=requested.get("storage_bytes", 0),
                created_by=user,
            )
            record_audit(
                action=AuditAction.DEPLOYMENT_CREATED,
                team=team,
                target=deployment,
                after={
                    "model_version": version_id,
                    "runtime": runtime,
                    "cluster": placement.cluster.name if placement.cluster else None,
                    "replicas": placement.replicas,
                    "autoscaling": placement.autoscaling,
                    "gpu": placement.gpu,
                    "instance_count": deployment.instance_count,
                    "instance_kind": instance_kind or None,
                    "tensorrt_plan": plan.tensorrt_plan.pk if plan.tensorrt_plan else None,
                },
            )
            _queue_start(deployment.pk)
    except IntegrityError:
        raise Conflict(f"Team '{team.slug}' already has an active deployment named '{name}'.", field="name") from None
    log.info("deployment.created", extra={"deployment_id": deployment.pk})
    return deployment


@dataclass(frozen=True)
class DeploymentPlan:
    """A deployment request checked by every rule but the quota: what `create_deployment` would write.

    `requested`: what it would take from the team's quotas ({"deployments": 1, "instances": n, "storage_bytes":
    n} for local, {"deployments": 1, "gpu": {resource: count}, "storage_bytes": n} for kubernetes), as
    `reserve_quota` takes it; `storage_bytes` is the size of the deployment's own repository
    (`repository_request_bytes`).
    """

    team: Team
    version: ModelVersion
    placement: Placement
    config: ModelConfig
    instance_count: int | None
    max_batch_size: int | None
    max_queue_delay_microseconds: int | None
    requested: dict[str, Any]
    #: The TensorRT plan of the version it would serve instead of the ONNX model (`usable_plan`), or None.
    tensorrt_plan: TensorRTPlan | None = None


def plan_deployment(
    *,
    user: User,
    request: DeploymentRequest,
    token: TokenGrant | None = None,
) -> DeploymentPlan:
    """Check a deployment request by every rule of `create_deployment` except the quota, writing nothing.

    Same arguments and errors as `create_deployment` (InvalidInput naming the field, NotFound, Conflict for a
    version that is not built, Forbidden without the developer role), except QuotaExceeded and the duplicate name.
    Raises the first refusal `_check_request` finds.
    """
    checked = _check_request(user=user, request=request, token=token)
    if checked.refusals:
        raise checked.refusals[0]
    if checked.plan is None:
        raise ValueError("_check_request returned neither a plan nor a refusal.")
    return checked.plan


@dataclass(frozen=True)
class _CheckedRequest:
    """What `_check_request` found: the plan (None when refused), the team when the caller may deploy in it
    (None: nothing past that can be said), what the request takes from the quotas as far as it could be told,
    and every refusal in the order `plan_deployment` checks."""

    plan: DeploymentPlan | None
    team: Team | None
    requested: dict[str, Any]
    refusals: list[ConchError]


def _check_request(
    *,
    user: User,
    request: DeploymentRequest,
    token: TokenGrant | None,
) -> _CheckedRequest:
    """Run `plan_deployment`'s checks, each one that its inputs allow, gathering every refusal.

    Order (so the first refusal is the one a stop-at-first check gives): the name; the team and the caller's
    role (a refusal there ends the check); the runtime; the placement (`check_placement`, field by field); the
    S3 repository a cluster needs; the version (visible, of the team, built); the batching and instance options;
    the instance kind against where it runs; the options applied to the version's configuration.
    """
    name, team_slug, runtime, gpu = request.name, request.team_slug, request.runtime, request.placement.gpu
    refusals: list[ConchError] = []
    attempt(refusals, validate_model_name, name, what="deployment")
    try:
        team = get_team_for_user(user=user, slug=team_slug, token=token)
        require_role(
            user=user,
            team=team,
            role=Role.DEVELOPER,
            action="Creating a deployment",
            token=token,
            scope=Scope.DEPLOYMENTS_WRITE,
            deployment_name=name,
        )
    except ConchError as exc:
        return _CheckedRequest(plan=None, team=None, requested={}, refusals=[*refusals, exc])
    placement = None
    if runtime not in RuntimeName.values:
        refusals.append(InvalidInput(f"runtime must be one of {', '.join(RuntimeName.values)}.", field="runtime"))
    elif runtime not in ENABLED_RUNTIMES:
        refusals.append(
            InvalidInput(f"The '{runtime}' runtime is not enabled on this installation; use 'local'.", field="runtime")
        )
    else:
        placement, placement_refusals = check_placement(request.placement)
        refusals.extend(placement_refusals)
    if placement is not None and runtime == RuntimeName.KUBERNETES:
        # Pods read the repository from the object store themselves: it must be S3 (raises InvalidInput).
        attempt(
            refusals,
            pod_repository_location,
            get_object_store().triton_repository_location("check"),
            placement.require_cluster().s3_endpoint,
        )
    _, version = attempt(
        refusals, version_for_deployment, user=user, model_version_id=request.model_version_id, token=token
    )
    if version is not None and version.model.team_id != team.pk:
        refusals.append(
            InvalidInput(
                f"Model version {version.pk} belongs to team '{version.model.team.slug}', not '{team.slug}'.",
                field="model_version",
            )
        )
        version = None
    if version is not None and version.status != VersionStatus.BUILT:
        refusals.append(
            Conflict(
                f"Model version {version.pk} is '{version.status}'; only a built version can be deployed"
                + (f" (build error: {error})" if (error := builds.current_error(version)) else "")
                + ".",
                field="model_version",
            )
        )
        version = None
    if version is not None:
        refusals.extend(_gpu_requirement_refusals(version, runtime=runtime, placement=placement, gpu=gpu))
    # One definition of the option bounds: the build's (builds.model_config MAX_* constants).
    options_parsed, overrides = attempt(
        refusals,
        parse_build_options,
        {
            "instance_count": request.instance_count,
            "max_batch_size": request.max_batch_size,
            "max_queue_delay_microseconds": request.max_queue_delay_microseconds,
        },
    )
    kind_checked, kind = False, None
    if runtime in ENABLED_RUNTIMES:
        # With a placement refused elsewhere, whether GPUs were asked for at all still tells KIND_GPU's fate.
        kind_checked, kind = attempt(
            refusals,
            check_instance_kind,
            runtime=runtime,
            instance_kind=request.instance_kind,
            gpu=placement.gpu if placement is not None else gpu,
        )
    config = None
    # A Kubernetes deployment with GPUs of a product the version has a TensorRT plan for serves the plan.
    tensorrt_plan = (
        usable_plan(version, placement.cluster, (placement.gpu or {}).get("product"))
        if version is not None and placement is not None and runtime == RuntimeName.KUBERNETES
        else None
    )
    if version is not None and options_parsed and kind_checked:
        _, config = attempt(
            refusals,
            apply_deployment_overrides,
            config_from_pbtxt(tensorrt_plan.config_pbtxt if tensorrt_plan else builds.served_config_pbtxt(version)),
            instance_count=overrides.instance_count,
            max_batch_size=overrides.max_batch_size,
            max_queue_delay_microseconds=overrides.max_queue_delay_microseconds,
            instance_kind=kind,
        )
    requested: dict[str, Any] = {"deployments": 1}
    if runtime == RuntimeName.LOCAL and config is not None:
        requested["instances"] = instance_request(config)
    elif runtime == RuntimeName.KUBERNETES and placement is not None:
        requested["gpu"] = gpu_request(
            replicas=placement.replicas, autoscaling=placement.autoscaling, gpu=placement.gpu
        )
    if config is not None:
        # The deployment's own copy of the build's files (`deployments.services.repository`) is stored bytes too.
        _, repository_bytes = attempt(
            refusals,
            repository_request_bytes,
            build_prefix=tensorrt_plan.repository_prefix if tensorrt_plan else builds.served_repository_prefix(version),
            model_name=version.model.name,
            number=version.number,
            config=config,
        )
        requested["storage_bytes"] = repository_bytes or 0
    plan = None
    if not refusals:
        if placement is None:
            raise ValueError("A deployment request with no refusal has a placement.")
        plan = DeploymentPlan(
            team=team,
            version=version,
            placement=placement,
            config=config,
            instance_count=overrides.instance_count,
            max_batch_size=overrides.max_batch_size,
            max_queue_delay_microseconds=overrides.max_queue_delay_microseconds,
            requested=requested,
            tensorrt_plan=tensorrt_plan,
        )
    return _CheckedRequest(plan=plan, team=team, requested=requested, refusals=refusals)


def _gpu_requirement_refusals(version: Any, *, runtime: str, placement: Any, gpu: Any) -> list[ConchError]:
    """Why a version that runs only on one GPU product and TensorRT version (a TensorRT plan:
    `builds.gpu_requirement`) cannot be deployed as asked: on the local runtime (field `runtime`), without that
    `gpu.product` (field `gpu.product`), or on a cluster whose Triton carries another TensorRT, or one Conch does
    not know (field `cluster`). [] when it can, or for a model that runs anywhere."""
    requirement = builds.gpu_requirement(version)
    if requirement is None:
        return []
    product, built_with = requirement
    what = f"Model version {version.pk} is a TensorRT plan built for {product} with TensorRT {built_with}"
    instead = "or upload the ONNX model it was built from, which Conch serves anywhere."
    if runtime != RuntimeName.KUBERNETES:
        return [
            InvalidInput(
                f"{what}: a plan runs only on the GPU and TensorRT it was built for, and the local runtime has "
                f"neither. Deploy it on the kubernetes runtime with gpu.product {product}, {instead}",
                field="runtime",
            )
        ]
    refusals: list[ConchError] = []
    asked = ((placement.gpu if placement is not None else gpu) or {}).get("product")
    if asked != product:
        refusals.append(
            InvalidInput(
                f"{what}; the deployment asks for "
                + (f"gpu.product {asked}" if asked else "no gpu.product")
                + f". Give gpu.product {product} (with gpu.count), {instead}",
                field="gpu.product",
            )
        )
    if placement is not None and placement.cluster is not None:
        cluster = placement.cluster
        carried = cluster_tensorrt_version(cluster)
        if carried is None:
            refusals.append(
                InvalidInput(
                    f"{what}, but Conch does not know which TensorRT cluster {cluster.name!r}'s Triton image "
                    f"{cluster.triton_image} carries. Register the cluster with --tensorrt-version (the version the "
                    f"image's TensorRT reports), or use an NGC image of a release Conch knows "
                    f"({', '.join(sorted(TENSORRT_OF_RELEASE))}), {instead}",
                    field="cluster",
                )
            )
        elif not tensorrt_versions_match(built_with, carried):
            refusals.append(
                InvalidInput(
                    f"{what}, but cluster {cluster.name!r} runs {cluster.triton_image} with TensorRT {carried}, which "
                    f"cannot load it. Build the plan again with TensorRT {carried} (trtexec in the TensorRT image of "
                    f"the same release), deploy on a cluster whose Triton carries TensorRT {built_with}, {instead}",
                    field="cluster",
                )
            )
    return refusals


def check_deployment_fits(*, user: User, request: DeploymentRequest, token: TokenGrant | None = None) -> dict[str, Any]:
    """Say whether a deployment would be accepted now, by the same checks as `create_deployment`, writing nothing,
    naming every refusal at once.

    Takes `create_deployment`'s arguments. Runs `plan_deployment`'s checks (each that its inputs allow,
    gathering refusals), then the quota reservation's (`quota_refusals`, under the team's lock, for every field and
    unit: `deployments`, `instances`, `gpu` per resource) in a transaction that writes nothing, then whether the
    name is taken by an active deployment of the team (Conflict, field `name`, as the create's unique constraint
    would say). Returns {"requested": …} when it fits. Otherwise raises the first refusal, the one the create
    would give at this moment (QuotaExceeded 409 with the same message, field and numbers, or the same
    InvalidInput / NotFound / Conflict / Forbidden), carrying all of them as `refusals` (`conch.errors.refuse_all`;
    the API lists them under `errors`). A refusal of the team or role ends the check: nothing else is said.
    """
    checked = _check_request(user=user, request=request, token=token)
    refusals = list(checked.refusals)
    if checked.team is not None:
        with transaction.atomic():
            refusals.extend(quota_refusals(team=checked.team, requested=checked.requested, what="this deployment"))
        name = request.name
        active = Deployment.objects.filter(team=checked.team, name=name).exclude(status=DeploymentStatus.STOPPED)
        if active.exists():
            refusals.append(
                Conflict(f"Team '{checked.team.slug}' already has an active deployment named '{name}'.", field="name")
            )
    if refusals:
        raise refuse_all(refusals)
    return {"requested": checked.requested}


def request_stop(*, user: User, deployment: Deployment, token: TokenGrant | None = None) -> Deployment:
    """Ask for a deployment to stop; a task ends its Triton and frees its ports.

    Needs the developer role in its team (and, with a token, `deployments:write`): Forbidden otherwise.
    """
    require_deployment_access(user=user, deployment=deployment, action="Stopping a deployment", token=token)
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update(of=("self",)).select_related("team").get(pk=deployment.pk)
        if deployment.status == DeploymentStatus.STOPPED:
            return deployment
        previous = deployment.status
        deployment.desired_state = DesiredState.STOPPED
        deployment.status = DeploymentStatus.STOPPING
        deployment.save(update_fields=["desired_state", "status", "updated_at"])
        record_audit(
            action=AuditAction.DEPLOYMENT_STOP_REQUESTED,
            team=deployment.team,
            target=deployment,
            before={"status": previous},
            after={"status": deployment.status},
        )
        pk = deployment.pk
        queue_task("deployments.stop_deployment", pk)
    return deployment


def usable_plan(version: Any, cluster: Cluster | None, gpu_product: str | None) -> TensorRTPlan | None:
    """The succeeded TensorRT plan (`deployments.services.plans`) a deployment of `version` on `cluster` with GPUs
    of `gpu_product` serves: one made from the build the version serves now, on that cluster while it runs the same
    Triton image; the FP16 one when both exist (it was compared within FP16's tolerance). None when there is none:
    the deployment serves the ONNX model."""
    build = builds.served_build(version)
    if cluster is None or not gpu_product or build is None:
        return None
    plans = TensorRTPlan.objects.filter(
        build=build, cluster=cluster, gpu_product=gpu_product, status=PlanStatus.SUCCEEDED
    ).order_by("-fp16", "-created_at")
    return next((plan for plan in plans if plan.report.get("triton_image") == cluster.triton_image), None)


def version_for_deployment(*, user: User, model_version_id: Any, token: TokenGrant | None = None) -> ModelVersion:
    """The model version `model_version_id` names (an id, as JSON or text), when the caller may see it.

    Raises InvalidInput (not an id) or NotFound (no such version in the caller's teams), field `model_version`.
    """
    if isinstance(model_version_id, bool):
        model_version_id = None
    try:
        version_id = int(model_version_id)
    except (TypeError, ValueError):
        raise InvalidInput("model_version must be the id of a model version.", field="model_version") from None
    try:
        return get_version(user=user, version_id=version_id, token=token)
    except NotFound as exc:
        raise NotFound(exc.detail, field="model_version") from None


def queue_task(name: str, *args: object) -> None:
    """Queue a deployments task by its name once the transaction commits (tasks import this module)."""
    transaction.on_commit(lambda: current_app.signature(name, args=args).delay())


def _queue_start(deployment_id: int) -> None:
    queue_task("deployments.start_deployment", deployment_id)


def rescale_deployment(
    *,
    user: User,
    deployment: Deployment,
    replicas: Any = None,
    autoscaling: Any = None,
    token: TokenGrant | None = None,
) -> Deployment:
    """Change a Kubernetes deployment's pod count: fixed `replicas` (0..max), or new `autoscaling` bounds (which
    replace fixed replicas); the change is applied to the cluster by a queued start task (an idempotent apply).

    Raises Forbidden without the developer role (or, with a token, `deployments:write`), InvalidInput naming
    the field (`replicas`, `autoscaling.*`; a local deployment has neither), Conflict when the deployment is
    stopping or stopped, QuotaExceeded (field `gpu`) when more GPUs than the team's quota leaves would be
    needed (scaling down is always allowed).
    """
    require_deployment_access(user=user, deployment=deployment, action="Scaling a deployment", token=token)
    if deployment.runtime != RuntimeName.KUBERNETES:
        field = "replicas" if replicas is not None else "autoscaling"
        raise InvalidInput(
            f"{field} applies to kubernetes deployments; a local deployment scales with instance_count.", field=field
        )
    count, scaling = parse_scaling(replicas=replicas, autoscaling=autoscaling)
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update(of=("self",)).select_related("team").get(pk=deployment.pk)
        if deployment.desired_state != DesiredState.RUNNING:
            raise Conflict(f"Deployment {deployment.pk} is '{deployment.status}'; it cannot be scaled.", field=None)
        reserve_quota(
            team=deployment.team,
            requested={"gpu": gpu_request(replicas=count, autoscaling=scaling, gpu=deployment.gpu)},
            released={
                "gpu": gpu_request(replicas=deployment.replicas, autoscaling=deployment.autoscaling, gpu=deployment.gpu)
            },
            what="this scaling",
        )
        before = {"replicas": deployment.replicas, "autoscaling": deployment.autoscaling}
        deployment.replicas = count
        deployment.autoscaling = scaling
        if scaling:
            deployment.status_message = (
                f"autoscaling between {scaling['min_replicas']} and {scaling['max_replicas']} pods"
            )
        elif count == 0:
            deployment.status_message = "scaling to 0 replicas: nothing will serve until replicas is raised again"
        else:
            deployment.status_message = f"scaling to {count} replica{'s' if count != 1 else ''}"
        deployment.save(update_fields=["replicas", "autoscaling", "status_message", "updated_at"])
        record_audit(
            action=AuditAction.DEPLOYMENT_RESCALED,
            team=deployment.team,
            target=deployment,
            before=before,
            after={"replicas": count, "autoscaling": scaling},
        )
        _queue_start(deployment.pk)
    log.info("deployment.rescaled", extra={"deployment_id": deployment.pk, "replicas": count})
    return deployment

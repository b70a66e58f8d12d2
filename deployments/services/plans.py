"""TensorRT plans of built ONNX versions, built on the GPU they will run on by a Kubernetes Job.

A TensorRT plan runs only on the GPU model and the TensorRT version it was built with (TensorRT "Engine
Portability"), so Conch builds it there: `request_tensorrt_plan` ("optimize version N for GPU product X on cluster
Y") records a `TensorRTPlan`; `advance_tensorrt_plan` (a task, then beat's `advance_tensorrt_plans`, so a lost task
heals by itself) moves it on:

1. `pending`: Conch writes the inputs (`builds.verification.make_sample_inputs`, the batch of the run shape) to the
   store, presigns the URLs the Job reads and writes, and applies the Job and its Secret
   (`deployments.runtimes.kubernetes.plan_job`) in the TensorRT image of the cluster's Triton release
   (`tensorrt_image_of`);
2. `building`: each look reads the Job and its pod. A pod that cannot pull its image, that waits for a free GPU
   longer than CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS, or whose program fails (trtexec's own words), or a Job past its
   deadline, ends the plan `failed` with a message saying what to do;
3. once the Job completed, Conch reads trtexec's outputs, runs the same inputs through the ONNX model (onnxruntime,
   in the build sandbox) and compares every output (`builds.comparison.compare_outputs`: the output datatype's
   tolerance, FP16's for a plan built with `fp16`). Within it, the plan's repository (`<model>/config.pbtxt`,
   `<model>/<N>/model.plan`) is complete and the plan `succeeded`; otherwise it fails with the figures.

Whatever the end, the Job and its Secret are deleted (the Job's pod with it), and a failed plan leaves nothing in the
store. Deployments of the version on that cluster with that GPU product then serve the plan
(`usable_plan`); every other deployment keeps the ONNX model.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from builds import services as builds
from builds.comparison import DEFAULT_TOLERANCES, compare_outputs
from builds.conversion import run_source_in_sandbox
from builds.formats import format_by_key
from builds.sandbox import SandboxError
from builds.verification import make_sample_inputs
from conch.errors import ConchError, Conflict, InvalidInput, NotFound, Unavailable
from deployments.choices import FINAL_PLAN_STATUSES, PlanStatus
from deployments.models import Cluster, TensorRTPlan
from deployments.runtimes.kubernetes.api import ClusterApi, cluster_api
from deployments.runtimes.kubernetes.directory import access_of
from deployments.runtimes.kubernetes.manifests import GPU_RESOURCE
from deployments.runtimes.kubernetes.plan_job import (
    PlanJobSpec,
    TensorShape,
    job_name,
    plan_job_manifest,
    plan_request,
    plan_request_secret_manifest,
    read_trtexec_outputs,
)
from deployments.runtimes.kubernetes.runtime import INSTALLATION_LABEL, KubernetesRuntime
from deployments.services.clusters import cluster_gpu_offers, get_cluster, tensorrt_image_of
from deployments.services.records import queue_task, usable_plan, version_for_deployment
from deployments.services.repository import version_files_bytes
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.quotas import reserve_quota
from tenancy.services import TokenGrant, require_role, teams_for_user
from tritonserving.config import ModelConfig, config_from_pbtxt, config_to_pbtxt, datatype_name

log = logging.getLogger(__name__)

__all__ = [
    "PLANS_ROOT",
    "advance_tensorrt_plan",
    "advance_tensorrt_plans",
    "collect_plan_garbage",
    "delete_tensorrt_plan",
    "get_tensorrt_plan",
    "plan_config",
    "plan_shapes",
    "request_tensorrt_plan",
    "usable_plan",
    "visible_plans",
]

#: Object-store folder of every plan: `plans/<id>/repository/...` (what deployments copy), `plans/<id>/work/...`
#: (the Job's inputs and outputs, deleted once the plan is over).
PLANS_ROOT = "plans"
#: Triton datatypes a TensorRT engine's inputs and outputs may have (TensorRT "Types": DataType).
TENSORRT_DATATYPES = frozenset({"FP32", "FP16", "BF16", "INT8", "INT32", "INT64", "BOOL", "UINT8"})
#: Pod waiting reasons that mean its image will not come (Kubernetes "Images": image pull back-off).
_IMAGE_FAILURES = ("ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
#: Seconds a pod may stay in CreateContainerConfigError (its Secret not there yet) before the plan fails.
_CONFIG_ERROR_GRACE_S = 120
#: Seconds presigned URLs stay valid past the Job's deadline.
_URL_MARGIN_S = 600
_TENSORRT_LINE = re.compile(r"TensorRT version:\s*([0-9][0-9.]*[0-9])")
_FOLDER = re.compile(rf"^{PLANS_ROOT}/([0-9]+)/")


def _prefix(plan_id: int) -> str:
    return f"{PLANS_ROOT}/{plan_id}"


def _repository(plan_id: int) -> str:
    return f"{_prefix(plan_id)}/repository"


def _work(plan_id: int) -> str:
    return f"{_prefix(plan_id)}/work"


# --- pure rules ---------------------------------------------------------------------------------------------------


def plan_shapes(config: ModelConfig) -> tuple[TensorShape, ...]:
    """The optimization profile of a plan of the ONNX model `config` configures: for a batching model (max_batch_size
    B > 0) every input from batch 1 to B, optimized for B, run on min(B, 2); fixed shapes otherwise.

    Raises InvalidInput (field `model_version`) for what TensorRT cannot take: a dynamic axis other than the batch
    axis (a plan needs a range for it: TensorRT "Working with Dynamic Shapes"), or an input or output whose
    datatype TensorRT has no type for (BYTES, FP64, INT16, UINT16, UINT32, UINT64), naming the tensor.
    """
    batch = int(config.max_batch_size)
    for tensor in [*config.input, *config.output]:
        datatype = datatype_name(tensor.data_type)
        if datatype not in TENSORRT_DATATYPES:
            raise InvalidInput(
                f"Tensor {tensor.name!r} is {datatype}, which TensorRT has no type for (it takes "
                f"{', '.join(sorted(TENSORRT_DATATYPES))}); this model cannot become a TensorRT plan. Export it with "
                "that tensor in one of those types, or serve the ONNX model.",
                field="model_version",
            )
    shapes = []
    for tensor in config.input:
        dims = tuple(int(d) for d in tensor.dims)
        dynamic = [axis for axis, size in enumerate(dims) if size < 0]
        if dynamic:
            axis = dynamic[0] + (1 if batch > 0 else 0)
            raise InvalidInput(
                f"Input {tensor.name!r} has a dynamic axis {axis} (shape {list(dims)} besides the batch axis): a "
                "TensorRT plan needs a fixed size or a range for every axis but the batch. Export the model with "
                "that axis fixed to the size you serve, or serve the ONNX model.",
                field="model_version",
            )
        if batch > 0:
            shapes.append(TensorShape(tensor.name, (1, *dims), (batch, *dims), (batch, *dims), (min(batch, 2), *dims)))
        else:
            shapes.append(TensorShape(tensor.name, dims, dims, dims, dims))
    return tuple(shapes)


def plan_config(onnx_config: ModelConfig) -> ModelConfig:
    """The model configuration of the plan made from a model configured as `onnx_config`: the same name, tensors,
    batching and instance groups, served by the `tensorrt` backend (`platform: "tensorrt_plan"`, `model.plan`:
    Triton "Model Configuration" > "Platform and Backend"). ONNX Runtime's own settings (its execution accelerators
    and parameters) are dropped."""
    config = type(onnx_config)()
    config.CopyFrom(onnx_config)
    config.platform = "tensorrt_plan"
    config.backend = "tensorrt"
    config.default_model_filename = "model.plan"
    config.ClearField("optimization")
    config.ClearField("parameters")
    return config


def _onnx_config(build: Any) -> ModelConfig:
    config = config_from_pbtxt(build.config_pbtxt)
    if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
        served = config.platform or config.backend or "another backend"
        raise InvalidInput(
            f"A TensorRT plan is built from an ONNX model; this version is served by {served}. Optimize a version "
            "served as ONNX (an .onnx upload, or a framework Conch converts to ONNX).",
            field="model_version",
        )
    return config


# --- asking, listing, deleting ------------------------------------------------------------------------------------


def visible_plans(*, user: User, token: TokenGrant | None = None) -> QuerySet[TensorRTPlan]:
    """Plans of the teams the caller (and its token) may see, newest first."""
    teams = teams_for_user(user=user, token=token)
    return TensorRTPlan.objects.filter(team__in=teams).select_related("cluster", "model_version__model")


def get_tensorrt_plan(*, user: User, plan_id: int, token: TokenGrant | None = None) -> TensorRTPlan:
    """One plan the caller may see. Raises NotFound."""
    plan = visible_plans(user=user, token=token).filter(pk=plan_id).first()
    if plan is None:
        raise NotFound(f"There is no TensorRT plan {plan_id} in your teams.")
    return plan


def request_tensorrt_plan(
    *,
    user: User,
    model_version_id: Any,
    cluster_name: str,
    gpu_product: str,
    fp16: bool = False,
    token: TokenGrant | None = None,
) -> TensorRTPlan:
    """Ask for a TensorRT plan of a built ONNX version for `gpu_product` (a `nvidia.com/gpu.product` label value) on
    cluster `cluster_name`, built with FP16 kernels allowed when `fp16`; queues its Job and returns the plan.

    Raises NotFound (the version or the cluster), InvalidInput naming the field: `model_version` (not ONNX, a
    dynamic axis besides the batch axis, a tensor TensorRT has no type for), `cluster` (its Triton image has no
    TensorRT image Conch knows), `gpu_product` (no schedulable node of the cluster offers whole GPUs of it);
    Conflict when the same plan is being built or was built; QuotaExceeded (`storage_bytes`); Unavailable when the
    cluster cannot be asked about its GPUs. Needs the developer role (token scope `deployments:write`).
    """
    version = version_for_deployment(user=user, model_version_id=model_version_id, token=token)
    require_role(
        user=user,
        team=version.model.team,
        role=Role.DEVELOPER,
        action="Building a TensorRT plan",
        token=token,
        scope=Scope.DEPLOYMENTS_WRITE,
    )
    build = builds.served_build(version)
    if build is None:
        raise Conflict(
            f"Model version {version.pk} ({version.model.name}:{version.number}) is {version.status!r}: a plan is made "
            "of a built version. Build it first (or pick a built one).",
            field="model_version",
        )
    config = _onnx_config(build)
    shapes = plan_shapes(config)
    if not Cluster.objects.exists():
        raise InvalidInput(
            "A TensorRT plan is built by a Job on a Kubernetes cluster's GPU node, and no cluster is registered: an "
            "admin registers one with manage.py register_cluster (docs/deploying.md). Without one, serve the ONNX "
            "model.",
            field="cluster",
        )
    cluster = get_cluster(name=cluster_name)
    image = tensorrt_image_of(cluster.triton_image)
    if image is None:
        raise InvalidInput(
            f"Cluster {cluster.name!r} runs {cluster.triton_image}, which is not an NGC tritonserver:<YY.MM>-py3 "
            "image: Conch cannot tell which TensorRT image builds plans its Triton runs. Register the cluster with "
            "an NGC Triton image (or a mirror of one under the same name).",
            field="cluster",
        )
    gpu_product = str(gpu_product or "").strip()
    offered = sorted(
        {offer.product for offer in cluster_gpu_offers(cluster) if offer.resource == GPU_RESOURCE and offer.product}
    )
    if gpu_product not in offered:
        raise InvalidInput(
            f"No schedulable node of cluster {cluster.name!r} offers whole GPUs of product {gpu_product!r}; it offers "
            f"{', '.join(offered) or 'none'}. A plan is built on the GPU product it will run on.",
            field="gpu_product",
        )
    reserved = version_files_bytes(
        get_object_store(), build_prefix=build.repository_prefix, model_name=version.model.name, number=version.number
    )
    try:
        with transaction.atomic():
            reserve_quota(team=version.model.team, requested={"storage_bytes": reserved}, what="this TensorRT plan")
            plan = TensorRTPlan.objects.create(
                team=version.model.team,
                model_version=version,
                build=build,
                cluster=cluster,
                gpu_product=gpu_product,
                tensorrt_version=cluster.tensorrt_version,
                image=image,
                fp16=bool(fp16),
                plan_bytes=reserved,
                message=f"queued: a Job will build it on a {gpu_product} node of {cluster.name}",
                report={"shapes": [_shape_dict(shape) for shape in shapes], "triton_image": cluster.triton_image},
                created_by=user,
            )
            record_audit(
                action=AuditAction.PLAN_REQUESTED,
                team=plan.team,
                target=plan,
                after={"model_version": version.pk, "cluster": cluster.name, "gpu_product": gpu_product, "fp16": fp16},
            )
            queue_task("deployments.advance_tensorrt_plan", plan.pk)
    except IntegrityError:
        existing = (
            TensorRTPlan.objects.filter(build=build, cluster=cluster, gpu_product=gpu_product, fp16=bool(fp16))
            .exclude(status=PlanStatus.FAILED)
            .first()
        )
        raise Conflict(
            f"Plan {existing.pk if existing else '?'} of this version for {gpu_product} on {cluster.name} is "
            f"{existing.status if existing else 'there'} already; delete it to build it again.",
            field="gpu_product",
        ) from None
    log.info("plan.requested", extra={"plan_id": plan.pk})
    return plan


def delete_tensorrt_plan(*, user: User, plan: TensorRTPlan, token: TokenGrant | None = None) -> None:
    """Delete a plan: its Job (when it is still building) and its objects. Raises Conflict while a deployment
    serves it, Forbidden without the developer role, Unavailable when the store cannot be reached."""
    require_role(
        user=user,
        team=plan.team,
        role=Role.DEVELOPER,
        action="Deleting a TensorRT plan",
        token=token,
        scope=Scope.DEPLOYMENTS_WRITE,
    )
    users = plan.deployments.exclude(status="stopped")
    if users.exists():
        names = ", ".join(sorted(users.values_list("name", flat=True)))
        raise Conflict(f"Deployments {names} serve this plan; stop them first.", field="plan")
    if plan.status not in FINAL_PLAN_STATUSES:
        _clean_up_job(plan)
    get_object_store().delete_prefix(_prefix(plan.pk) + "/")
    with transaction.atomic():
        record_audit(action=AuditAction.PLAN_DELETED, team=plan.team, target=plan)
        plan.deployments.update(tensorrt_plan=None)
        plan.delete()


# --- moving a plan on ---------------------------------------------------------------------------------------------


def advance_tensorrt_plans(*, now: datetime | None = None) -> int:
    """Move every plan that is not over on (`advance_tensorrt_plan`); returns how many were looked at. A cluster
    that does not answer leaves its plans for the next look."""
    ids = list(TensorRTPlan.objects.exclude(status__in=FINAL_PLAN_STATUSES).values_list("pk", flat=True))
    for plan_id in ids:
        try:
            advance_tensorrt_plan(plan_id=plan_id, now=now)
        except Unavailable as error:
            log.warning("plan.advance_unavailable", extra={"plan_id": plan_id, "error": error.detail})
    return len(ids)


def advance_tensorrt_plan(*, plan_id: int, now: datetime | None = None) -> str:
    """Do what is due for one plan (see the module docstring) and return its status. `now` (default: the clock)
    decides how long its pod has waited. Idempotent: two workers on one plan apply the same objects, and only one
    of them records the end. Raises Unavailable when the cluster or the store cannot be reached (a later look
    goes on)."""
    now = now or timezone.now()
    plan = (
        TensorRTPlan.objects.select_related("cluster", "build", "model_version__model", "team")
        .filter(pk=plan_id)
        .first()
    )
    if plan is None:
        return "gone"
    if plan.status == PlanStatus.PENDING:
        try:
            _start_job(plan, now)
        except InvalidInput as error:
            _fail(plan, error.detail)
        return _status(plan_id)
    if plan.status == PlanStatus.BUILDING:
        _follow_job(plan, now)
    return _status(plan_id)


def _status(plan_id: int) -> str:
    return str(TensorRTPlan.objects.filter(pk=plan_id).values_list("status", flat=True).first() or "gone")


def _api(plan: TensorRTPlan) -> ClusterApi:
    return cluster_api(access_of(plan.cluster))


def _spec(plan: TensorRTPlan, shapes: Sequence[TensorShape]) -> PlanJobSpec:
    return PlanJobSpec(
        plan_id=plan.pk,
        team=plan.team.slug,
        namespace=plan.cluster.namespace,
        image=plan.image,
        gpu_product=plan.gpu_product,
        shapes=tuple(shapes),
        fp16=plan.fp16,
        deadline_s=int(settings.CONCH_PLAN_JOB_DEADLINE_SECONDS),
        image_pull_secrets=tuple(plan.cluster.image_pull_secrets or ()),
        installation=KubernetesRuntime.installation(),
    )


def _shape_dict(shape: TensorShape) -> dict[str, Any]:
    return {
        "name": shape.name,
        "min": list(shape.minimum),
        "opt": list(shape.optimum),
        "max": list(shape.maximum),
        "run": list(shape.run),
    }


@dataclass(frozen=True)
class _PlanRun:
    """What a plan's Job builds and runs, derived once from the ONNX build's configuration: the configuration,
    the shape ranges trtexec gets, and the inputs of its one run (the batch of the run shape, in config order)."""

    config: ModelConfig
    shapes: tuple[TensorShape, ...]
    inputs: dict[str, np.ndarray]

    @property
    def output_datatypes(self) -> dict[str, str]:
        """Output name -> Triton datatype ("FP32"), as the ONNX configuration declares them."""
        return {tensor.name: datatype_name(tensor.data_type) for tensor in self.config.output}


def _plan_run(plan: TensorRTPlan) -> _PlanRun:
    config = _onnx_config(plan.build)
    shapes = plan_shapes(config)
    rows = shapes[0].run[0] if shapes and config.max_batch_size > 0 else 1
    return _PlanRun(config=config, shapes=shapes, inputs=make_sample_inputs(config, rows=rows))


def _input_key(plan_id: int, index: int) -> str:
    return f"{_work(plan_id)}/inputs/{index}.bin"


def _stored_inputs(plan: TensorRTPlan, run: _PlanRun) -> dict[str, np.ndarray]:
    """The inputs the Job ran, read back from the store (each as the raw bytes `_start_job` wrote), in the
    datatypes and shapes of `run`. Raises NotFound when one is gone, InvalidInput when one has another size."""
    store = get_object_store()
    inputs = {}
    for index, (name, expected) in enumerate(run.inputs.items()):
        raw = store.read_bytes(_input_key(plan.pk, index))
        if len(raw) != expected.nbytes:
            raise InvalidInput(
                f"the stored input {name!r} holds {len(raw)} bytes, not the {expected.nbytes} of its run; ask for the "
                "plan again",
                field="inputs",
            )
        inputs[name] = np.frombuffer(raw, dtype=expected.dtype).reshape(expected.shape)
    return inputs


def _start_job(plan: TensorRTPlan, now: datetime) -> None:
    store = get_object_store()
    run = _plan_run(plan)
    config, shapes = run.config, run.shapes
    model, number = plan.model_version.model.name, plan.model_version.number
    source = f"{plan.build.repository_prefix}/{model}/{number}/"
    files = sorted(key[len(source) :] for key in store.list_keys(source))
    main = config.default_model_filename or "model.onnx"
    if main not in files:
        raise InvalidInput(
            f"The build's repository holds no {main} any more (the version was rebuilt or deleted); ask again.",
            field="model_version",
        )
    files.remove(main)
    expires = int(settings.CONCH_PLAN_JOB_DEADLINE_SECONDS) + int(settings.CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS)
    expires += _URL_MARGIN_S
    endpoint = plan.cluster.s3_endpoint

    def url(key: str, method: str) -> str:
        signed = store.presign_object(key, method=method, expires_in_s=expires, endpoint_url=endpoint)
        if signed is None:
            raise InvalidInput(
                "TensorRT plans are built by a Job that reads and writes the object store itself: Conch needs its "
                "model store on S3-compatible storage (CONCH_STORAGE_URL=s3://...).",
                field="cluster",
            )
        return signed

    input_urls = []
    for index, (name, array) in enumerate(run.inputs.items()):
        key = _input_key(plan.pk, index)
        store.put_bytes(key, np.ascontiguousarray(array).tobytes())
        input_urls.append((name, url(key, "GET")))
    spec = _spec(plan, shapes)
    request = plan_request(
        spec,
        model_files=[(path, url(source + path, "GET")) for path in [main, *files]],
        inputs=input_urls,
        plan_url=url(f"{_repository(plan.pk)}/{model}/{number}/model.plan", "PUT"),
        outputs_url=url(f"{_work(plan.pk)}/outputs.json", "PUT"),
        report_url=url(f"{_work(plan.pk)}/report.json", "PUT"),
    )
    api = _api(plan)
    job = api.apply(plan_job_manifest(spec))
    api.apply(plan_request_secret_manifest(spec, request, owner_uid=job["metadata"]["uid"]))
    TensorRTPlan.objects.filter(pk=plan.pk, status=PlanStatus.PENDING).update(
        status=PlanStatus.BUILDING,
        job_name=job_name(plan.pk, KubernetesRuntime.installation()),
        started_at=now,
        message=f"waiting for a free {plan.gpu_product} GPU on {plan.cluster.name}",
    )
    log.info("plan.job_created", extra={"plan_id": plan.pk})


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next(
        (
            c
            for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("type") == kind and c.get("status") == "True"
        ),
        None,
    )


def _follow_job(plan: TensorRTPlan, now: datetime) -> None:
    api = _api(plan)
    job = api.get("Job", plan.job_name)
    if job is None:
        _fail(plan, f"Its Job {plan.job_name} was deleted before it finished; ask for the plan again.", clean=False)
        return
    pods = api.list("Pod", selector=f"conch.io/plan={plan.pk},{INSTALLATION_LABEL}={KubernetesRuntime.installation()}")
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)
    if _condition(job, "Complete") is not None:
        _finish(plan)
        return
    failed = _condition(job, "Failed")
    if failed is not None:
        _fail(plan, _job_failure(plan, failed, pod))
        return
    if pod is None:
        _say(plan, "waiting for the Job's pod")
        return
    waited = (now - plan.started_at).total_seconds() if plan.started_at else 0.0
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in _IMAGE_FAILURES:
            _fail(
                plan,
                f"Node {pod['spec'].get('nodeName', '?')} cannot pull {plan.image} ({reason}: "
                f"{waiting.get('message', '')}). Let the cluster's nodes pull NVIDIA's images from nvcr.io (an image "
                "pull secret: register the cluster with --image-pull-secret), or mirror the image under that name.",
            )
            return
        if reason == "CreateContainerConfigError" and waited > _CONFIG_ERROR_GRACE_S:
            _fail(plan, f"The Job's pod cannot start: {waiting.get('message', reason)}. Ask for the plan again.")
            return
    scheduled = next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    if scheduled is not None and scheduled.get("status") == "False":
        why = scheduled.get("message") or scheduled.get("reason") or "not scheduled"
        timeout = int(settings.CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS)
        if waited > timeout:
            _fail(
                plan,
                f"No {plan.gpu_product} node of {plan.cluster.name} had a free GPU within {timeout // 60} minutes "
                f"({why}). Free a GPU on a {plan.gpu_product} node (stop a deployment that holds one) and ask again.",
            )
            return
        _say(plan, f"waiting for a free {plan.gpu_product} GPU: {why}")
        return
    node = pod["spec"].get("nodeName", "")
    _say(plan, f"building the plan with trtexec on node {node}" if node else "waiting for the Job's pod")


def _job_failure(plan: TensorRTPlan, failed: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str:
    if failed.get("reason") == "DeadlineExceeded":
        return (
            f"Its Job ran past its deadline ({int(settings.CONCH_PLAN_JOB_DEADLINE_SECONDS)} s) and was stopped. "
            "A bigger model needs more time: raise CONCH_PLAN_JOB_DEADLINE_SECONDS and ask again."
        )
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated:
            message = str(terminated.get("message") or "").strip()
            return (
                f"trtexec could not make the plan (exit status {terminated.get('exitCode')}): "
                f"{message or 'no message'}. TensorRT does not take every ONNX operator; serve the ONNX model, "
                "or export the model without the operator it names."
            )
    return f"Its Job failed ({failed.get('reason', '')}: {failed.get('message', '')})."


def _finish(plan: TensorRTPlan) -> None:
    store = get_object_store()
    model, number = plan.model_version.model.name, plan.model_version.number
    plan_key = f"{_repository(plan.pk)}/{model}/{number}/model.plan"
    try:
        outputs_text = store.read_bytes(f"{_work(plan.pk)}/outputs.json").decode("utf-8", errors="replace")
        report_text = store.read_bytes(f"{_work(plan.pk)}/report.json").decode("utf-8", errors="replace")
        plan_bytes = store.size(plan_key)
    except NotFound:
        _fail(plan, "Its Job completed without storing the plan and its outputs; ask for the plan again.")
        return
    run = _plan_run(plan)
    config, datatypes = run.config, run.output_datatypes
    try:
        served = read_trtexec_outputs(outputs_text, datatypes)
        reference = _onnx_outputs(plan, config, _stored_inputs(plan, run))
    except NotFound:
        _fail(plan, "The inputs its Job ran are gone from the store; ask for the plan again.")
        return
    except ConchError as error:
        _fail(plan, f"Its outputs could not be compared: {error.detail}")
        return
    except SandboxError as error:
        _fail(plan, f"The ONNX model could not be run to compare the plan with: {error}")
        return
    accepted = DEFAULT_TOLERANCES["FP16"].atol if plan.fp16 else None
    comparisons = compare_outputs(
        reference, {name: served[name] for name in served if name in datatypes}, datatypes, accepted=accepted
    )
    missing = sorted(set(datatypes) - set(served))
    try:
        job_report = json.loads(report_text)
    except ValueError:
        job_report = {}
    found = _TENSORRT_LINE.search(str(job_report.get("tensorrt", "")))
    report = {
        **plan.report,
        "build_seconds": job_report.get("build_seconds"),
        "run_seconds": job_report.get("run_seconds"),
        "tensorrt": found.group(1) if found else "",
        "tolerance": "FP16 (atol 0.01, rtol 0.01)" if plan.fp16 else "by each output's datatype",
        "comparison": [comparison.to_dict() for comparison in comparisons],
    }
    problems = [comparison.describe() for comparison in comparisons if comparison.problem]
    if missing:
        problems.append(f"trtexec gave no output {', '.join(missing)}")
    if problems:
        TensorRTPlan.objects.filter(pk=plan.pk).update(report=report)
        _fail(plan, "The plan's outputs differ from the ONNX model's: " + "; ".join(problems) + ".")
        return
    config_text = config_to_pbtxt(plan_config(config))
    store.put_bytes(f"{_repository(plan.pk)}/{model}/config.pbtxt", config_text.encode())
    with transaction.atomic():
        updated = TensorRTPlan.objects.filter(pk=plan.pk, status=PlanStatus.BUILDING).update(
            status=PlanStatus.SUCCEEDED,
            repository_prefix=_repository(plan.pk),
            config_pbtxt=config_text,
            plan_bytes=plan_bytes + len(config_text.encode()),
            tensorrt_version=report["tensorrt"] or plan.tensorrt_version,
            report=report,
            finished_at=timezone.now(),
            message="built, run once and within tolerance of the ONNX model: "
            + "; ".join(comparison.describe() for comparison in comparisons),
        )
        if updated:
            record_audit(
                action=AuditAction.PLAN_SUCCEEDED, team=plan.team, target=plan, after={"plan_bytes": plan_bytes}
            )
    _clean_up_job(plan)
    store.delete_prefix(_work(plan.pk) + "/")
    log.info("plan.succeeded", extra={"plan_id": plan.pk})


def _onnx_outputs(plan: TensorRTPlan, config: ModelConfig, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ONNX model's outputs for `inputs`, run by onnxruntime in the build sandbox on the build's files
    (`config`: the build's configuration, which names the model file)."""
    store = get_object_store()
    model, number = plan.model_version.model.name, plan.model_version.number
    source = f"{plan.build.repository_prefix}/{model}/{number}/"
    with tempfile.TemporaryDirectory(prefix="conch-plan-") as work:
        folder = Path(work)
        for key in store.list_keys(source):
            target = folder / key[len(source) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            store.download_to(key, target)
        return run_source_in_sandbox(
            format_by_key("onnx"), folder / (config.default_model_filename or "model.onnx"), inputs
        )


def _say(plan: TensorRTPlan, message: str) -> None:
    if plan.message != message:
        TensorRTPlan.objects.filter(pk=plan.pk).update(message=message)


def _fail(plan: TensorRTPlan, message: str, *, clean: bool = True) -> None:
    """End the plan `failed` with `message`, deleting its Job, its Secret and everything it stored."""
    with transaction.atomic():
        updated = (
            TensorRTPlan.objects.filter(pk=plan.pk)
            .exclude(status__in=FINAL_PLAN_STATUSES)
            .update(status=PlanStatus.FAILED, message=message, plan_bytes=0, finished_at=timezone.now())
        )
        if updated:
            record_audit(action=AuditAction.PLAN_FAILED, team=plan.team, target=plan, after={"message": message})
    if clean:
        _clean_up_job(plan)
    get_object_store().delete_prefix(_prefix(plan.pk) + "/")
    log.info("plan.failed", extra={"plan_id": plan.pk, "error": message})


def _clean_up_job(plan: TensorRTPlan) -> None:
    """Delete the plan's Job (its pod goes with it) and its Secret; ones already gone are not an error."""
    _delete_job(_api(plan), job_name(plan.pk, KubernetesRuntime.installation()))


def _delete_job(api: ClusterApi, name: str) -> None:
    api.delete("Job", name, propagation="Background")
    api.delete("Secret", name)


def collect_plan_garbage() -> int:
    """Delete what plans that are gone or over left behind: the store folders of deleted or failed plans, and on
    every registered cluster this installation's plan Jobs (with their Secrets) of plans that are not building (a
    version deleted while its plan was building). Returns how many folders and Jobs went; a cluster that does not
    answer is left for the next run."""
    store = get_object_store()
    found = {int(match.group(1)) for key in store.list_keys(PLANS_ROOT + "/") if (match := _FOLDER.match(key))}
    live = set(TensorRTPlan.objects.filter(pk__in=found).exclude(status=PlanStatus.FAILED).values_list("pk", flat=True))
    for plan_id in sorted(found - live):
        store.delete_prefix(_prefix(plan_id) + "/")
    removed = len(found - live)
    building = set(TensorRTPlan.objects.filter(status=PlanStatus.BUILDING).values_list("pk", flat=True))
    installation = KubernetesRuntime.installation()
    selector = (
        f"app.kubernetes.io/name=tensorrt-plan,app.kubernetes.io/managed-by=conch,{INSTALLATION_LABEL}={installation}"
    )
    for cluster in Cluster.objects.all():
        try:
            api = cluster_api(access_of(cluster))
            for job in api.list("Job", selector=selector):
                plan_label = job["metadata"].get("labels", {}).get("conch.io/plan", "")
                if not plan_label.isdigit() or int(plan_label) not in building:
                    _delete_job(api, job["metadata"]["name"])
                    removed += 1
        except ConchError as error:
            log.warning("plan.garbage_unavailable", extra={"cluster": cluster.name, "error": error.detail})
    return removed


def building_prefixes() -> set[str]:
    """Build repositories plans that are not over still read (kept by the repository garbage collection)."""
    return set(
        TensorRTPlan.objects.exclude(status__in=FINAL_PLAN_STATUSES).values_list("build__repository_prefix", flat=True)
    )

"""The upload-and-deploy wizard: choose or create a model, upload (resumable, in the browser), watch the build,
deploy, watch it come up, send a test inference.

Each page reads through the apps' services and each write calls one service, which checks the caller's role
itself. The rules live in those services: option checks (`builds.services.review.check_build_options`), the
"would it fit" check (`deployments.services.check_deployment_fits`, the create's own checks), image preprocessing
(`deployments.services.trial`). The small htmx partials (`…/status`, `…/check`) answer 200 with the error in
the page, so htmx swaps them in.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from builds import services as builds
from builds.formats import HEAD_BYTES, formats_allowed
from builds.model_config import GRAPH_INPUTS_FIELD, GRAPH_OUTPUTS_FIELD, OUTPUT_DIMS_FIELD, TOLERANCE_FIELD
from builds.services.review import (
    DYNAMIC_BATCHING_FIELD,
    OPTION_NAMES,
    batching_reason,
    built_option_values,
    check_build_options,
    config_diff,
    current_option_values,
    diff_configs,
    signature_rows,
)
from conch.errors import ConchError, InvalidInput, NotFound, Unavailable
from conch.limits import INFERENCE_BODY, accepts_body, describe_bytes
from console.context import role_can_write, team_context
from console.views import _deployment_of
from deployments import services as deployments
from deployments.services.trial import IMAGE_FIELD, MAX_IMAGE_BYTES, inference_form, run_trial_inference
from models_registry import services as registry
from tenancy import services as tenancy
from tenancy.choices import Role
from uploads import services as uploads
from uploads.choices import UploadStatus

#: Open uploads the upload page lists (a model rarely has more than one: the same file resumes the same upload).
OPEN_UPLOADS_SHOWN = 5
#: Deployment statuses the status page stops polling at.
SETTLED = ("ready", "failed", "stopped", "degraded")
#: Version statuses the build page stops polling at.
BUILD_SETTLED = ("built", "failed")
#: Fields of the deploy form (the create_deployment arguments the wizard offers).
DEPLOY_FIELDS = (
    "name",
    "runtime",
    "instance_count",
    "instance_kind",
    "cluster",
    "scaling",
    "replicas",
    "min_replicas",
    "max_replicas",
    "target_queue_time_us",
    "gpu_kind",
    "gpu_product",
    "gpu_count",
    "mig_profile",
)
#: Where the deploy form shows a refusal of each request field (`check_deployment_fits` names them): the slot
#: next to the form control. Refusals of a field the form has no control for (the deployments quota, the version)
#: show in the list above the Deploy button only.
DEPLOY_ERROR_SLOTS = {
    "name": "name",
    "runtime": "runtime",
    "instance_count": "instance_count",
    "instances": "instance_count",
    "cluster": "cluster",
    "replicas": "replicas",
    "autoscaling": "min_replicas",
    "autoscaling.min_replicas": "min_replicas",
    "autoscaling.max_replicas": "max_replicas",
    "autoscaling.target_queue_time_us": "target_queue_time_us",
    "gpu": "gpu_kind",
    "gpu.count": "gpu_count",
    "gpu.product": "gpu_product",
    "gpu.mig_profile": "mig_profile",
}
#: Every slot of the deploy form (each runtime's fieldset has its own instance kind control).
DEPLOY_SLOTS = (*dict.fromkeys(DEPLOY_ERROR_SLOTS.values()), "instance_kind", "kubernetes_instance_kind")
PREPROCESSING_FIELDS = ("layout", "height", "width", "scale", "mean", "std")
#: The steps, as the wizard's step list names them.
WIZARD_STEPS = [(1, "Model"), (2, "Upload"), (3, "Build"), (4, "Deploy"), (5, "Status"), (6, "Test")]


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    """Render a wizard page (with the step list)."""
    return render(request, template, {"wizard_steps": WIZARD_STEPS, **context}, status=status)


def _version(request: HttpRequest, version_id: int):
    try:
        return registry.get_version(user=request.user, version_id=version_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc


def _refuse_method(request: HttpRequest, allowed: tuple[str, ...]) -> HttpResponse | None:
    """405 for a method `allowed` does not list; called after the object is found, so a caller outside its team
    gets 404 whatever the method (nothing tells them the object exists)."""
    if request.method in allowed or (request.method == "HEAD" and "GET" in allowed):
        return None
    return HttpResponseNotAllowed(list(allowed))


GET = ("GET",)
POST = ("POST",)
GET_POST = ("GET", "POST")


def _refuse_viewer(request: HttpRequest, team) -> HttpResponse | None:
    """The 403 page for a member below the developer role (a viewer): the wizard's every step writes (a model,
    a version, a build, a deployment), so a viewer is told at once, naming the role, not on submit."""
    try:
        tenancy.require_role(
            user=request.user, team=team, role=Role.DEVELOPER, action="Uploading and deploying a model"
        )
    except ConchError as exc:
        return _page(
            request,
            "console/wizard/forbidden.html",
            {"error": exc.detail, "error_status": "403 Forbidden", "team": team},
            status=exc.status_code,
        )
    return None


def _error(exc: ConchError) -> dict[str, Any]:
    return {"detail": exc.detail, "field": exc.field or "", "quota": getattr(exc, "quota", None)}


# --- 1. choose or create a model -------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def start(request: HttpRequest) -> HttpResponse:
    """Step 1: the current team's models to choose from, and a form registering a new one."""
    console = team_context(request)
    if console.team is not None and (refused := _refuse_viewer(request, console.team)):
        return refused
    error = None
    name = ""
    if request.method == "POST" and console.team is not None:
        name = request.POST.get("name", "").strip()
        try:
            model = registry.create_model(user=request.user, team_slug=console.team.slug, name=name)
        except ConchError as exc:
            error = _error(exc)
        else:
            return redirect("console:wizard:upload", model_id=model.pk)
    models = registry.visible_models(user=request.user).filter(team=console.team).order_by("name")
    return _page(
        request,
        "console/wizard/start.html",
        {"models": models, "error": error, "name": name, "step": 1},
        status=400 if error else 200,
    )


# --- 2. upload ---------------------------------------------------------------------------------------------------


@login_required
def upload(request: HttpRequest, model_id: int) -> HttpResponse:
    """Step 2: the resumable upload page (the browser talks to the uploads API itself)."""
    try:
        model = registry.get_model(user=request.user, model_id=model_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    if refused := _refuse_method(request, GET) or _refuse_viewer(request, model.team):
        return refused
    versions = registry.visible_versions(user=request.user).filter(model=model).order_by("-number")[:5]
    team_formats = formats_allowed(model.team)
    return _page(
        request,
        "console/wizard/upload.html",
        {
            "model": model,
            "versions": versions,
            "step": 2,
            "uploads_url": f"/api/v1/models/{model.pk}/uploads/",
            "check_url": "/api/v1/uploads/check/",
            # what the file chooser offers and the drop zone names: every format Conch builds for this team (a
            # pickle only where a platform admin allowed pickles for it)
            "format_suffixes": ",".join(suffix for entry in team_formats for suffix in entry.suffixes),
            "format_titles": ", ".join(entry.title for entry in team_formats),
            # the server's limit, so the page can refuse a file that is too big before hashing it
            "max_upload_bytes": settings.CONCH_MAX_UPLOAD_BYTES,
            "max_upload_text": describe_bytes(settings.CONCH_MAX_UPLOAD_BYTES),
            # how many first bytes the start of an upload carries for the server's format check
            "head_bytes": HEAD_BYTES,
            # seconds a part may stand still (no bytes moving) before the page aborts it and sends it again
            "stall_seconds": settings.CONCH_UPLOAD_STALL_SECONDS,
            "build_url_template": reverse("console:wizard:build", kwargs={"version_id": 0}).replace("/0/", "/{id}/"),
            "deploy_url_template": reverse("console:wizard:deploy", kwargs={"version_id": 0}).replace("/0/", "/{id}/"),
            "open_uploads": _open_uploads(model),
        },
    )


def _open_uploads(model) -> list[dict[str, Any]]:
    """The model's open resumable uploads for the upload page (at most OPEN_UPLOADS_SHOWN, oldest first): each
    with its filename, size, the bytes and parts the store holds now (None when the store cannot be reached),
    its expiry, and whether it is already being checked (`completing`)."""
    rows = []
    for upload in uploads.open_uploads(model=model).select_related("created_by")[:OPEN_UPLOADS_SHOWN]:
        try:
            parts = uploads.stored_parts(upload=upload)
        except Unavailable:
            parts = None
        rows.append(
            {
                "id": upload.pk,
                "filename": upload.filename,
                "size": describe_bytes(upload.size_bytes),
                "size_bytes": upload.size_bytes,
                "done": None if parts is None else describe_bytes(sum(part.size_bytes for part in parts)),
                "done_bytes": None if parts is None else sum(part.size_bytes for part in parts),
                "parts_done": None if parts is None else len(parts),
                "part_count": upload.part_count,
                "expires_at": upload.expires_at,
                "completing": upload.status == UploadStatus.COMPLETING,
                "started_by": upload.created_by.get_username() if upload.created_by else "",
            }
        )
    return rows


# --- 3. build ------------------------------------------------------------------------------------------------


def _build_context(request: HttpRequest, version) -> dict[str, Any]:
    current = builds.current_build(version)
    steps = sorted(current.steps.all(), key=lambda step: step.position) if current is not None else []
    return {
        "version": version,
        "build": current,
        "config_pbtxt": builds.latest_config_pbtxt(version),
        "steps": steps,
        "settled": version.status in BUILD_SETTLED,
        "rows": signature_rows(version),
        "batching_reason": batching_reason(version),
        "diff": config_diff(version, registry.visible_versions(user=request.user)),
    }


@login_required
def build(request: HttpRequest, version_id: int) -> HttpResponse:
    """Step 3: the build live (steps and log lines), then the signature, config.pbtxt with its diff, and the options
    form (checked inline by the build's rules); POST rebuilds with the options."""
    version = _version(request, version_id)
    if refused := _refuse_method(request, GET_POST):
        return refused
    error = check = None
    values = current_option_values(version)
    if request.method == "POST":
        fields = {key: request.POST.get(key) for key in (*values, DYNAMIC_BATCHING_FIELD)}
        if DYNAMIC_BATCHING_FIELD not in request.POST:
            fields[DYNAMIC_BATCHING_FIELD] = "off"  # an unticked checkbox is not sent
        try:
            builds.request_rebuild(user=request.user, version=version, options=fields)
        except ConchError as exc:
            error = _error(exc)
            values = {key: request.POST.get(key, "") for key in values}
            # the service stops at the first bad option; the form lists every one, as the live check does
            options_check = check_build_options(version=version, fields=fields)
            check = options_check if not options_check.ok else None
        else:
            return redirect("console:wizard:build", version_id=version.pk)
    context = _build_context(request, version)
    batching_on = not context["config_pbtxt"] or any(row.batch_axis for row in context["rows"])
    context.update(
        {
            "step": 3,
            "error": error,
            "check": check,
            "values": values,
            # what the built configuration has, shown beside each option left empty (the model's default)
            "built": built_option_values(version),
            "batching_on": batching_on,
        }
    )
    return _page(request, "console/wizard/build.html", context, status=400 if error else 200)


@login_required
def build_status(request: HttpRequest, version_id: int) -> HttpResponse:
    """Partial: the build's steps and log lines (polled while it runs); once settled, the whole page reloads."""
    version = _version(request, version_id)
    if refused := _refuse_method(request, GET):
        return refused
    response = render(request, "console/wizard/_build_status.html", _build_context(request, version))
    if version.status in BUILD_SETTLED and request.GET.get("was") not in BUILD_SETTLED:
        response["HX-Refresh"] = "true"  # show the signature, config and options now that they exist
    return response


@login_required
def check_options(request: HttpRequest, version_id: int) -> HttpResponse:
    """Partial: the options form's errors by field and the configuration the options would give."""
    version = _version(request, version_id)
    if refused := _refuse_method(request, POST):
        return refused
    fields = {
        key: request.POST.get(key)
        for key in (*OPTION_NAMES, OUTPUT_DIMS_FIELD, TOLERANCE_FIELD, GRAPH_INPUTS_FIELD, GRAPH_OUTPUTS_FIELD)
    }
    fields[DYNAMIC_BATCHING_FIELD] = request.POST.get(DYNAMIC_BATCHING_FIELD, "off")
    check = check_build_options(version=version, fields=fields)
    change = ""
    built = builds.latest_config_pbtxt(version)
    if check.ok and check.config_pbtxt and built:
        change = diff_configs(built, check.config_pbtxt, before_label="as built", after_label="with these options")
    context = {"check": check, "version": version, "change": change, "config_pbtxt": built}
    return render(request, "console/wizard/_options_check.html", context)


# --- 4. deploy -----------------------------------------------------------------------------------------------


def _deploy_request(version, team_slug: str, data) -> deployments.DeploymentRequest:
    """The `DeploymentRequest` of the deploy form (text fields; empty means the default)."""

    def text(key: str) -> str:
        return (data.get(key) or "").strip()

    runtime = text("runtime") or "local"
    arguments: dict[str, Any] = {
        "team_slug": team_slug,
        "name": text("name"),
        "model_version_id": version.pk,
        "runtime": runtime,
    }
    arguments["instance_kind"] = text("instance_kind") or None
    if runtime == "local":
        arguments["instance_count"] = text("instance_count") or None
        return deployments.DeploymentRequest.from_fields(arguments)
    arguments["cluster"] = text("cluster") or None
    if text("scaling") == "autoscaling":
        scaling: dict[str, Any] = {"min_replicas": text("min_replicas"), "max_replicas": text("max_replicas")}
        scaling["target_queue_time_us"] = text("target_queue_time_us") or "2000"
        arguments["autoscaling"] = scaling
    else:
        arguments["replicas"] = text("replicas") or None
    kind = text("gpu_kind")
    if kind == "gpu":
        arguments["gpu"] = {
            "count": text("gpu_count") or "1",
            **({"product": text("gpu_product")} if text("gpu_product") else {}),
        }
    elif kind == "mig":
        arguments["gpu"] = {"mig_profile": text("mig_profile")}
    return deployments.DeploymentRequest.from_fields(arguments)


@login_required
def deploy(request: HttpRequest, version_id: int) -> HttpResponse:
    """Step 4: where and how many (runtime, cluster and GPUs, replicas or autoscaling), the team's quota, a check
    before submit; POST creates the deployment."""
    version = _version(request, version_id)
    if refused := _refuse_method(request, GET_POST):
        return refused
    team_slug = version.model.team.slug
    error = None
    values = {key: request.POST.get(key, "") for key in DEPLOY_FIELDS} if request.method == "POST" else {}
    if request.method == "POST":
        try:
            deployment = deployments.create_deployment(
                user=request.user, request=_deploy_request(version, team_slug, request.POST)
            )
        except ConchError as exc:
            error = _error(exc)
        else:
            return redirect("console:wizard:status", deployment_id=deployment.pk)
    else:
        values = {"name": version.model.name, "runtime": "local", "instance_count": "", "scaling": "replicas"}
    offers = deployments.deployment_offers(user=request.user, team_slug=team_slug)
    fit = None
    if version.status == "built":
        # after a refused create too: the create stops at its first refusal, the form shows every one by its field
        fit = _fit(request, version, team_slug, values)
    context = {
        "step": 4,
        "version": version,
        "offers": offers,
        "values": values,
        "error": error,
        "fit": fit,
    }
    return _page(request, "console/wizard/deploy.html", context, status=400 if error else 200)


def _fit(request: HttpRequest, version, team_slug: str, data) -> dict[str, Any]:
    """The deploy check's verdict for the form: {"fits", "requested"} or {"fits": False, "error" (the first
    refusal), "errors" (every one)}, and "slots": [(slot, [sentences])] for every slot of the form, each refusal
    in the slot of its field (`DEPLOY_ERROR_SLOTS`; the instance kind in the chosen runtime's)."""
    slots: dict[str, list[str]] = {slot: [] for slot in DEPLOY_SLOTS}
    try:
        fit = deployments.check_deployment_fits(user=request.user, request=_deploy_request(version, team_slug, data))
    except ConchError as exc:
        errors = [_error(refusal) for refusal in exc.refusals or (exc,)]
        kubernetes = (data.get("runtime") or "").strip() == "kubernetes"
        for error in errors:
            slot = DEPLOY_ERROR_SLOTS.get(error["field"])
            if error["field"] == "instance_kind":
                slot = "kubernetes_instance_kind" if kubernetes else "instance_kind"
            if slot is not None:
                slots[slot].append(error["detail"])
        return {"fits": False, "error": errors[0], "errors": errors, "slots": list(slots.items())}
    return {"fits": True, "requested": fit["requested"], "slots": list(slots.items())}


@login_required
def deploy_check(request: HttpRequest, version_id: int) -> HttpResponse:
    """Partial: would the deploy form's deployment be accepted now (the create's own checks), and if not, why."""
    version = _version(request, version_id)
    if refused := _refuse_method(request, POST):
        return refused
    fit = _fit(request, version, version.model.team.slug, request.POST)
    # out of band: each refusal also goes next to its field (htmx swaps the slots by id), emptied ones included
    return render(request, "console/wizard/_deploy_check.html", {"fit": fit, "out_of_band": True})


# --- 5. live status --------------------------------------------------------------------------------------------


@login_required
def status(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Step 5: the deployment's status until it is ready (pods and their messages on Kubernetes)."""
    deployment = _deployment_of(request, deployment_id)
    if refused := _refuse_method(request, GET):
        return refused
    return _page(request, "console/wizard/status.html", {"step": 5, **_status_context(deployment)})


def _status_context(deployment) -> dict[str, Any]:
    observed = deployment.observed or {}
    replicas = observed.get("replicas") or {}
    # A Kubernetes deployment is `ready` once one pod serves while the others still start: the page goes on
    # following it until every pod it asked for is ready, or the user would be left looking at "1 of 2".
    coming_up = deployment.status == "ready" and (replicas.get("ready") or 0) < (replicas.get("desired") or 0)
    return {
        "deployment": deployment,
        "settled": deployment.status in SETTLED and not coming_up,
        "pods": observed.get("pods") or [],
        "replicas": replicas,
        "log_tail": deployments.log_tail(deployment) if deployment.status in ("failed", "starting") else [],
    }


@login_required
def status_partial(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Partial: the status block, polled every second until the deployment settles."""
    deployment = _deployment_of(request, deployment_id)
    if refused := _refuse_method(request, GET):
        return refused
    return render(request, "console/wizard/_status.html", _status_context(deployment))


# --- 6. test inference -------------------------------------------------------------------------------------------


@accepts_body(INFERENCE_BODY)  # a JSON request for an image model is megabytes of numbers
@login_required
def test_inference(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Step 6: a form made from the signature (JSON editor; an image for an image model); POST (htmx) answers the
    output partial."""
    deployment = _deployment_of(request, deployment_id)
    if refused := _refuse_method(request, GET_POST):
        return refused
    form = inference_form(deployment)
    if request.method == "POST":
        result = error = None
        image = request.FILES.get(IMAGE_FIELD)
        try:
            if request.POST.get("mode") == "image":
                if image is not None and image.size > MAX_IMAGE_BYTES:
                    raise InvalidInput(
                        f"The image is {image.size} bytes; send one of at most {MAX_IMAGE_BYTES // 2**20} MiB.",
                        field=IMAGE_FIELD,
                    )
                result = run_trial_inference(
                    user=request.user,
                    deployment=deployment,
                    image=image.read() if image is not None else b"",  # none chosen: the service names the input
                    preprocessing_fields={key: request.POST.get(key) for key in PREPROCESSING_FIELDS},
                )
            else:
                result = run_trial_inference(
                    user=request.user, deployment=deployment, request_json=request.POST.get("request", "")
                )
        except ConchError as exc:
            error = _error(exc)
        return render(request, "console/wizard/_infer_output.html", {"result": result, "error": error})
    image_field = form["inputs"][0] if form["image_input"] else None
    role = tenancy.role_in_team(user=request.user, team=deployment.team)
    return _page(
        request,
        "console/wizard/test.html",
        {
            "step": 6,
            "deployment": deployment,
            # a viewer sees the form and its shapes but no Send: sending an inference needs the developer role
            "role": role,
            "can_infer": role_can_write(role),
            "form": form,
            "image_field": image_field,
            "example_json": form["example_json"],
            "outputs_json": json.dumps(form["outputs"]),
        },
    )

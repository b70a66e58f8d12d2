"""Console pages (login required): each view reads through the apps' services, scoped to the user's teams, and
renders a template; a write (a POST form with Django's CSRF token) calls one service, which checks the caller's
role itself. A refused or invalid write renders the page again with the service's sentence and its status
(400, 403, 409); a done one redirects back with a message.

Pages that name an object look it up before anything else, so a caller outside its team gets 404 whatever the
method; then a wrong method gets 405.
"""

from __future__ import annotations

import tempfile
from http import HTTPStatus
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Case, When
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from builds import services as builds
from builds.services import backends as backend_services
from builds.services import pipelines as pipeline_services
from conch.errors import ConchError, Conflict, InUse, InvalidInput, NotFound
from conch.limits import accepts_body
from console import presenters
from console.context import SESSION_TEAM, role_can_write, team_context
from deployments import services as deployments
from deployments.choices import DeploymentStatus
from models_registry import deletion
from models_registry import services as registry
from tenancy import members as team_members
from tenancy import services as tenancy
from tenancy.choices import Role, Scope
from tenancy.quotas import team_usage

#: Session key of a token secret just created, shown once on the team page and then dropped.
SESSION_NEW_TOKEN = "console_new_token"
#: Versions shown under "recent builds" on the overview.
RECENT_BUILDS = 8
#: Rows of gateway usage (per day, token and deployment) on the team page.
GATEWAY_USAGE_ROWS = 30
#: The field a destructive action's confirmation form sends; a POST without it shows the confirmation page.
CONFIRM_FIELD = "confirm"
CONFIRM_VALUE = "yes"


def _read_only(request: HttpRequest) -> HttpResponse | None:
    """405 for a method other than GET/HEAD, after the page's object was found."""
    if request.method in ("GET", "HEAD"):
        return None
    return HttpResponseNotAllowed(["GET", "HEAD"])


def _post_only(request: HttpRequest) -> HttpResponse | None:
    """405 for a method other than POST, after the action's object was found."""
    if request.method == "POST":
        return None
    return HttpResponseNotAllowed(["POST"])


def _confirmed(request: HttpRequest) -> bool:
    """Whether a destructive action's POST came from its confirmation page (which names what goes)."""
    return request.POST.get(CONFIRM_FIELD) == CONFIRM_VALUE


def _confirm_page(
    request: HttpRequest, *, title: str, question: str, consequence: str, button: str, cancel_url: str
) -> HttpResponse:
    """The confirmation step of a destructive action: a plain form that POSTs the same URL again with the
    confirmation field (no script, so it works wherever the page's own buttons do); Cancel goes back."""
    return render(
        request,
        "console/confirm.html",
        {
            "title": title,
            "question": question,
            "consequence": consequence,
            "button": button,
            "action": request.path,
            "cancel_url": cancel_url,
            "confirm_field": CONFIRM_FIELD,
            "confirm_value": CONFIRM_VALUE,
        },
    )


def _team_of(request: HttpRequest, slug: str):
    try:
        return tenancy.get_team_for_user(user=request.user, slug=slug)
    except (InvalidInput, NotFound) as exc:
        raise Http404(exc.detail) from exc


def _deployment_of(request: HttpRequest, deployment_id: int):
    try:
        return deployments.get_deployment(user=request.user, deployment_id=deployment_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc


def _model_of(request: HttpRequest, model_id: int):
    try:
        return registry.get_model(user=request.user, model_id=model_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc


def _version_of(request: HttpRequest, model, version_id: int):
    try:
        version = registry.get_version(user=request.user, version_id=version_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    if version.model_id != model.pk:
        raise Http404(f"Model {model.pk} has no version {version_id}.")
    return version


def _status_text(status: int) -> str:
    """An HTTP status as the page-error shows it: "400 Bad Request"; the bare number for an unknown code."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


# --- overview ----------------------------------------------------------------------------


@login_required
@require_safe
def overview(request: HttpRequest) -> HttpResponse:
    """The current team's deployments (status, throughput sparkline), its recent builds and its quota usage."""
    console = team_context(request)
    context: dict = {"deployments": [], "builds": [], "usage": []}
    if console.team is not None:
        # the ones that serve or are on their way first, the stopped ones after them; newest first in each
        context["deployments"] = (
            deployments.visible_deployments(user=request.user)
            .filter(team=console.team)
            .order_by(Case(When(status=DeploymentStatus.STOPPED, then=1), default=0), "-created_at")
        )
        context["builds"] = (
            registry.visible_versions(user=request.user)
            .filter(model__team=console.team)
            .order_by("-created_at")[:RECENT_BUILDS]
        )
        context["usage"] = [_usage_line(line) for line in team_usage(team=console.team)]
        role = tenancy.role_in_team(user=request.user, team=console.team)
        # the wizard is for developers; a viewer is told why there is no button instead
        context["can_upload"] = role_can_write(role)
        context["role"] = role
    return render(request, "console/overview.html", context)


#: How the quota fields read on the pages.
QUOTA_LABELS = {
    "gpu": "GPUs",
    "instances": "Model instances",
    "storage_bytes": "Storage",
    "models": "Models",
    "deployments": "Deployments",
}


def _usage_line(line) -> dict:
    """A quota line for a bar: field, its label, used and limit as text (bytes in KB/MB/GB), the raw numbers,
    and the percentage filled (0..100, capped)."""
    percent = (
        100 if line.limit == 0 and line.used else (min(100, round(100 * line.used / line.limit)) if line.limit else 0)
    )
    if "bytes" in line.field:
        used_text, limit_text, unit = filesizeformat(line.used), filesizeformat(line.limit), ""
    else:
        used_text, limit_text, unit = str(line.used), str(line.limit), line.unit
    return {
        "field": line.field,
        "label": QUOTA_LABELS.get(line.field, line.field.replace("_", " ").capitalize()),
        "unit": unit,
        "used": line.used,
        "limit": line.limit,
        "text": f"{used_text} of {limit_text} {unit}".strip(),
        "percent": percent,
    }


@login_required
@require_POST
def switch_team(request: HttpRequest) -> HttpResponse:
    """Make the posted `team` (a slug of one of the user's teams) the one the console shows; back to `next`."""
    slug = request.POST.get("team", "")
    _team_of(request, slug)
    request.session[SESSION_TEAM] = slug
    target = request.POST.get("next", "/")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "/"
    return redirect(target)


# --- models ------------------------------------------------------------------------------


@login_required
@require_safe
def model_list(request: HttpRequest) -> HttpResponse:
    """The current team's registered models."""
    console = team_context(request)
    models = registry.visible_models(user=request.user).filter(team=console.team).order_by("name")
    return render(request, "console/models.html", {"models": models})


def _model_page(request: HttpRequest, model, *, status: int = 200, error: str = "") -> HttpResponse:
    versions = []
    versions_of_model = registry.visible_versions(user=request.user).filter(model=model).order_by("-number")
    listed = builds.with_builds(versions_of_model, steps=False)  # the page shows no step logs
    for version in listed:
        config_pbtxt = builds.latest_config_pbtxt(version)
        batch = presenters.max_batch_size_of(config_pbtxt)
        current = builds.current_build(version)
        versions.append(
            {
                "row": version,
                "build": current,
                "built_at": current.finished_at if current is not None and current.status == "succeeded" else None,
                "config_pbtxt": config_pbtxt,
                "history": builds.history(version),
                "max_batch_size": batch,
                "tensors": presenters.signature_rows(version.signature, batching=batch > 0),
                "plans": list(deployments.visible_plans(user=request.user).filter(model_version=version)),
                "optimizable": presenters.served_by_onnxruntime(config_pbtxt),
                "format_title": presenters.format_title(current.source_format if current is not None else ""),
            }
        )
    role = tenancy.role_in_team(user=request.user, team=model.team)
    return render(
        request,
        "console/model.html",
        {
            "model": model,
            "versions": versions,
            "can_write": role_can_write(role),
            "clusters": [cluster.name for cluster in deployments.list_clusters()],
            "error": error,
            "error_status": _status_text(status),
        },
        status=status,
    )


@login_required
def version_optimize(request: HttpRequest, model_id: int, version_id: int) -> HttpResponse:
    """Ask for a TensorRT plan of a version for a cluster's GPU product (the model page's form; developer role)."""
    model = _model_of(request, model_id)
    version = _version_of(request, model, version_id)
    if refused := _post_only(request):
        return refused
    cluster, gpu_product = request.POST.get("cluster", "").strip(), request.POST.get("gpu_product", "").strip()
    if not cluster or not gpu_product:
        missing = "a cluster" if not cluster else "the GPU product (the nodes' nvidia.com/gpu.product label)"
        return _model_page(request, model, status=400, error=f"Choose {missing} to build the TensorRT plan for.")
    try:
        plan = deployments.request_tensorrt_plan(
            user=request.user,
            model_version_id=version.pk,
            cluster_name=cluster,
            gpu_product=gpu_product,
            fp16=request.POST.get("fp16") == "on",
        )
    except ConchError as exc:
        return _model_page(request, model, status=exc.status_code, error=exc.detail)
    messages.success(
        request,
        f"TensorRT plan {plan.pk} of version {version.number} for {plan.gpu_product} on {plan.cluster.name} asked "
        "for: a Job builds it there, then Conch compares it with the ONNX model.",
    )
    return redirect("console:model", model_id=model.pk)


@login_required
def model_detail(request: HttpRequest, model_id: int) -> HttpResponse:
    """One model: its versions with status, size, sha256, signature, config.pbtxt, download and delete."""
    model = _model_of(request, model_id)
    if refused := _read_only(request):
        return refused
    return _model_page(request, model)


@login_required
def version_download(request: HttpRequest, model_id: int, version_id: int) -> HttpResponse:
    """The version's uploaded model file, streamed from the object store as an attachment."""
    model = _model_of(request, model_id)
    version = _version_of(request, model, version_id)
    if refused := _read_only(request):
        return refused
    try:
        reader = registry.open_version_source(version=version)
    except ConchError as exc:
        return _model_page(request, model, status=exc.status_code, error=exc.detail)
    name = version.source_filename or f"{model.name}-v{version.number}.onnx"
    return FileResponse(reader, as_attachment=True, filename=name, content_type="application/octet-stream")


@login_required
def version_delete(request: HttpRequest, model_id: int, version_id: int) -> HttpResponse:
    """Delete a version (developer role); one a deployment uses is refused with the 409 naming it.

    The model page's Delete button posts without the confirmation field and gets the confirmation page naming the
    version; only its form (`confirm=yes`) deletes it. A viewer is refused (403) at the first step already.
    """
    model = _model_of(request, model_id)
    version = _version_of(request, model, version_id)
    if refused := _post_only(request):
        return refused
    if not _confirmed(request):
        try:
            tenancy.require_role(
                user=request.user, team=model.team, role=Role.DEVELOPER, action="Deleting a model version"
            )
        except ConchError as exc:
            return _model_page(request, model, status=exc.status_code, error=exc.detail)
        size = filesizeformat(version.source_size_bytes) if version.source_size_bytes else "no file"
        return _confirm_page(
            request,
            title=f"Delete version {version.number} of {model.name}?",
            question=f"Delete version {version.number} of model “{model.name}” in team {model.team.slug} (now "
            f"{version.status}, {size})?",
            consequence="Its uploaded file, sample inputs and every build of it are deleted from the object store, "
            "and the version is gone from the model page and the API. A deployment that serves it refuses this. A "
            "deleted version cannot be restored; to serve the model again, upload the file anew.",
            button=f"Delete version {version.number}",
            cancel_url=reverse("console:model", kwargs={"model_id": model.pk}),
        )
    try:
        deletion.delete_model_version(user=request.user, version=version)
    except InUse as exc:  # the API's text names API calls; the console names its own buttons
        error = presenters.in_use_message(f"Version {version.number} of {model.name}", exc.users)
        return _model_page(request, model, status=exc.status_code, error=error)
    except ConchError as exc:
        return _model_page(request, model, status=exc.status_code, error=exc.detail)
    messages.success(request, f"Version {version.number} of {model.name} deleted.")
    return redirect("console:model", model_id=model.pk)


# --- deployments -------------------------------------------------------------------------


@login_required
@require_safe
def deployment_list(request: HttpRequest) -> HttpResponse:
    """The current team's deployments (the one the header's team switcher shows)."""
    console = team_context(request)
    listed = deployments.visible_deployments(user=request.user).filter(team=console.team).order_by("-created_at")
    return render(request, "console/deployments.html", {"deployments": listed})


def _deployment_page(request: HttpRequest, deployment, *, status: int = 200, error: str = "") -> HttpResponse:
    version = deployment.model_version
    batch = presenters.max_batch_size_of(deployment.config_pbtxt or builds.served_config_pbtxt(version))
    tensors = presenters.signature_rows(version.signature, batching=batch > 0)
    address = deployments.gateway_address(team_slug=deployment.team.slug, name=deployment.name)
    gateway = address.http
    role = tenancy.role_in_team(user=request.user, team=deployment.team)
    other_versions = (
        registry.visible_versions(user=request.user)
        .filter(model=version.model, status="built")
        .exclude(pk=version.pk)
        .order_by("-number")
    )
    return render(
        request,
        "console/deployment.html",
        {
            "deployment": deployment,
            "endpoints": deployments.endpoints(deployment),
            "gateway": gateway,
            "gateway_grpc": address.grpc,
            "gateway_grpc_metadata": address.grpc_metadata,
            "curl": presenters.curl_snippet(
                gateway_url=gateway, model_name=deployment.model_name, inputs=tensors["inputs"]
            ),
            "python": presenters.tritonclient_snippet(
                gateway_url=gateway,
                model_name=deployment.model_name,
                inputs=tensors["inputs"],
                outputs=tensors["outputs"],
            ),
            "events": deployments.deployment_events(deployment),
            "pods": (deployment.observed or {}).get("pods") or [],
            "log_tail": deployments.log_tail(deployment),
            "other_versions": other_versions,
            "can_write": role_can_write(role),
            "running": deployment.desired_state == "running",
            "error": error,
            "error_status": _status_text(status),
        },
        status=status,
    )


@login_required
def deployment_detail(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Status and its timeline, pods, endpoints with client snippets, actions, live charts, config, log."""
    deployment = _deployment_of(request, deployment_id)
    if refused := _read_only(request):
        return refused
    return _deployment_page(request, deployment)


@login_required
def deployment_live(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """The deployment page's pods and status timeline as an HTML fragment (htmx polls it)."""
    deployment = _deployment_of(request, deployment_id)
    if refused := _read_only(request):
        return refused
    return render(
        request,
        "console/_deployment_live.html",
        {
            "deployment": deployment,
            "events": deployments.deployment_events(deployment),
            "pods": (deployment.observed or {}).get("pods") or [],
        },
    )


def _deployment_action(request: HttpRequest, deployment_id: int, act, done: str) -> HttpResponse:
    deployment = _deployment_of(request, deployment_id)
    if refused := _post_only(request):
        return refused
    try:
        act(deployment)
    except ConchError as exc:
        return _deployment_page(request, deployment, status=exc.status_code, error=exc.detail)
    messages.success(request, done)
    return redirect("console:deployment", deployment_id=deployment.pk)


def _whole_number(value: str, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{field}: give a whole number (got {value!r}).", field=field) from None


@login_required
def deployment_scale(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Set a Kubernetes deployment's replicas (developer role), through the same service as PATCH replicas."""

    def act(deployment) -> None:
        replicas = _whole_number(request.POST.get("replicas", ""), "replicas")
        deployments.update_deployment(user=request.user, deployment=deployment, changes={"replicas": replicas})

    return _deployment_action(request, deployment_id, act, "Scaling requested.")


@login_required
def deployment_switch_version(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Serve another built version of the model without a restart (the hot update; developer role)."""

    def act(deployment) -> None:
        chosen = _whole_number(request.POST.get("model_version", ""), "model_version")
        deployments.update_deployment(user=request.user, deployment=deployment, changes={"model_version": chosen})

    return _deployment_action(request, deployment_id, act, "Version switch queued; it shows as the update status.")


@login_required
def deployment_stop(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Stop the deployment (developer role); its Triton ends and its quota is freed.

    The page's Stop button posts without the confirmation field and gets the confirmation page naming the
    deployment; only its form (`confirm=yes`) stops it. A viewer is refused (403) at the first step already.
    """
    deployment = _deployment_of(request, deployment_id)
    if refused := _post_only(request):
        return refused
    if not _confirmed(request):
        try:
            deployments.require_deployment_access(
                user=request.user, deployment=deployment, action="Stopping a deployment"
            )
        except ConchError as exc:
            return _deployment_page(request, deployment, status=exc.status_code, error=exc.detail)
        version = deployment.model_version
        where = f"cluster {deployment.cluster.name}" if deployment.cluster_id else "this machine"
        return _confirm_page(
            request,
            title=f"Stop deployment {deployment.name}?",
            question=f"Stop deployment “{deployment.name}” of team {deployment.team.slug} (model "
            f"{version.model.name} version {version.number}, on {where}, now {deployment.status})?",
            consequence="Its Triton servers end: requests to its endpoints and through the gateway fail from then "
            "on, and what it holds of the team's quota is freed. A stopped deployment does not start again; to serve "
            "the model again, deploy the version anew.",
            button=f"Stop deployment {deployment.name}",
            cancel_url=reverse("console:deployment", kwargs={"deployment_id": deployment.pk}),
        )

    def act(deployment) -> None:
        deployments.request_stop(user=request.user, deployment=deployment)

    return _deployment_action(request, deployment_id, act, "Stop requested.")


# --- teams -------------------------------------------------------------------------------


def _team_page(
    request: HttpRequest, team, *, status: int = 200, error: str = "", token_form: dict | None = None
) -> HttpResponse:
    role = tenancy.role_in_team(user=request.user, team=team)
    is_admin = role == Role.ADMIN
    members = team_members.list_members(user=request.user, slug=team.slug) if is_admin else []
    tokens = tenancy.visible_tokens(user=request.user).filter(team=team).order_by("-created_at")
    new_token = request.session.pop(SESSION_NEW_TOKEN, None) if status == 200 else None
    gateway_rows = (
        deployments.gateway_usage(user=request.user, team_slug=team.slug)[:GATEWAY_USAGE_ROWS] if is_admin else []
    )
    return render(
        request,
        "console/team.html",
        {
            "team": team,
            "role": role,
            "is_admin": is_admin,
            "members": members,
            "roles": Role.choices,
            # Only the scopes the member's role can use (a viewer's token reads).
            "scopes": [(v, label) for v, label in Scope.choices if role and v in tenancy.scopes_for_role(role)],
            "tokens": tokens,
            "new_token": new_token,
            "token_form": token_form or {"name": "", "scopes": [], "expires_in_days": ""},
            "usage": [_usage_line(line) for line in team_usage(team=team)],
            "gateway_usage": gateway_rows,
            "error": error,
            "error_status": _status_text(status),
        },
        status=status,
    )


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """A team's members and roles (its admins edit them), API tokens (create, revoke) and usage."""
    team = _team_of(request, slug)
    if refused := _read_only(request):
        return refused
    return _team_page(request, team)


def _team_action(request: HttpRequest, slug: str, act, done: str, *, token_form: dict | None = None) -> HttpResponse:
    team = _team_of(request, slug)
    if refused := _post_only(request):
        return refused
    try:
        act(team)
    except ConchError as exc:
        return _team_page(request, team, status=exc.status_code, error=exc.detail, token_form=token_form)
    if done:
        messages.success(request, done)
    return redirect(reverse("console:team", kwargs={"slug": team.slug}))


@login_required
def member_role(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    """Give a member another role (team admin)."""

    def act(team) -> None:
        team_members.change_member_role(
            user=request.user, slug=team.slug, username=username, role=request.POST.get("role", "")
        )

    return _team_action(request, slug, act, f"{username}'s role changed.")


@login_required
def member_remove(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    """Take a member out of the team and revoke their tokens of it (team admin; never the last admin); a POST
    without the confirmation field gets the confirmation page naming the member."""
    team = _team_of(request, slug)
    if request.method == "POST" and not _confirmed(request):
        return _confirm_page(
            request,
            title=f"Remove {username} from {team.name}?",
            question=f"Remove {username} from team {team.slug}?",
            consequence=f"{username} loses access to the team's models and deployments, and their API tokens of "
            "this team are revoked.",
            button=f"Remove {username}",
            cancel_url=reverse("console:team", kwargs={"slug": team.slug}),
        )

    def act(team) -> None:
        team_members.remove_member(user=request.user, slug=team.slug, username=username)

    return _team_action(request, slug, act, f"{username} removed from the team.")


@login_required
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Add an existing user to the team with a role (team admin)."""

    def act(team) -> None:
        username = request.POST.get("username", "").strip()
        try:
            team_members.add_member(
                user=request.user, slug=team.slug, username=username, role=request.POST.get("role", "")
            )
        except Conflict as exc:  # the API's text names PATCH; the console names its own form
            if exc.field != "username":
                raise
            raise Conflict(presenters.already_member_message(username, team.slug), field="username") from exc

    return _team_action(request, slug, act, "Member added.")


@login_required
def token_create(request: HttpRequest, slug: str) -> HttpResponse:
    """Create an API token of the user in the team; its secret is shown on the next page once, then never."""

    def act(team) -> None:
        days = request.POST.get("expires_in_days", "").strip()
        issued = tenancy.create_api_token(
            user=request.user,
            team=team,
            name=request.POST.get("name", "").strip(),
            scopes=request.POST.getlist("scopes") or None,
            expires_in_days=_whole_number(days, "expires_in_days") if days else None,
        )
        request.session[SESSION_NEW_TOKEN] = {"name": issued.token.name, "secret": issued.secret}

    # what the user entered, shown again in the form when the service refuses it
    entered = {
        "name": request.POST.get("name", ""),
        "scopes": request.POST.getlist("scopes"),
        "expires_in_days": request.POST.get("expires_in_days", ""),
    }
    return _team_action(request, slug, act, "", token_form=entered)


@login_required
def token_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    """Revoke a token of the team the user may manage (their own, or any as the team's admin).

    The team page's Revoke button posts without the confirmation field and gets the confirmation page naming the
    token; only its form (`confirm=yes`) revokes it.
    """
    team = _team_of(request, slug)
    token = tenancy.visible_tokens(user=request.user).filter(team=team, pk=pk).select_related("user").first()
    if token is None:
        raise Http404(f"Token {pk} does not exist or is not one you may manage.")
    if request.method == "POST" and not _confirmed(request):
        label = f"“{token.name}” ({token.prefix}…)" if token.name else f"{token.prefix}…"
        return _confirm_page(
            request,
            title=f"Revoke token {token.name or token.prefix}?",
            question=f"Revoke token {label} of {token.user.username} in team {team.slug}, scopes "
            f"{', '.join(token.scopes) or 'all'}?",
            consequence="Every request made with it is refused (401) from now on: scripts and pipelines that use it "
            "stop working. A revoked token cannot be restored; create a new one instead.",
            button=f"Revoke token {token.name or token.prefix}",
            cancel_url=reverse("console:team", kwargs={"slug": team.slug}),
        )
    return _team_action(
        request, slug, lambda team: tenancy.revoke_api_token(user=request.user, token_id=pk), "Token revoked."
    )


# --- custom backends ---------------------------------------------------------------------


def _backends_page(request: HttpRequest, *, status: int = 200, error: str = "", entered=None) -> HttpResponse:
    console = team_context(request)
    listed = backend_services.list_backends(user=request.user).filter(team=console.team).order_by("name", "-pk")
    return render(
        request,
        "console/backends.html",
        {
            "backends": listed,
            "error": error,
            "entered": entered or {},
            "can_write": role_can_write(tenancy.role_in_team(user=request.user, team=console.team))
            if console.team is not None
            else False,
        },
        status=status,
    )


@login_required
@accepts_body(backend_services.BACKEND_BODY)
def backend_list(request: HttpRequest) -> HttpResponse:
    """The current team's custom backends (Triton backends of its own, which models name in config.pbtxt); POST
    registers one from an uploaded archive (multipart: name, version, api_version, file)."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if request.method != "POST":
        return _backends_page(request)
    console = team_context(request)
    entered = {key: request.POST.get(key, "") for key in ("name", "version", "api_version")}
    upload = request.FILES.get("file")
    if console.team is None or upload is None:
        return _backends_page(
            request, status=400, error="Choose the backend's archive (a zip or tar) to upload.", entered=entered
        )
    with tempfile.TemporaryDirectory(prefix="conch-console-backend-") as work:
        archive = Path(work) / "backend.archive"
        with archive.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
        try:
            backend = backend_services.register_backend(
                user=request.user,
                team_slug=console.team.slug,
                name=entered["name"].strip(),
                version=entered["version"].strip(),
                archive=archive,
                api_version=entered["api_version"].strip() or None,
            )
        except ConchError as exc:
            prefix = f"{exc.field}: " if exc.field and exc.field != "file" else ""
            return _backends_page(request, status=exc.status_code, error=prefix + exc.detail, entered=entered)
    messages.success(request, f"Backend {backend.name} {backend.version} registered.")
    return redirect("console:backends")


@login_required
def backend_delete(request: HttpRequest, backend_id: int) -> HttpResponse:
    """Delete one of the team's backends (POST); refused (409) while a model version uses it. Another team's backend
    is a 404, whatever the method."""
    try:
        backend = backend_services.get_backend(user=request.user, backend_id=backend_id)
    except NotFound as exc:
        raise Http404(exc.detail) from None
    if refused := _post_only(request):
        return refused
    label = f"{backend.name} {backend.version}"
    try:
        backend_services.delete_backend(user=request.user, backend_id=backend_id)
    except ConchError as exc:
        return _backends_page(request, status=exc.status_code, error=exc.detail)
    messages.success(request, f"Backend {label} deleted.")
    return redirect("console:backends")


# --- pipelines ---------------------------------------------------------------------------


@login_required
@require_safe
def pipeline_list(request: HttpRequest) -> HttpResponse:
    """The current team's pipelines, each with its latest version's steps."""
    console = team_context(request)
    found = pipeline_services.list_pipelines(user=request.user).filter(team=console.team).order_by("name")
    rows = []
    for pipeline in found.prefetch_related("versions"):
        versions = list(pipeline.versions.all())
        rows.append(
            {"row": pipeline, "count": len(versions), "latest": max(versions, key=lambda v: v.number, default=None)}
        )
    return render(request, "console/pipelines.html", {"pipelines": rows})


@login_required
def pipeline_detail(request: HttpRequest, pipeline_id: int) -> HttpResponse:
    """A pipeline's versions, newest first: the graph drawn (inputs, steps, outputs, each tensor's type on its
    arrow), the steps in the order they run, and the generated ensemble configuration."""
    try:
        pipeline = pipeline_services.get_pipeline(user=request.user, pipeline_id=pipeline_id)
    except NotFound as exc:
        raise Http404(exc.detail) from None
    if request.method not in ("GET", "HEAD"):  # after the lookup: another team's pipeline is a 404 whatever the method
        return HttpResponseNotAllowed(["GET", "HEAD"])
    versions = [
        {"row": version, "drawing": presenters.pipeline_graph(version.spec, version.graph)}
        for version in pipeline.versions.order_by("-number")
    ]
    return render(request, "console/pipeline.html", {"pipeline": pipeline, "versions": versions})

"""Console pages (login required): each view reads through the apps' services, scoped to the user's teams, and
renders a template; a write calls one service, which checks the caller's role itself."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from conch.errors import InvalidInput, NotFound
from console.context import SESSION_TEAM, team_context
from deployments import services as deployments
from models_registry import services as registry
from tenancy import services as tenancy


def _not_found(exc: NotFound) -> Http404:
    return Http404(exc.detail)


def _read_only(request: HttpRequest) -> HttpResponse | None:
    """405 for a method other than GET/HEAD on a page that names an object; called after the object is found, so
    a caller outside its team gets 404 whatever the method (nothing tells them it exists)."""
    if request.method in ("GET", "HEAD"):
        return None
    return HttpResponseNotAllowed(["GET", "HEAD"])


@login_required
@require_safe
def overview(request: HttpRequest) -> HttpResponse:
    """The current team's deployments with their status, its recent builds and its quota usage."""
    console = team_context(request)
    team_deployments = (
        deployments.visible_deployments(user=request.user).filter(team=console.team).order_by("-created_at")
        if console.team
        else []
    )
    return render(request, "console/overview.html", {"deployments": team_deployments})


@login_required
@require_POST
def switch_team(request: HttpRequest) -> HttpResponse:
    """Make the posted `team` (a slug of one of the user's teams) the one the console shows; back to `next`."""
    slug = request.POST.get("team", "")
    try:
        tenancy.get_team_for_user(user=request.user, slug=slug)
    except (InvalidInput, NotFound) as exc:
        raise Http404(exc.detail) from exc
    request.session[SESSION_TEAM] = slug
    target = request.POST.get("next", "/")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "/"
    return redirect(target)


@login_required
@require_safe
def model_list(request: HttpRequest) -> HttpResponse:
    """The current team's registered models."""
    console = team_context(request)
    models = registry.visible_models(user=request.user).filter(team=console.team).order_by("name")
    return render(request, "console/models.html", {"models": models})


@login_required
def model_detail(request: HttpRequest, model_id: int) -> HttpResponse:
    """One model and its versions."""
    try:
        model = registry.get_model(user=request.user, model_id=model_id)
    except NotFound as exc:
        raise _not_found(exc) from exc
    if refused := _read_only(request):
        return refused
    versions = registry.visible_versions(user=request.user).filter(model=model).order_by("-number")
    return render(request, "console/model.html", {"model": model, "versions": versions})


@login_required
@require_safe
def deployment_list(request: HttpRequest) -> HttpResponse:
    """All deployments of the user's teams."""
    listed = deployments.visible_deployments(user=request.user).order_by("-created_at")
    return render(request, "console/deployments.html", {"deployments": listed})


@login_required
def deployment_detail(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Status, endpoints, model configuration, Triton's log and live charts."""
    try:
        deployment = deployments.get_deployment(user=request.user, deployment_id=deployment_id)
    except NotFound as exc:
        raise _not_found(exc) from exc
    if refused := _read_only(request):
        return refused
    return render(
        request,
        "console/deployment.html",
        {
            "deployment": deployment,
            "endpoints": deployments.endpoints(deployment),
            "log_tail": deployments.log_tail(deployment),
        },
    )


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """A team's members and roles, its API tokens and its usage."""
    try:
        team = tenancy.get_team_for_user(user=request.user, slug=slug)
    except NotFound as exc:
        raise _not_found(exc) from exc
    if refused := _read_only(request):
        return refused
    members = team.memberships.select_related("user").order_by("user__username")
    return render(request, "console/team.html", {"team": team, "members": members})

"""Server-rendered console pages for deployments (login required)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from conch.errors import NotFound
from deployments import services


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    """All deployments of the user's teams."""
    deployments = services.visible_deployments(user=request.user).order_by("-created_at")
    return render(request, "deployments/list.html", {"deployments": deployments})


@login_required
def deployment_detail(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Status, endpoints, model configuration, Triton's log and a live throughput/latency chart."""
    try:
        deployment = services.get_deployment(user=request.user, deployment_id=deployment_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    return render(
        request,
        "deployments/detail.html",
        {
            "deployment": deployment,
            "endpoints": services.endpoints(deployment),
            "log_tail": services.log_tail(deployment),
        },
    )

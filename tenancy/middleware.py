"""Middleware that tells the audit log who is acting in a web request (see `tenancy.audit`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse

from tenancy.audit import audit_context, client_ip
from tenancy.choices import AuditSource

#: Paths whose mutations are recorded with source `api` (the REST API and the inference gateway).
API_PREFIXES = ("/api/", "/serve/")


class AuditContextMiddleware:
    """Record mutations made while handling a request as the request's: its user (read when an entry is made, so
    a DRF token authenticated in the view counts), the client IP, the source (`api`, `admin` or `console`) and
    its method and path. Place it after AuthenticationMiddleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if path.startswith(API_PREFIXES):
            source = AuditSource.API
        elif (admin := _admin_prefix()) and path.startswith(admin):
            source = AuditSource.ADMIN
        else:
            source = AuditSource.CONSOLE
        with audit_context(source=source, detail=f"{request.method} {path}", request=request, ip=client_ip(request)):
            return self.get_response(request)


@cache
def _admin_prefix() -> str:
    try:
        return reverse("admin:index")
    except NoReverseMatch:
        return ""

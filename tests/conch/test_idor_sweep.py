"""IDOR sweep: every route that names an object, every method, called by another team's member and tokens.

The routes come from the OpenAPI schema (`/api/v1/schema/`) and from Django's URL conf (`get_resolver()`, which
holds the console, the admin, the sign-in pages and the inference gateway too), never from a hand-kept list. Team
acme owns a member, a token, a model, a built version with its build steps and a deployment; the callers are
- bob, an admin of team globex, signed in to the console (a session),
- bob's token of globex (every scope),
- carol's token bound to globex, carol being an admin of acme too: the token, not the user, must be what limits it.

For each route with a parameter, the parameter is filled with acme's object of that kind (`_value_for`); a
parameter the sweep cannot fill fails the test, so a new route can never slip through unchecked. Then every caller
gets 404 or 403 (the console and the admin send callers whose credentials they do not take to their sign-in page;
the gateway answers 401 to a session), the database is the same afterwards, and acme's own admin, the control,
reaches each of those routes (no 404) in a savepoint that is rolled back.

Routes whose object no team owns are listed in SHARED_ROUTES with the reason; they must still change nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from axes.models import AccessFailureLog
from django.apps import apps
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.utils.regex_helper import normalize

from builds.services import current_build
from tests.conch.conftest import TwoTeams

pytestmark = pytest.mark.django_db

METHODS = ("get", "head", "post", "put", "patch", "delete")
#: Tables compared before and after the sweep (apps' labels); columns that record a use rather than a change
#: (a token's or user's last use) are left out.
SNAPSHOT_APPS = ("tenancy", "models_registry", "builds", "uploads", "deployments", "auth", "axes")
VOLATILE_COLUMNS = {"last_used_at", "last_login"}
GATEWAY_POINTER = "/serve/{rest}"
#: Routes whose object belongs to no team, with the reason; they are swept too and must change nothing.
SHARED_ROUTES = {
    "/api/v1/clusters/{name}/": "a cluster is registered by staff and offered to every team; no credential shown",
    "/accounts/reset/{uidb64}/{token}/": "a password-reset link: without the emailed token it offers no form",
    GATEWAY_POINTER: "404 to everyone, naming the inference gateway's own address (a process of its own, swept in "
    "tests/deployments/test_gateway.py)",
}


@dataclass(frozen=True)
class Route:
    """One URL pattern with parameters: its template (`/api/v1/models/{id}/`), the view and where it came from."""

    template: str
    params: tuple[str, ...]
    callback: Any
    source: str


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        regex = pattern.pattern.regex.pattern.removeprefix("^")
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + regex)
        else:
            yield prefix + regex, pattern


def resolver_routes() -> list[Route]:
    """Every URL pattern of the project that takes a parameter, as a template, from Django's resolver."""
    routes = {}
    for regex, pattern in _walk(get_resolver().url_patterns):
        (form, params), *_ = normalize(regex)
        if not params:
            continue
        template = "/" + form % {name: "{" + name + "}" for name in params}
        routes[template] = Route(template, tuple(params), pattern.callback, "url conf")
    return list(routes.values())


def schema_operations(client: Client) -> list[tuple[str, str]]:
    """(method, path template) of every operation with a path parameter in the served OpenAPI schema."""
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200, response.content
    operations = []
    for template, item in response.json()["paths"].items():
        if "{" in template:
            operations += [(method, template) for method in item if method in METHODS]
    assert len(operations) >= 10, operations  # the schema was read, not an empty document
    return operations


def drf_methods(callback: Any) -> set[str]:
    """The methods a DRF view answers (its router actions, or its handler methods), HEAD and OPTIONS aside."""
    actions = getattr(callback, "actions", None)
    if actions:
        return set(actions) - {"head", "options"}
    cls = callback.cls
    return {method for method in cls.http_method_names if hasattr(cls, method)} - {"head", "options"}


def _admin_row(route: Route, world: TwoTeams) -> Any:
    """The row an admin route `/admin/<app>/<model>/{object_id}/…` is aimed at: acme's own where acme has one."""
    _, app_label, model_name, *_ = route.template.strip("/").split("/")
    model = apps.get_model(app_label, model_name)
    victim = world.victim
    own = {
        "tenancy.team": victim.team,
        "tenancy.apitoken": victim.user.api_tokens.get(),
        "models_registry.registeredmodel": victim.model,
        "models_registry.modelversion": victim.version,
        "models_registry.upload": victim.upload,
        "builds.custombackend": victim.backend,
        "builds.pipeline": victim.pipeline,
        "builds.buildstep": current_build(victim.version).steps.first(),
        "deployments.deployment": victim.deployment,
        "deployments.cluster": world.cluster,
        "deployments.gatewayusage": victim.deployment.gateway_usage.first(),
        "auth.user": victim.user,
    }.get(model._meta.label_lower)
    row = own or model.objects.order_by("pk").first()
    assert row is not None, f"no row of {model._meta.label} to aim the admin's routes at; add one to the sweep"
    return row


def _value_for(route: Route, param: str, world: TwoTeams) -> str:
    """acme's object (or the shared object) that `param` of `route` names; fails for a parameter it cannot fill."""
    victim = world.victim
    segments = [part for part in route.template.split("/") if part]
    before = segments[segments.index("{" + param + "}") - 1] if "{" + param + "}" in segments else ""
    by_kind = {
        "deployments": victim.deployment.pk,
        "models": victim.model.pk,
        "versions": victim.version.pk,
        "tokens": victim.token_id,
        "teams": victim.team.slug,
        "clusters": world.cluster.name,
        "gateway-usage": victim.team.slug,
        "tensorrt-plans": victim.plan.pk,
        "backends": victim.backend.pk,
        "pipelines": victim.pipeline.pk,
    }
    if param in ("id", "pk", "slug", "name") and before in by_kind:
        return str(by_kind[before])
    named = {
        "model_id": victim.model.pk,
        "version_id": victim.version.pk,
        "deployment_id": victim.deployment.pk,
        "upload_id": victim.upload.pk,
        "backend_id": victim.backend.pk,
        "pipeline_id": victim.pipeline.pk,
    }
    if param in named:
        return str(named[param])
    if param == "number" and before == "parts":  # a part of acme's open upload
        return "1"
    if param == "username" and before == "members":
        return victim.user.username
    if route.template == GATEWAY_POINTER:
        return f"{victim.team.slug}/{victim.deployment.name}/v2/models/adder/infer"
    if route.template.startswith("/serve/"):
        return {"team": victim.team.slug, "deployment": victim.deployment.name, "path": "v2/models/adder/infer"}[param]
    if route.template == "/admin/r/{content_type_id}/{object_id}/":  # the admin's "view on site" shortcut
        return str(
            {"content_type_id": ContentType.objects.get_for_model(victim.deployment).pk}.get(
                param, victim.deployment.pk
            )
        )
    if route.template.startswith("/admin/"):
        if param in ("object_id", "id"):
            return str(_admin_row(route, world).pk)
        if param == "app_label":
            return "deployments"
        if param == "url":  # the admin's catch-all: adds the missing slash for staff, sends others to sign in
            return f"deployments/deployment/{victim.deployment.pk}/change"
    if route.template == "/accounts/reset/{uidb64}/{token}/":
        return {"uidb64": urlsafe_base64_encode(force_bytes(victim.user.pk)), "token": "set-password"}[param]
    raise AssertionError(
        f"{route.source} route {route.template}: the sweep cannot fill parameter {param!r} with an object of team "
        "acme; teach tests/conch/test_idor_sweep.py._value_for what it names (or list the route in SHARED_ROUTES)"
    )


def fill(route: Route, world: TwoTeams) -> str:
    url = route.template
    for param in route.params:
        url = url.replace("{" + param + "}", _value_for(route, param, world))
    return url


def snapshot() -> dict[str, list[dict]]:
    """Every row of the swept apps' tables, without VOLATILE_COLUMNS."""
    rows = {}
    for label in SNAPSHOT_APPS:
        for model in apps.get_app_config(label).get_models():
            rows[model._meta.label] = [
                {k: v for k, v in row.items() if k not in VOLATILE_COLUMNS}
                for row in model.objects.order_by("pk").values()
            ]
    return rows


def _send(client: Client, method: str, url: str, **headers: str):
    body = {} if method in ("post", "put", "patch") else None
    if body is None:
        return getattr(client, method)(url, **headers)
    return getattr(client, method)(url, body, content_type="application/json", **headers)


def _refused(route: Route, caller: str, response) -> bool:
    """Whether `response` keeps `caller` (session or token) out of `route`'s object."""
    status = response.status_code
    location = response.get("Location", "")
    if route.template.startswith("/admin/"):
        return status == 302 and location.startswith("/admin/login/")
    if route.template.startswith("/serve/") and caller == "session":
        return status == 401  # the gateway takes API tokens only
    if not route.template.startswith(("/api/", "/serve/")) and caller == "token":
        return status == 302 and location.startswith("/accounts/login/")  # console pages take sessions only
    return status in (403, 404)


def test_no_route_lets_another_team_reach_an_object(two_teams):
    world = two_teams
    victim, other = world.victim, world.other
    # given rows of tables only the admin shows: a group, a good and a failed sign-in of acme's admin, a failure log
    Group.objects.create(name="auditors")
    assert Client().post("/accounts/login/", {"username": "alice", "password": "pw-for-tests-1"}).status_code == 302
    assert Client().post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    # (axes keeps no failure log unless AXES_ENABLE_ACCESS_FAILURE_LOG; its admin page exists all the same)
    AccessFailureLog.objects.create(
        username="alice", ip_address="127.0.0.1", user_agent="sweep", http_accept="*/*", path_info="/accounts/login/"
    )

    # and every route with a parameter: from the schema (API operations) and the URL conf (everything)
    schema = [
        (method, Route(template, tuple(re.findall(r"{(\w+)}", template)), None, "schema"))
        for method, template in schema_operations(victim.token_client())
    ]
    routes = {route.template: route for route in resolver_routes()}
    api_routes = [route for route in routes.values() if route.template.startswith("/api/")]
    assert api_routes, "the resolver walk found no API route"
    # each API view method the resolver knows is an operation of the schema (no view hidden from the schema)
    schema_by_view: dict[Any, set[str]] = {}
    for method, operation in schema:
        schema_by_view.setdefault(resolve(fill(operation, world)).func, set()).add(method)
    for route in api_routes:
        missing = drf_methods(route.callback) - schema_by_view.get(route.callback, set())
        assert not missing, f"{route.template}: {sorted(missing)} answered but not in the OpenAPI schema"
    # the requests: the schema's operations, and every method on the other routes
    requests = schema + [
        (method, route) for route in routes.values() if not route.template.startswith("/api/") for method in METHODS
    ]

    callers = {
        "bob's session": ("session", other.session_client(), {}),
        "bob's token of globex": ("token", Client(), {"HTTP_AUTHORIZATION": f"Bearer {other.token}"}),
        "carol's token of globex": ("token", Client(), {"HTTP_AUTHORIZATION": f"Bearer {world.carol_token}"}),
    }
    # (the control callers: acme's admin, and a staff user for the admin's pages; signed in before the snapshot)
    owner_session = victim.session_client()
    staff = Client()
    staff.force_login(world.staff)
    before = snapshot()

    # when each caller sends each request to acme's objects
    leaks = []
    for method, route in requests:
        url = fill(route, world)
        for name, (kind, client, headers) in callers.items():
            response = _send(client, method, url, **headers)
            shared = route.template in SHARED_ROUTES
            if not shared and not _refused(route, kind, response):
                leaks.append(f"{method.upper()} {url} by {name}: {response.status_code} {response.content[:200]!r}")
            if shared:
                assert response.status_code < 500, (method, url, name, response.content[:300])
                assert b'name="new_password1"' not in response.content

    # then no caller got through, and nothing changed
    assert leaks == []
    assert snapshot() == before
    swept = {route.template for _, route in requests}
    assert {
        "/api/v1/deployments/{id}/",
        "/api/v1/models/{model_id}/versions/",
        "/api/v1/models/{model_id}/uploads/{upload_id}/parts/{number}/",
        "/deployments/{deployment_id}/",
        "/models/{model_id}/",
        "/teams/{slug}/",
    } <= swept
    assert any(template.startswith("/serve/") for template in swept)

    # and acme's own admin reaches every one of those routes (the ids are right), each call rolled back
    for method, route in requests:
        url = fill(route, world)
        if route.template == GATEWAY_POINTER:
            continue  # 404 for its owner too: it only says where the gateway is
        if route.template.startswith("/admin/"):
            # The "view on site" shortcut is 404 for any object without get_absolute_url (none of Conch's has one).
            if method not in ("get", "head") or route.template.startswith("/admin/r/"):
                continue
            client, headers = staff, {}
        elif route.template.startswith(("/api/", "/serve/")):
            client, headers = Client(), {"HTTP_AUTHORIZATION": f"Bearer {victim.token}"}
        else:
            client, headers = owner_session, {}
        with transaction.atomic():
            response = _send(client, method, url, **headers)
            transaction.set_rollback(True)
        assert response.status_code != 404, f"control: {method.upper()} {url} is 404 for its owner too"
    assert snapshot() == before

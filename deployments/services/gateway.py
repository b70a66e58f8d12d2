"""The inference gateway's rules: each deployment at `/serve/<team>/<deployment>/` speaking the KServe v2 / Open
Inference Protocol REST API that Triton's and KServe's clients use, behind Conch's tokens.

What a client may call there (KServe "Open Inference Protocol", REST; Triton "HTTP/REST and GRPC Protocol"):
- `GET v2/health/live`, `GET v2/health/ready`: answered by Conch, `{"live": true}` / `{"ready": true|false}`
  (200 when ready, 503 when not), the shape both clients read;
- `GET v2`: the server's metadata, from Triton, with the deployment's name as the server's name;
- `GET v2/models/<model>[/versions/<v>]`, `…/ready`, `…/config` (read only) and `POST …/infer`: passed to a
  ready Triton of the deployment (a local server, or the next ready pod) with the client's body and the headers
  that describe it (`Inference-Header-Content-Length` for binary tensor data, Content-Encoding and
  Accept-Encoding for gzip/deflate), and Triton's answer passed back as is.
Any other path, or another model than the deployment's, is 404. Every call needs the `infer` scope in the
deployment's team (and its name, for a token limited to named deployments) and the developer role.

The HTTP edge (`deployments.api.gateway`, an ASGI application) resolves a (token, team, deployment) to a
`Route` here once and keeps it for `CONCH_GATEWAY_ROUTE_CACHE_SECONDS`, so a request in the steady state touches
neither the database nor the runtime; `plan_request` (pure) decides what to do with each request; usage is
counted in memory by the edge and written here in batches (`record_gateway_usage`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from conch.errors import ConchError, Conflict, InvalidInput, NotFound, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment, GatewayUsage
from deployments.services.records import effective_settings, require_deployment_access, serving_servers
from tenancy.choices import Role, Scope
from tenancy.services import TokenGrant, authenticate_token, get_team_for_user, require_role

if TYPE_CHECKING:
    from django.contrib.auth.models import User

__all__ = [
    "GatewayAddress",
    "GatewayMethodNotAllowed",
    "Plan",
    "Route",
    "UsageCounts",
    "deployment_route",
    "gateway_address",
    "gateway_usage",
    "parse_header_length",
    "plan_request",
    "record_gateway_usage",
    "require_servers",
    "resolve_route",
    "today",
]

#: Seconds one relayed request may take (connect, send, Triton's work, answer).
RELAY_TIMEOUT_S = 60.0
_MODEL_PATH = re.compile(
    r"models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?(?:/(?P<what>ready|config|infer|stats))?"
)
_SERVING = (DeploymentStatus.READY, DeploymentStatus.DEGRADED)


class GatewayMethodNotAllowed(ConchError):
    """The path exists with another HTTP method (405)."""

    status_code = 405


@dataclass(frozen=True)
class Route:
    """What the gateway knows of one (token, team, deployment) while it caches it.

    `servers`: (KServe v2 base URL, restricted-endpoint key) of each ready Triton, in the order requests take
    them; empty when none is ready. `grpc_servers`: (gRPC `host:port`, key, KServe v2 base URL) of the same
    servers, in the same order (a server without a gRPC port is left out; the base URL names the server's
    shared-memory region for both edges). `batching`: whether the model batches (its max_batch_size
    > 0), so the first dimension of a request's first input counts its inferences. `requests_per_minute`: the
    token's rate limit. `unavailable`: the sentence to answer (503) for a model path when no server is ready.
    """

    token_id: int
    token_prefix: str
    team_id: int
    deployment_id: int
    deployment_name: str
    model_name: str
    ready: bool
    batching: bool
    servers: tuple[tuple[str, str], ...]
    requests_per_minute: int
    unavailable: str = ""
    grpc_servers: tuple[tuple[str, str, str], ...] = ()
    unavailable_status: int = 503


@dataclass(frozen=True)
class Plan:
    """What to do with one request: answer it here (`status`, `body`), or pass it to a Triton at `triton_path`
    (`kind` "infer", "config", "stats", "model" or "server"; `restricted` paths need the server's key)."""

    status: int = 0
    body: bytes = b""
    triton_path: str = ""
    kind: str = ""
    restricted: bool = False


@dataclass
class UsageCounts:
    """Gateway use by one token on one deployment on one day (UTC): requests, inferences (batch items of infer
    requests; 1 per request whose size cannot be read), errors (answers >= 400), bytes in and out of bodies."""

    requests: int = 0
    inferences: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def add(self, other: UsageCounts) -> None:
        """Add `other`'s counts to these."""
        self.requests += other.requests
        self.inferences += other.inferences
        self.errors += other.errors
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out


#: The gRPC metadata key that names the deployment a call is for, as `<team>/<deployment>`.
GRPC_DEPLOYMENT_KEY = "conch-deployment"


@dataclass(frozen=True)
class GatewayAddress:
    """Where clients reach one deployment through the gateway, with a token of the `infer` scope.

    `http`: its KServe v2 REST base URL (`…/serve/<team>/<deployment>`; tritonclient.http takes it without the
    scheme). `grpc`: the gateway's KServe v2 gRPC `host:port` ("" when the gateway serves no gRPC) and
    `grpc_metadata` the metadata every call sends there besides `authorization: Bearer <token>`.
    """

    http: str
    grpc: str
    grpc_metadata: Mapping[str, str]


def gateway_address(*, team_slug: str, name: str) -> GatewayAddress:
    """The gateway's addresses of deployment `name` of team `team_slug` (CONCH_GATEWAY_URL,
    CONCH_GATEWAY_GRPC_ADDRESS). Pure: reads settings only."""
    return GatewayAddress(
        http=f"{settings.CONCH_GATEWAY_URL}/serve/{team_slug}/{name}",
        grpc=settings.CONCH_GATEWAY_GRPC_ADDRESS if settings.CONCH_GATEWAY_GRPC_BIND else "",
        grpc_metadata={GRPC_DEPLOYMENT_KEY: f"{team_slug}/{name}"},
    )


def resolve_route(*, raw_token: str, team_slug: str, name: str) -> Route:
    """Authenticate `raw_token` and find the running deployment `name` of team `team_slug` it may use.

    Raises Unauthenticated (401: unknown, revoked, expired token), NotFound (no such running deployment that this
    token can see), Forbidden (403 naming the missing `infer` scope or the role needed).
    """
    user, token = authenticate_token(raw=raw_token)
    missing = NotFound(f"There is no running deployment '{name}' in team '{team_slug}' that this token can use.")
    try:
        team = get_team_for_user(user=user, slug=team_slug, token=token)
    except NotFound:
        raise missing from None
    deployment = (
        Deployment.objects.filter(team=team, name=name)
        .exclude(status=DeploymentStatus.STOPPED)
        .select_related("team")
        .first()
    )
    if deployment is None or (token.deployments and name not in token.deployments):
        raise missing  # as the REST API: a token limited to other deployments does not see this one
    require_deployment_access(
        user=user, deployment=deployment, action="Using the inference gateway", token=token, scope=Scope.INFER
    )
    return deployment_route(deployment=deployment, token=token)


def deployment_route(*, deployment: Deployment, token: TokenGrant | None) -> Route:
    """The `Route` to `deployment` for a caller who may use it (access already checked): its ready servers (from
    the runtime), whether the model batches, and the rate limit of `token` (its own `requests_per_minute`, else
    CONCH_GATEWAY_REQUESTS_PER_MINUTE). `token` None (a console session): `token_id` 0 and no token prefix; such
    a route is not rate limited or metered here (usage is kept per token). Reads the database and the runtime."""
    ready = deployment.status in _SERVING
    servers: tuple[tuple[str, str], ...] = ()
    grpc_servers: tuple[tuple[str, str, str], ...] = ()
    unavailable, unavailable_status = "", 503
    if ready:
        try:
            found = serving_servers(deployment)
        except Unavailable as exc:
            unavailable = exc.detail
        else:
            servers = tuple((server.http_url, server.api_key) for server in found)
            grpc_servers = tuple(
                (server.grpc_target, server.api_key, server.http_url) for server in found if server.grpc_target
            )
    if not servers and not unavailable:
        if deployment.runtime == "kubernetes" and not deployment.autoscaling and deployment.replicas == 0:
            unavailable, unavailable_status = (
                f"Deployment '{deployment.name}' is scaled to 0 replicas; PATCH replicas to 1 or more to serve.",
                409,
            )
        elif ready:
            unavailable = f"Deployment '{deployment.name}' has no ready Triton right now; retry in a few seconds."
        else:
            unavailable = f"Deployment '{deployment.name}' is {deployment.status}, not serving; retry when it is ready."
    return Route(
        token_id=token.id if token is not None else 0,
        token_prefix=token.prefix if token is not None else "",
        team_id=deployment.team_id,
        deployment_id=deployment.pk,
        deployment_name=deployment.name,
        model_name=deployment.model_name,
        ready=ready,
        batching=(effective_settings(deployment).get("max_batch_size") or 0) > 0,
        servers=servers,
        requests_per_minute=(token.requests_per_minute if token is not None else None)
        or settings.CONCH_GATEWAY_REQUESTS_PER_MINUTE,
        unavailable=unavailable,
        unavailable_status=unavailable_status,
        grpc_servers=grpc_servers,
    )


def require_servers(route: Route) -> None:
    """Raise what a request needing a Triton of `route` gets when none is ready: Conflict (409, field `replicas`)
    for a deployment scaled to 0, else Unavailable (503) with `route.unavailable`."""
    if not route.servers:
        error = Conflict if route.unavailable_status == 409 else Unavailable
        raise error(route.unavailable, field="replicas" if error is Conflict else None)


def plan_request(route: Route, method: str, path: str) -> Plan:
    """Decide what to do with `method path` (what follows `/serve/<team>/<deployment>/`, e.g.
    `v2/models/m/infer`) for `route`. Pure. `v2/models/stats` (every model's statistics, what tritonclient's
    `get_inference_statistics()` asks without a model name) is the deployment's model's statistics, of the one
    Triton the request goes to (with several pods, that pod's). Raises NotFound (a path or model the gateway does
    not serve), GatewayMethodNotAllowed (405), Unavailable (503) or Conflict (409, scaled to 0) when no Triton is
    ready."""
    path = path.strip("/")
    if path == "v2/health/live" and method in ("GET", "HEAD"):
        return Plan(status=200, body=b'{"live":true}')
    if path == "v2/health/ready" and method in ("GET", "HEAD"):
        if route.ready and route.servers:
            return Plan(status=200, body=b'{"ready":true}')
        # KServe's client shows `error` (and only that) of a failed health check.
        return Plan(status=503, body=json.dumps({"ready": False, "error": route.unavailable}).encode())
    if path == "v2" and method in ("GET", "HEAD"):
        require_servers(route)
        return Plan(triton_path="/v2", kind="server")
    if path == "v2/models/stats":
        # tritonclient's get_inference_statistics() without a model name asks for every model's statistics; the
        # deployment's Triton serves its one model, so that is this model's (Triton "Statistics Extension").
        path = f"v2/models/{route.model_name}/stats"
    match = _MODEL_PATH.fullmatch(path.removeprefix("v2/")) if path.startswith("v2/") else None
    if match is None:
        raise NotFound(f"The gateway does not serve '{path}'; see the KServe v2 REST API (v2/models/<model>/infer).")
    if match["model"] != route.model_name:
        raise NotFound(
            f"Model '{match['model']}' is not served here; deployment '{route.deployment_name}' serves "
            f"'{route.model_name}'."
        )
    what = match["what"]
    allowed = "POST" if what == "infer" else "GET"
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise GatewayMethodNotAllowed(f"{path} takes {allowed}, not {method}.")
    require_servers(route)
    return Plan(triton_path=f"/{path}", kind=what or "model", restricted=what in ("config", "stats"))


def parse_header_length(raw: str | None) -> int | None:
    """The value of `Inference-Header-Content-Length` (bytes), None when absent. Raises InvalidInput naming it."""
    if raw is None:
        return None
    if not (raw.strip().isascii() and raw.strip().isdigit()):
        raise InvalidInput(
            f"Inference-Header-Content-Length must be the length in bytes of the JSON header, got {raw!r}.",
            field="Inference-Header-Content-Length",
        )
    return int(raw)


def record_gateway_usage(*, counts: Mapping[tuple[int, int, int, dt.date], UsageCounts]) -> int:
    """Add `counts`, keyed (token id, team id, deployment id, day), to the stored per-day totals in one statement
    per key (PostgreSQL `INSERT … ON CONFLICT DO UPDATE`, so concurrent gateway processes add up). A token or
    deployment deleted since is skipped. Returns the number of rows written."""
    written = 0
    with transaction.atomic():
        for (token_id, team_id, deployment_id, day), c in sorted(counts.items()):
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    INSERT INTO {GatewayUsage._meta.db_table}
                        (token_id, team_id, deployment_id, day, requests, inferences, errors, bytes_in, bytes_out)
                    SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s
                    WHERE EXISTS (SELECT 1 FROM tenancy_apitoken WHERE id = %s)
                      AND EXISTS (SELECT 1 FROM deployments_deployment WHERE id = %s)
                    ON CONFLICT (token_id, deployment_id, day) DO UPDATE SET
                        requests = {GatewayUsage._meta.db_table}.requests + EXCLUDED.requests,
                        inferences = {GatewayUsage._meta.db_table}.inferences + EXCLUDED.inferences,
                        errors = {GatewayUsage._meta.db_table}.errors + EXCLUDED.errors,
                        bytes_in = {GatewayUsage._meta.db_table}.bytes_in + EXCLUDED.bytes_in,
                        bytes_out = {GatewayUsage._meta.db_table}.bytes_out + EXCLUDED.bytes_out
                    """,  # noqa: S608 - table names come from the models, values are parameters
                    [
                        token_id,
                        team_id,
                        deployment_id,
                        day,
                        c.requests,
                        c.inferences,
                        c.errors,
                        c.bytes_in,
                        c.bytes_out,
                        token_id,
                        deployment_id,
                    ],
                )
                written += cursor.rowcount
    return written


def gateway_usage(
    *,
    user: User,
    team_slug: str,
    token: TokenGrant | None = None,
    since: dt.date | None = None,
    until: dt.date | None = None,
) -> QuerySet[GatewayUsage]:
    """Per day, token and deployment: requests, inferences, errors and bytes in/out through the gateway for team
    `team_slug`, newest day first. Needs the admin role in the team (staff: any team) and, with a token, the
    `read` scope. `since`/`until`: UTC dates (inclusive). Raises NotFound, Forbidden, InvalidInput (dates)."""
    team = get_team_for_user(user=user, slug=team_slug, token=token)
    require_role(user=user, team=team, role=Role.ADMIN, action="Reading gateway usage", token=token, scope=Scope.READ)
    rows = GatewayUsage.objects.filter(team=team).select_related("token", "deployment")
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    return rows.order_by("-day", "token_id", "deployment_id")


def today() -> dt.date:
    """Today's date in UTC, the day usage is counted under."""
    return timezone.now().astimezone(dt.UTC).date()

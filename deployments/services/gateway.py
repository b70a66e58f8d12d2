"""The inference gateway: each deployment at `/serve/<team>/<deployment>/` speaking the KServe v2 / Open Inference
Protocol REST API that Triton's and KServe's clients use, behind Conch's tokens.

What a client may call there (KServe "Open Inference Protocol", REST; Triton "HTTP/REST and GRPC Protocol"):
- `GET v2/health/live`, `GET v2/health/ready`: answered by Conch, `{"live": true}` / `{"ready": true|false}`
  (200 when ready, 503 when not), the shape both clients read;
- `GET v2`: the server's metadata, from Triton;
- `GET v2/models/<model>[/versions/<v>]`, `…/ready`, `…/config` (read only) and `POST …/infer`: passed to a
  ready Triton of the deployment (a local server, or the next ready pod) with the client's body and the headers
  that describe it (`Inference-Header-Content-Length` for binary tensor data, Content-Encoding and
  Accept-Encoding for gzip/deflate), and Triton's answer passed back as is.
Any other path, or another model than the deployment's, is 404. Every call needs the `infer` scope in the
deployment's team (and its name, for a token limited to named deployments) and the developer role. Errors come
back as `GatewayError`s, which the view writes as `{"error": "…"}` (the form those clients read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conch.errors import ConchError, InvalidInput, NotFound, Unavailable
from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from deployments.services.inference import send_to_a_server
from deployments.services.records import require_deployment_access, serving_servers, visible_deployments
from tenancy.choices import Scope
from tenancy.services import TokenGrant
from tritonserving.client import TritonClient, check_inference_request

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

__all__ = ["GatewayAnswer", "find_served_deployment", "serve"]

#: Seconds one relayed request may take.
RELAY_TIMEOUT_S = 60.0
_MODEL_PATH = re.compile(r"models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?(?:/(?P<what>ready|config|infer))?")
_SERVING = (DeploymentStatus.READY, DeploymentStatus.DEGRADED)


@dataclass(frozen=True)
class GatewayAnswer:
    """What the gateway sends back: HTTP `status`, `headers` (those describing the body) and the `body` bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


def find_served_deployment(
    *, user: AbstractBaseUser, token: TokenGrant | None, team_slug: str, name: str
) -> Deployment:
    """The running deployment `name` of team `team_slug` that the caller can see. Raises NotFound."""
    deployment = (
        visible_deployments(user=user, token=token)
        .filter(team__slug=team_slug, name=name)
        .exclude(status=DeploymentStatus.STOPPED)
        .first()
    )
    if deployment is None:
        raise NotFound(f"There is no running deployment '{name}' in team '{team_slug}' that this token can use.")
    return deployment


def serve(
    *,
    user: AbstractBaseUser,
    token: TokenGrant | None,
    deployment: Deployment,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> GatewayAnswer:
    """Answer one gateway request for `deployment`: `path` is what follows `/serve/<team>/<deployment>/`
    (e.g. `v2/models/m/infer`). Raises NotFound (a path or model the gateway does not serve), Forbidden (scope,
    role), Unavailable (no ready Triton), ConchError subclasses with their HTTP statuses."""
    require_deployment_access(
        user=user, deployment=deployment, action="Using the inference gateway", token=token, scope=Scope.INFER
    )
    path = path.strip("/")
    if path == "v2/health/live" and method in ("GET", "HEAD"):
        return _json(200, b'{"live":true}')
    if path == "v2/health/ready" and method in ("GET", "HEAD"):
        ready = deployment.status in _SERVING
        return _json(200 if ready else 503, b'{"ready":true}' if ready else b'{"ready":false}')
    if path == "v2" and method == "GET":
        return _relay(deployment, method, "/v2", body, headers)
    match = _MODEL_PATH.fullmatch(path.removeprefix("v2/")) if path.startswith("v2/") else None
    if match is None:
        raise NotFound(f"The gateway does not serve '{path}'; see the KServe v2 REST API (v2/models/<model>/infer).")
    if match["model"] != deployment.model_name:
        raise NotFound(
            f"Model '{match['model']}' is not served here; deployment '{deployment.name}' serves "
            f"'{deployment.model_name}'."
        )
    what = match["what"]
    allowed = "POST" if what == "infer" else "GET"
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise GatewayMethodNotAllowed(f"{path} takes {allowed}, not {method}.")
    if deployment.status not in _SERVING:
        raise Unavailable(
            f"Deployment '{deployment.name}' is {deployment.status}, not serving; retry when it is ready."
        )
    if what == "infer":
        _check_infer_body(body, headers or {})
    return _relay(deployment, method, f"/{path}", body, headers, restricted=what == "config")


class GatewayMethodNotAllowed(ConchError):
    """The path exists with another HTTP method (405)."""

    status_code = 405


def _check_infer_body(body: bytes, headers: dict[str, str]) -> None:
    """Refuse (400 naming the field) an uncompressed inference body Triton would answer with a 500: malformed
    JSON, a binary part that does not add up. A compressed body is left to Triton, which decompresses it."""
    lowered = {name.lower(): value for name, value in headers.items()}
    if lowered.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        return
    raw = lowered.get("inference-header-content-length")
    if raw is not None and not (raw.strip().isascii() and raw.strip().isdigit()):
        raise InvalidInput(
            f"Inference-Header-Content-Length must be the length in bytes of the JSON header, got {raw!r}.",
            field="Inference-Header-Content-Length",
        )
    check_inference_request(body, int(raw) if raw is not None else None)


def _json(status: int, body: bytes) -> GatewayAnswer:
    return GatewayAnswer(status=status, headers={"Content-Type": "application/json"}, body=body)


def _relay(
    deployment: Deployment,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str] | None,
    *,
    restricted: bool = False,
) -> GatewayAnswer:
    """Send the request to a ready Triton of the deployment (`send_to_a_server`: in turn, skipping one that
    cannot be reached).

    `restricted` paths (model configuration) go with the server's key, to a server listed now."""
    if restricted:
        servers = serving_servers(deployment)
        if not servers:
            raise Unavailable(f"Deployment '{deployment.name}' has no ready Triton right now; retry in a few seconds.")
        with TritonClient(servers[0].http_url, timeout_s=RELAY_TIMEOUT_S, api_key=servers[0].api_key) as client:
            return GatewayAnswer(*client.relay(method, path, body, headers))

    def send(url: str) -> GatewayAnswer:
        with TritonClient(url, timeout_s=RELAY_TIMEOUT_S) as client:
            return GatewayAnswer(*client.relay(method, path, body, headers))

    return send_to_a_server(deployment, send)

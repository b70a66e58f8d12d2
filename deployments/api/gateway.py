"""The inference gateway's HTTP edge: `/serve/<team>/<deployment>/v2/...` (see `deployments.services.gateway`).

A plain Django view, not a DRF one: the body goes to Triton as the client wrote it, and every error is written as
`{"error": "…"}`, the form Triton's and KServe's clients read. Authentication is a Conch API token only
(`Authorization: Bearer conch_…`), as applications send it; there is no session or CSRF here.
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from conch.errors import ConchError, Unauthenticated
from deployments.services import gateway
from tenancy.services import authenticate_token


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="conch"'
    return response


def _caller(request: HttpRequest):
    header = request.headers.get("Authorization", "")
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise Unauthenticated(
            "Send a Conch API token with the infer scope as 'Authorization: Bearer conch_…' (POST /api/v1/tokens/)."
        )
    return authenticate_token(raw=raw.strip())


@csrf_exempt
def serve(request: HttpRequest, team: str, deployment: str, path: str = "") -> HttpResponse:
    """Answer one KServe v2 request for deployment `deployment` of team `team` (`path`: what follows its base)."""
    try:
        user, grant = _caller(request)
        served = gateway.find_served_deployment(user=user, token=grant, team_slug=team, name=deployment)
        try:
            body = request.body
        except RequestDataTooBig:
            return _error(413, "The request body is larger than this server accepts (CONCH_MAX_REQUEST_BODY_BYTES).")
        answer = gateway.serve(
            user=user,
            token=grant,
            deployment=served,
            method=request.method or "GET",
            path=path,
            body=body,
            headers=dict(request.headers),
        )
    except ConchError as exc:
        return _error(exc.status_code, exc.detail)
    response = HttpResponse(answer.body if request.method != "HEAD" else b"", status=answer.status)
    for name, value in answer.headers.items():
        response[name] = value
    return response

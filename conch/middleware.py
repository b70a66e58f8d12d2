"""Middleware at the door: `/api/` errors are JSON, control characters are refused, bodies over their limit too.

DRF's exception handler (`conch.api.exception_handler`) only sees exceptions raised inside a DRF view. Django
answers everything else itself with an HTML page: a URL that matches no route (404), an exception a view did
not handle (500), a bad Host header (400). For `/api/` paths this middleware replaces such pages with the API's
error body `{"detail", "field"}`, keeping the status code. Pages outside `/api/` (console, admin) keep HTML.

It also answers 400 to an `/api/` request whose path or query string holds a control character (U+0000-U+001F,
U+007F-U+009F), naming the query parameter: no API input uses one, and PostgreSQL refuses a NUL inside text, so
such a value reaching a query was a 500.

`RequestBodyLimitMiddleware` refuses (413) a request whose declared body is larger than its view accepts
(`conch.limits`), before anything reads the body.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from http import HTTPStatus

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from conch.limits import INFERENCE_BODY, JSON_BODY, STREAMED, BodyLimit, body_limit_of

API_PREFIX = "/api/"
# Views that answer their own 413 in the form their clients read: the inference gateway's `{"error"}` (its body is
# read under DATA_UPLOAD_MAX_MEMORY_SIZE, CONCH_MAX_REQUEST_BODY_BYTES).
_OWN_LIMIT_URL_NAMES = frozenset({"serve"})
# What a view marked STREAMED may receive past CONCH_MAX_UPLOAD_BYTES before the server stops reading: its form
# fields and sample inputs (the view refuses, naming the field, anything over its own limit once it has read it).
STREAMED_SLACK_BYTES = 64 * 1024**2
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Headers of the original error that still matter to a client (RFC 9110: 405 Allow, 401 WWW-Authenticate, 503
# Retry-After); the rest describe the HTML body that is replaced.
_KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After", "Vary")


class ApiErrorMiddleware:
    """Make every `/api/` error response a JSON `{"detail", "field"}` body; refuse control characters (400).

    Place it right after SecurityMiddleware/WhiteNoise, so it wraps the middleware that may answer with an HTML
    error (CommonMiddleware's Host check, CSRF) and security headers still apply to its answers.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        refusal = _refuse_control_characters(request)
        if refusal is not None:
            return refusal
        response = self.get_response(request)
        if response.status_code >= 400 and not _is_json(response):
            return _as_json_error(request, response)
        return response


def _is_json(response: HttpResponse) -> bool:
    content_type = response.get("Content-Type", "")
    return content_type.split(";", 1)[0].strip().lower() in ("application/json", "application/problem+json")


def _error(detail: str, *, field: str | None, status: int) -> JsonResponse:
    return JsonResponse({"detail": detail, "field": field}, status=status)


def _refuse_control_characters(request: HttpRequest) -> JsonResponse | None:
    found = _CONTROL_CHARACTER.search(request.path)
    if found:
        return _error(
            f"The URL path holds the control character U+{ord(found.group()):04X}; "
            "percent-encode only printable text in the path.",
            field=None,
            status=HTTPStatus.BAD_REQUEST,
        )
    for name, values in request.GET.lists():
        found = _CONTROL_CHARACTER.search(name)
        if found:
            return _error(
                f"A query parameter name holds the control character U+{ord(found.group()):04X}; "
                "send printable parameter names only.",
                field=None,
                status=HTTPStatus.BAD_REQUEST,
            )
        for value in values:
            found = _CONTROL_CHARACTER.search(value)
            if found:
                return _error(
                    f"The query parameter '{name}' holds the control character U+{ord(found.group()):04X}; "
                    "send printable text only.",
                    field=name,
                    status=HTTPStatus.BAD_REQUEST,
                )
    return None


def _as_json_error(request: HttpRequest, response: HttpResponse) -> JsonResponse:
    status = response.status_code
    if status == HTTPStatus.NOT_FOUND:
        detail = f"No API endpoint at {request.path}; the endpoints are listed at /api/v1/docs/."
    elif status >= 500:
        # Django has logged the exception with its traceback ("django.request"); the client gets no internals.
        detail = (
            "Conch failed while handling this request (an internal error, logged on the server). "
            "Retry later, and report it with the time of the request if it persists."
        )
    else:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = f"HTTP {status}"
        detail = f"{phrase}: the request to {request.path} was refused."
    answer = _error(detail, field=None, status=status)
    for header in _KEPT_HEADERS:
        if header in response:
            answer[header] = response[header]
    return answer


class RequestBodyLimitMiddleware:
    """Answer 413 `{"detail", "field"}` (plain text outside `/api/`) to a body larger than its view accepts.

    The view's limit is the one it declares (`conch.limits.body_limit_of`); the declared Content-Length is compared
    with it in `process_view`, after URL resolution and before any view, CSRF check or parser reads the body. Views
    marked `STREAMED` check as they stream; the gateway keeps its own answer.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., HttpResponse], args: tuple, kwargs: dict
    ) -> HttpResponse | None:
        match = request.resolver_match
        if match is not None and match.url_name in _OWN_LIMIT_URL_NAMES:
            return None
        limit = body_limit_of(view, request.method or "GET")
        if limit is STREAMED:
            return None
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django reads no body then
        if length <= limit.max_bytes():
            return None
        return body_refusal(request.path_info, limit, length)


def body_refusal(path_info: str, limit: BodyLimit, length: int) -> HttpResponse:
    """The 413 for a body of `length` bytes over `limit` at `path_info`: `{"detail", "field"}` under `/api/`,
    the same sentence as plain text elsewhere (console and admin forms)."""
    refusal = limit.refusal(length)
    if path_info.startswith(API_PREFIX):
        return _error(refusal.detail, field=refusal.field, status=refusal.status_code)
    return HttpResponse(refusal.detail, status=refusal.status_code, content_type="text/plain; charset=utf-8")


def transfer_limit(path_info: str, method: str) -> tuple[BodyLimit, int]:
    """The body limit of the view `path_info` resolves to for `method`, and the most bytes the web server reads of
    such a body before the view runs (`conch.asgi`): the limit, plus STREAMED_SLACK_BYTES for a view that streams
    and checks its body itself. A path that resolves to nothing gets JSON_BODY; the gateway view, INFERENCE_BODY.
    """
    try:
        match = resolve(path_info)
    except Resolver404:
        return JSON_BODY, JSON_BODY.max_bytes()
    if match.url_name in _OWN_LIMIT_URL_NAMES:
        return INFERENCE_BODY, INFERENCE_BODY.max_bytes()
    limit = body_limit_of(match.func, method)
    slack = STREAMED_SLACK_BYTES if limit is STREAMED else 0
    return limit, limit.max_bytes() + slack

"""One exception handler for the whole REST API, and its pagination.

Every error body is `{"detail": <sentence>, "field": <input name or null>}` (a refused quota adds
`"quota": {"limit", "used", "requested"}`; an object still in use adds its users under the field's name, e.g.
`"deployments": [{"id", "name"}]`; a refused duplicate adds the object it would copy, e.g.
`"existing_version": {"id", "number", "status"}`; a check that reports every refusal at once, such as POST
/api/v1/deployments/check, adds them all under `"errors": [{"detail", "field", "quota"?}, ...]`). Our typed
errors (`conch.errors`) carry their own status; DRF's validation errors are flattened to
their first field so a client always finds one `field` to point at. Errors raised outside
DRF (unknown URLs, unhandled exceptions) get the same body from `conch.middleware`.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import exception_handler as drf_exception_handler

from conch.errors import ConchError, Duplicate, InUse, InvalidInput, QuotaExceeded, RateLimited
from conch.limits import INFERENCE_BODY, describe_bytes

#: Largest page a list endpoint returns (`?limit=`).
MAX_PAGE_SIZE = 1000
#: Largest `?offset=`: far past any table here, and offset + limit stays inside the database's 64-bit LIMIT/OFFSET.
MAX_OFFSET = 10**12
_WHOLE_NUMBER = re.compile(r"[0-9]{1,13}")


def _first_error(data: Any, prefix: str | None = None) -> tuple[str | None, str]:
    """Return (field path, message) of the first message in a DRF error structure."""
    if isinstance(data, dict):
        for key, value in data.items():
            name = None if key in ("non_field_errors", "detail") else key
            path = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return _first_error(value, path)
    if isinstance(data, list) and data:
        return _first_error(data[0], prefix)
    return prefix, str(data)


def error_body(exc: ConchError) -> dict[str, Any]:
    """The `{"detail", "field"}` body of one of our errors, with `quota` for a refused quota, the users of an
    object still in use under the field's name, and the object a refused duplicate would copy under its
    `existing_name` (e.g. `existing_version`)."""
    body: dict[str, Any] = {"detail": exc.detail, "field": exc.field}
    if isinstance(exc, QuotaExceeded):
        body["quota"] = exc.quota
    elif isinstance(exc, InUse):
        body[exc.field] = exc.users
    elif isinstance(exc, Duplicate):
        body[exc.existing_name] = exc.existing
    return body


def exception_handler(exc: Exception, context: dict) -> Response | None:
    """Render `exc` as `{"detail", "field"}` with its status code; None lets Django answer 500.

    The body is JSON even where the view renders something else (the schema's YAML): a refusal such as a rate
    limit's 429 must keep its sentence."""
    request = context.get("request")
    if request is not None:
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
    if isinstance(exc, ConchError):
        body = error_body(exc)
        if exc.refusals:
            body["errors"] = [error_body(refusal) for refusal in exc.refusals]
        headers = {"Retry-After": str(exc.retry_after_seconds)} if isinstance(exc, RateLimited) else None
        return Response(body, status=exc.status_code, headers=headers)
    if isinstance(exc, RequestDataTooBig):
        # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE) on a body read into memory or on the form fields of a
        # multipart body; whole bodies over their view's limit were refused before (RequestBodyLimitMiddleware).
        limit = INFERENCE_BODY.max_bytes()
        detail = (
            f"The request's data held in memory is larger than the {describe_bytes(limit)} ({limit} bytes) this "
            f"endpoint accepts; send less data per request (an administrator sets the limit with "
            f"{INFERENCE_BODY.variable})."
        )
        return Response({"detail": detail, "field": None}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, exceptions.NotAuthenticated):
        auth_header = getattr(exc, "auth_header", None)
        exc = exceptions.NotAuthenticated(
            "Send an API token as 'Authorization: Bearer <token>'; create one on your team's page in the console "
            "or with POST /api/v1/tokens/ (an operator can also run 'python manage.py create_token <username>')."
        )
        exc.auth_header = auth_header  # DRF turns it into the WWW-Authenticate header
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found, or not visible to your teams.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_error(exc.detail)
        if field:
            message = f"{field}: {message}"
        response.data = {"detail": message, "field": field}
        response.status_code = status.HTTP_400_BAD_REQUEST
    else:
        detail = response.data.get("detail") if isinstance(response.data, dict) else response.data
        response.data = {"detail": str(detail), "field": None}
    return response


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit=&offset=` pagination whose values are checked, not silently replaced.

    `limit` is 1..MAX_PAGE_SIZE (default REST_FRAMEWORK["PAGE_SIZE"]), `offset` 0..MAX_OFFSET (default 0); a
    blank value means the default. Anything else (not a whole number, out of range) raises `InvalidInput`
    naming the parameter (400): DRF's own class ignores bad values and passes any limit to the database, where a
    page size past its integer range was a 500.
    """

    max_limit = MAX_PAGE_SIZE

    def get_limit(self, request: Request) -> int:
        return _bounded_whole_number(request, self.limit_query_param, self.default_limit, 1, MAX_PAGE_SIZE)

    def get_offset(self, request: Request) -> int:
        return _bounded_whole_number(request, self.offset_query_param, 0, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, MAX_PAGE_SIZE), self.offset_query_param: (0, MAX_OFFSET)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"].update({"minimum": low, "maximum": high})
        return parameters


def _bounded_whole_number(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    if not _WHOLE_NUMBER.fullmatch(raw) or not low <= int(raw) <= high:
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        raise InvalidInput(f"{name} must be a whole number from {low} to {high}, got {shown!r}.", field=name)
    return int(raw)


class OptionalSlashRouter(SimpleRouter):
    """A router whose routes match with or without a trailing slash.

    The documented paths mix both forms (`/api/v1/deployments/` and
    `/api/v1/deployments/{id}/infer`); a POST must never hit an APPEND_SLASH redirect.
    """

    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"


class ErrorSerializer(serializers.Serializer):
    """Every error body of the API (for the OpenAPI schema)."""

    detail = serializers.CharField(help_text="What went wrong and what to do.")
    field = serializers.CharField(allow_null=True, help_text="The input at fault, or null.")


class QuotaUseSerializer(serializers.Serializer):
    """The numbers of a refused quota (for the OpenAPI schema)."""

    limit = serializers.IntegerField(help_text="The team's limit, in the quota's unit.")
    used = serializers.IntegerField(help_text="What the team uses now.")
    requested = serializers.IntegerField(help_text="What the request needs.")


class RefusalSerializer(ErrorSerializer):
    """One refusal of a check that reports all of them (for the OpenAPI schema)."""

    quota = QuotaUseSerializer(required=False, help_text="Present when a team quota has no room.")


class RefusalsSerializer(RefusalSerializer):
    """The error body of a check that reports every refusal at once (for the OpenAPI schema): the first
    refusal's `detail`, `field` (and `quota`), as when it is the only one, plus all of them under `errors`."""

    errors = RefusalSerializer(
        many=True, help_text="Every refusal, the first one (the body's own) included, in the order checked."
    )


class ExistingVersionSerializer(serializers.Serializer):
    """The version a refused duplicate upload would copy (for the OpenAPI schema)."""

    id = serializers.IntegerField(help_text="The version's id (GET /api/v1/versions/{id}/).")
    number = serializers.IntegerField(help_text="Its number in its model.")
    status = serializers.CharField(help_text="uploading, queued, building, built or failed.")


class DuplicateVersionErrorSerializer(ErrorSerializer):
    """The 409 body of an upload whose file already is a version of the model (for the OpenAPI schema)."""

    existing_version = ExistingVersionSerializer(
        required=False, help_text="Present when the file (its sha256) already is this version of the model."
    )


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents `Authorization: Bearer <token>` in the OpenAPI schema (Swagger's Authorize dialog)."""

    target_class = "tenancy.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A Conch API token: from your team's page in the console, POST /api/v1/tokens/, or "
            "`python manage.py create_token <username>`.",
        }


class HeaderCsrfSessionScheme(OpenApiAuthenticationExtension):
    """The session authentication of the views that stream their body is a browser session, like DRF's."""

    target_class = "conch.authentication.HeaderCsrfSessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}

"""Session authentication for API views that stream their request body.

DRF's `SessionAuthentication` runs Django's CSRF check, which reads `request.POST` and so parses the body before
the view runs. A view that streams its body (`conch.upload_handlers`, a resumable upload's part) authenticates
browser sessions with `HeaderCsrfSessionAuthentication` instead: the same check, the token from the header only.
"""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from rest_framework.authentication import SessionAuthentication


class _BodylessRequest:
    """The Django request as the CSRF check sees it: same headers, cookies and session, empty POST."""

    def __init__(self, request: Any) -> None:
        object.__setattr__(self, "_wrapped", request)

    @property
    def POST(self) -> QueryDict:  # noqa: N802 - the attribute Django's CSRF check reads
        return QueryDict()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._wrapped, name, value)


class HeaderCsrfSessionAuthentication(SessionAuthentication):
    """Session authentication whose CSRF check never reads the request body.

    Django's check would read `request.POST` for the `csrfmiddlewaretoken` field and so parse a
    multipart upload before the view installs `ObjectStoreUploadHandler`. This runs the same
    check (cookie, Origin/Referer, token format and match) but takes the token from the
    `X-CSRFToken` header (settings.CSRF_HEADER_NAME) only. Raises PermissionDenied (403) on failure.
    """

    def enforce_csrf(self, request: Any) -> None:
        """Run Django's CSRF check on the request with its body hidden."""
        django_request = getattr(request, "_request", request)
        super().enforce_csrf(_BodylessRequest(django_request))

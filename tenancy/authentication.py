"""DRF authentication by `Authorization: Bearer <token>`, and the token scope every read needs."""

from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from conch.errors import Unauthenticated
from tenancy.choices import Scope
from tenancy.services import authenticate_token, require_scope


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Accept `Authorization: Bearer conch_…` tokens; `request.auth` is then the token's `TokenGrant`."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0].lower() != self.keyword.lower():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <token>'.")
        try:
            return authenticate_token(raw=parts[1])
        except Unauthenticated as exc:
            raise exceptions.AuthenticationFailed(exc.detail) from None

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsAuthenticatedWithReadScope(permissions.IsAuthenticated):
    """Any signed-in caller; a token must also carry the `read` scope for GET/HEAD/OPTIONS.

    Writes check their own scope in the services (`tenancy.services.require_role`).
    """

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        if request.method in permissions.SAFE_METHODS:
            require_scope(token=request.auth, scope=Scope.READ, action="Reading")
        return True

"""DRF authentication by `Authorization: Bearer <token>`."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from tenancy.services import authenticate_token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Accept `Authorization: Bearer conch_…` tokens made by `manage.py create_token`."""

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
        user = authenticate_token(raw=parts[1])
        if user is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token; create one with manage.py create_token.")
        return (user, None)

    def authenticate_header(self, request) -> str:
        return self.keyword

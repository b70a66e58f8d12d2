"""The answer to a sign-in while its username and client address are locked out (django-axes).

django-axes counts failed sign-ins on the console's `/accounts/login/` and the admin's login per (username, client
address) and, past AXES_FAILURE_LIMIT (CONCH_LOGIN_FAILURE_LIMIT), refuses that pair for AXES_COOLOFF_TIME
(CONCH_LOGIN_COOLOFF_SECONDS) from its last recorded failure. Its middleware then asks `lockout_response` (the
AXES_LOCKOUT_CALLABLE setting) for the page: 429 with `Retry-After` and a sentence saying when to try again.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone


def lockout_ends_at(*, username: str | None, ip_address: str | None, cool_off: timedelta) -> datetime:
    """When the lockout of (`username`, `ip_address`) ends: its last recorded failure plus `cool_off` (now plus
    `cool_off` when no failure is recorded)."""
    last = AccessAttempt.objects.filter(username=username, ip_address=ip_address).aggregate(Max("attempt_time"))
    return (last["attempt_time__max"] or timezone.now()) + cool_off


def describe_wait(seconds: int) -> str:
    """`seconds` (at least 1) as "45 s" under a minute, else whole minutes rounded up ("15 min")."""
    return f"{seconds} s" if seconds < 60 else f"{math.ceil(seconds / 60)} min"


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """Render the sign-in-locked page: HTTP 429, `Retry-After` in seconds, and when to try again in words."""
    username = get_client_username(request, credentials)
    ip_address = getattr(request, "axes_ip_address", None)
    ends_at = lockout_ends_at(username=username, ip_address=ip_address, cool_off=get_cool_off(request))
    seconds = max(1, math.ceil((ends_at - timezone.now()).total_seconds()))
    message = (
        f"Too many failed sign-ins for '{username or ''}' from your address ({ip_address}): signing in as this user "
        f"from here is locked until {ends_at:%Y-%m-%d %H:%M:%S} UTC. Try again in {describe_wait(seconds)}."
    )
    response = render(request, "registration/locked_out.html", {"message": message}, status=429)
    response["Retry-After"] = str(seconds)
    return response

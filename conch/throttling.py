"""Rate limits of the REST API: one request budget per API token, per console user and per client address.

`CallerRateThrottle` is the DRF throttle of every API view (REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]). The
caller is, in this order: the API token of the request (`request.auth`, a `TokenGrant`), the signed-in user of a
console session, or the client address (REMOTE_ADDR) of a request without credentials. Its rate is read from
`settings.CONCH_API_RATES` at each request ("600/minute"; tests change it with pytest-django's `settings`).
Inference through the API (`POST /api/v1/deployments/{id}/infer`) spends a budget of its own, so an application's
inferences do not starve its pipeline's control calls, nor the other way round: a token's is its inference gateway
limit, shared with the gateway (`deployments.services.inference`); a console session's is
CONCH_API_RATES["inference"] (`InferenceRateThrottle`).

Requests are counted in fixed windows of the rate's period (a minute for "600/minute"), one atomic counter per
caller and window in the shared cache (`settings.CACHES["default"]`: Redis in production, so every web process
and host counts together); a counter expires with its window. A fixed window lets a caller send up to twice the
rate across a window boundary, never more. Requests DRF refuses before throttling (an unknown token's 401, a
missing permission) are not counted.

Over the budget the request is refused with `RateLimited` (429) saying the rate, whose budget it is and when to
retry; the API's exception handler turns `retry_after_seconds` into the `Retry-After` header. When the cache
cannot be reached the request passes, logged as `api.rate_limit.cache_unavailable`: the limit protects the
service, and an outage of Redis must not take the whole API down with it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from conch.errors import RateLimited

log = logging.getLogger(__name__)

PERIOD_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


@dataclass(frozen=True)
class Rate:
    """`count` requests per `unit` (a key of PERIOD_SECONDS)."""

    count: int
    unit: str

    @property
    def period_seconds(self) -> int:
        return PERIOD_SECONDS[self.unit]

    def __str__(self) -> str:
        return f"{self.count} requests/{self.unit}"


def parse_rate(text: str) -> Rate:
    """Parse "600/minute" (a positive count, then second, minute, hour or day). Raises ValueError naming the text."""
    count, _, unit = text.partition("/")
    if not count.isascii() or not count.isdigit() or int(count) < 1 or unit not in PERIOD_SECONDS:
        raise ValueError(f"{text!r} is not a rate such as '600/minute'")
    return Rate(count=int(count), unit=unit)


@dataclass(frozen=True)
class Caller:
    """Whose budget a request spends: `kind` ("token", "user" or "anonymous"), a key part and words for errors."""

    kind: str
    ident: str
    described: str


def caller_of(request: Request) -> Caller:
    """The budget a request spends: its API token's, else its session user's, else its client address's."""
    grant = getattr(request, "auth", None)
    prefix = getattr(grant, "prefix", None)
    if prefix is not None:
        return Caller(kind="token", ident=str(grant.id), described=f"token {prefix}…")
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Caller(kind="user", ident=str(user.pk), described=f"user '{user.get_username()}'")
    address = request.META.get("REMOTE_ADDR") or "unknown"
    return Caller(kind="anonymous", ident=address, described=f"client address {address}")


def count_request(key: str, *, timeout_seconds: int) -> int:
    """Add one to the counter `key` in the default cache and return its new value; a new counter lives
    `timeout_seconds`. Atomic on Redis (SET NX, then INCR), so concurrent web processes never lose a count."""
    if cache.add(key, 1, timeout=timeout_seconds):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # the counter expired between the two calls: this request opens the next one
        cache.add(key, 1, timeout=timeout_seconds)
        return 1


class CallerRateThrottle(BaseThrottle):
    """Refuse a request with RateLimited (429) once its caller's budget for the current window is spent."""

    #: Names the budget in cache keys; `described_budget` names it in the refusal.
    budget = "api"
    described_budget = ""

    def rate_for(self, caller: Caller) -> Rate:
        """The rate of `caller`'s budget: CONCH_API_RATES of its kind."""
        return parse_rate(settings.CONCH_API_RATES[caller.kind])

    def allow_request(self, request: Request, view: object) -> bool:
        caller = caller_of(request)
        rate = self.rate_for(caller)
        period = rate.period_seconds
        now = time.time()
        window = int(now // period)
        window_end = (window + 1) * period
        key = f"{self.budget}-rate:{caller.kind}:{caller.ident}:{period}:{window}"
        try:
            count = count_request(key, timeout_seconds=math.ceil(window_end - now) + 1)
        except Exception as error:  # the cache backend's own errors (redis-py's): let the request through
            log.warning("api.rate_limit.cache_unavailable", extra={"error": str(error), "caller": caller.kind})
            return True
        if count <= rate.count:
            return True
        retry = max(1, math.ceil(window_end - now))
        raise RateLimited(
            f"Rate limit of {rate}{self.described_budget} for {caller.described} reached; retry in {retry} s.",
            retry_after_seconds=retry,
        )


class InferenceRateThrottle(CallerRateThrottle):
    """The budget of inference requests through the API of a console session (or an anonymous caller):
    CONCH_API_RATES["inference"]. A token's inference requests are limited where the gateway's are, by the
    token's requests per minute (`deployments.services.inference`): one limit whichever edge they use."""

    budget = "inference"
    described_budget = " of inference"

    def allow_request(self, request: Request, view: object) -> bool:
        if caller_of(request).kind == "token":
            return True
        return super().allow_request(request, view)

    def rate_for(self, caller: Caller) -> Rate:
        return parse_rate(settings.CONCH_API_RATES["inference"])

"""The per-request rules every inference edge shares: who may call (routes, cached), how often (the per-token rate
limit), what they used (the usage meter) and which Triton answers (the server pick).

The gateway's HTTP edge (`deployments.api.gateway`, ASGI), its gRPC edge (`deployments.api.grpc_gateway`,
`grpc.aio`) and any other edge that takes inference requests use one `Serving` per process, so a token's
requests count against one limit and land in one usage row whichever protocol carries them. Nothing here knows
HTTP or gRPC: an edge turns its request into (authorization, team, deployment), asks `Serving.admit` for the
`Route`, picks a server with `Serving.picker`, relays, and counts what passed with `Serving.usage.count`.

Per request and in the steady state this does no database query: a (token, team, deployment) route is resolved
once (`deployments.services.gateway.resolve_route`, on a worker thread) and kept for
`CONCH_GATEWAY_ROUTE_CACHE_SECONDS`; the rate limit is counted in memory and synced with Redis every
`RateLimiter.SYNC_INTERVAL_S`; usage is written every `CONCH_GATEWAY_USAGE_FLUSH_SECONDS`
(`record_gateway_usage`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from conch.errors import ConchError, Unauthenticated
from deployments.services.gateway import Route, UsageCounts, record_gateway_usage, resolve_route, today

if TYPE_CHECKING:
    import datetime as dt

    from redis.asyncio import Redis

log = logging.getLogger(__name__)

__all__ = [
    "MAX_CACHED_ROUTES",
    "MAX_SERVERS_TRIED",
    "RateLimiter",
    "RouteCache",
    "ServerPicker",
    "Serving",
    "TooManyRequests",
    "UsageKey",
    "UsageMeter",
    "bearer_token",
    "gateway_redis_url",
]

#: Servers one request may be tried on when the first cannot be reached (nothing was sent to it).
MAX_SERVERS_TRIED = 3
#: Routes (and refusals) kept at most; the oldest half is dropped past it.
MAX_CACHED_ROUTES = 10_000

#: (token id, team id, deployment id, UTC day): the key usage is counted under.
UsageKey = tuple[int, int, int, "dt.date"]


class TooManyRequests(ConchError):
    """A token is past its requests per minute (429; gRPC RESOURCE_EXHAUSTED). `retry_after_s`: whole seconds
    until its window ends."""

    status_code = 429

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


def bearer_token(authorization: str) -> str:
    """The raw token of an `Authorization` value `Bearer conch_…` (scheme case-insensitive). Raises
    Unauthenticated (401) naming how to send one when the value is missing or has another scheme."""
    scheme, _, raw = authorization.partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise Unauthenticated(
            "Send a Conch API token with the infer scope as 'Authorization: Bearer conch_…' (POST /api/v1/tokens/)."
        )
    return raw


def gateway_redis_url() -> str:
    """The Redis URL the rate limiter syncs through (CONCH_GATEWAY_REDIS_URL, else the broker's when it is a Redis
    URL); "" when there is none (each process then counts alone)."""
    url = settings.CONCH_GATEWAY_REDIS_URL or settings.CELERY_BROKER_URL
    return url if url.startswith(("redis://", "rediss://", "unix://")) else ""


class RouteCache:
    """(token, team, deployment) -> `Route` or the refusal (a ConchError), each kept `ttl_s` seconds (default
    CONCH_GATEWAY_ROUTE_CACHE_SECONDS, read when an entry is stored). Concurrent requests for one key that is not
    cached wait on one resolution. Async: call it on the edge's event loop."""

    def __init__(self, *, ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        #: key (token sha256, team slug, deployment name) -> (expires at, by `clock`; what was found).
        self.entries: dict[tuple[str, str, str], tuple[float, Route | ConchError]] = {}
        self._resolving: dict[tuple[str, str, str], asyncio.Future[Route | ConchError]] = {}

    async def resolve(self, raw_token: str, team: str, deployment: str) -> Route:
        """The route of `raw_token` to `team`/`deployment`. Raises what `resolve_route` raises (Unauthenticated,
        NotFound, Forbidden), from the cache while the refusal is kept."""
        key = (hashlib.sha256(raw_token.encode()).hexdigest(), team, deployment)
        cached = self.entries.get(key)
        if cached is not None and cached[0] > self._clock():
            return _raise_or_return(cached[1])
        pending = self._resolving.get(key)
        if pending is not None:
            return _raise_or_return(await pending)
        pending = asyncio.get_running_loop().create_future()
        self._resolving[key] = pending
        try:
            found = await sync_to_async(_resolve, thread_sensitive=True)(raw_token, team, deployment)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: waiters, if any, get it through `await pending`
            raise
        finally:
            self._resolving.pop(key, None)
        if len(self.entries) >= MAX_CACHED_ROUTES:
            for old in list(self.entries)[: MAX_CACHED_ROUTES // 2]:
                self.entries.pop(old, None)
        ttl = settings.CONCH_GATEWAY_ROUTE_CACHE_SECONDS if self._ttl_s is None else self._ttl_s
        self.entries[key] = (self._clock() + ttl, found)
        pending.set_result(found)
        return _raise_or_return(found)

    def forget(self, route: Route) -> None:
        """Drop every cached route to `route`'s deployment (a server of it did not answer): the next request
        resolves it afresh, listing the ready servers again."""
        for key, (_, found) in list(self.entries.items()):
            if isinstance(found, Route) and found.deployment_id == route.deployment_id:
                self.entries.pop(key, None)


class ServerPicker:
    """Round-robin over a route's ready servers, per deployment, shared by every protocol (an HTTP request and a
    gRPC one take the next turn of the same counter). Thread-safe enough: `itertools.count` is atomic in
    CPython."""

    def __init__(self) -> None:
        #: deployment id -> its turn counter.
        self.turns: dict[int, itertools.count[int]] = {}

    def _turn(self, route: Route) -> int:
        return next(self.turns.setdefault(route.deployment_id, itertools.count()))

    def next_http(self, route: Route) -> tuple[str, str]:
        """(KServe v2 HTTP base URL, restricted-endpoint key) of the server whose turn it is. `route.servers`
        must not be empty (`plan_request` refuses that case first)."""
        return route.servers[self._turn(route) % len(route.servers)]

    def next_grpc(self, route: Route) -> tuple[str, str, str]:
        """(gRPC `host:port`, restricted-endpoint key, KServe v2 base URL) of the server whose turn it is.
        `route.grpc_servers` must not be empty."""
        return route.grpc_servers[self._turn(route) % len(route.grpc_servers)]


class RateLimiter:
    """Fixed one-minute windows per token, shared by every gateway process through Redis without a round trip
    per request: each process counts locally, and every `SYNC_INTERVAL_S` adds its new counts to the window's
    total in Redis (INCRBY) and reads back what all processes counted. A token may so pass its limit by what
    other processes admitted since the last sync (at most a tenth of a second of its traffic). Without Redis the
    count is this process's alone; when Redis cannot be reached the process goes on with its own counts and
    logs a warning at most once a minute. `clock` gives the time in seconds since the epoch (the windows follow
    it; tests give one they set)."""

    SYNC_INTERVAL_S = 0.1

    def __init__(self, redis_url: str, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._redis: Redis | None = None
        if redis_url:
            import redis.asyncio as redis_asyncio

            self._redis = redis_asyncio.Redis.from_url(redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._window = 0
        self._shared: dict[str, int] = {}  # token -> the window's total as last known (all processes)
        self._pending: dict[str, int] = {}  # token -> admitted here since the last sync
        self._sending: dict[str, int] = {}  # token -> admitted here, being added to Redis by the running sync
        self._warned_at = 0.0
        self._syncer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start syncing with Redis every SYNC_INTERVAL_S (on the running event loop); nothing without Redis."""
        if self._redis is not None and self._syncer is None:
            self._syncer = asyncio.create_task(self._sync_periodically())

    def admit(self, route: Route) -> None:
        """Count one request of `route`'s token; raise `TooManyRequests` (429) past its requests per minute."""
        now = self._clock()
        window = int(now // 60)
        if window != self._window:
            self._window, self._shared, self._pending, self._sending = window, {}, {}, {}
        token = f"{route.token_id}:{route.token_prefix}"
        pending = self._pending.get(token, 0)
        if self._shared.get(token, 0) + self._sending.get(token, 0) + pending >= route.requests_per_minute:
            retry = max(1, math.ceil((window + 1) * 60 - now))
            raise TooManyRequests(
                f"Rate limit of {route.requests_per_minute} requests/minute for token {route.token_prefix}… "
                f"reached; retry in {retry} s.",
                retry_after_s=retry,
            )
        if self._redis is None:
            self._shared[token] = self._shared.get(token, 0) + 1
        else:
            self._pending[token] = pending + 1

    async def _sync_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.SYNC_INTERVAL_S)
            await self.sync()

    async def sync(self) -> None:
        """Add this process's new counts to Redis and read back every process's totals for them."""
        if self._redis is None or not self._pending:
            return
        window, pending = self._window, self._pending
        # Until Redis answers, what is being sent still counts (admit reads it), or requests arriving meanwhile
        # would be checked against a total that lacks it.
        self._pending, self._sending = {}, pending
        keys = list(pending)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for token in keys:
                    key = f"conch:gateway:rate:{settings.CONCH_INSTANCE_ID}:{token}:{window}"
                    pipe.incrby(key, pending[token])
                    pipe.expire(key, 120)
                answers = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - any Redis trouble: count locally, and say so
            if window == self._window:
                self._sending = {}
                for token, count in pending.items():
                    self._shared[token] = self._shared.get(token, 0) + count
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                log.warning("gateway.rate_limit.unavailable", extra={"error": str(exc)})
            return
        if window == self._window:
            self._sending = {}
            for token, total in zip(keys, answers[::2], strict=True):
                self._shared[token] = int(total)

    async def close(self) -> None:
        """Stop syncing, send what is pending, close the Redis connection."""
        if self._syncer is not None:
            self._syncer.cancel()
            self._syncer = None
        await self.sync()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


class UsageMeter:
    """Usage counted in memory per (token, team, deployment, UTC day) and added to the stored totals in batches
    (`record_gateway_usage`). `count` may be called from any thread; `flush` is async (the database write runs on
    a worker thread) and `flush_blocking` is for code that is not on an event loop. Counts a failed write could
    not store are kept for the next one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[UsageKey, UsageCounts] = {}

    @property
    def pending(self) -> dict[UsageKey, UsageCounts]:
        """What was counted and not written yet (a copy)."""
        with self._lock:
            return dict(self._pending)

    def count(self, route: Route, counts: UsageCounts) -> None:
        """Add `counts` to `route`'s token and deployment, today (UTC)."""
        key = (route.token_id, route.team_id, route.deployment_id, today())
        with self._lock:
            held = self._pending.get(key)
            if held is None:
                self._pending[key] = held = UsageCounts()
            held.add(counts)

    def _take(self) -> dict[UsageKey, UsageCounts]:
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def _keep(self, taken: dict[UsageKey, UsageCounts], exc: Exception) -> None:
        log.warning("gateway.usage.flush_failed", extra={"error": str(exc), "keys": len(taken)})
        with self._lock:
            for key, counts in taken.items():
                self._pending.setdefault(key, UsageCounts()).add(counts)

    async def flush(self) -> None:
        """Write what was counted (one statement per key, on a worker thread)."""
        taken = self._take()
        if not taken:
            return
        try:
            await sync_to_async(_record_usage, thread_sensitive=True)(taken)
        except Exception as exc:  # noqa: BLE001 - the database is away: keep the counts for the next try
            self._keep(taken, exc)

    def flush_blocking(self) -> None:
        """`flush` for a caller that is not on an event loop (a worker thread of a WSGI server)."""
        taken = self._take()
        if not taken:
            return
        try:
            record_gateway_usage(counts=taken)
        except Exception as exc:  # noqa: BLE001 - the database is away: keep the counts for the next try
            self._keep(taken, exc)

    async def flush_periodically(self, interval_s: float) -> None:
        """`flush` every `interval_s` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()


class Serving:
    """One process's shared serving state: `routes` (RouteCache), `limiter` (RateLimiter), `usage` (UsageMeter)
    and `picker` (ServerPicker). Every edge of the process is given the same instance. `start()` and `stop()` run
    on the event loop the edges serve on; `start` is idempotent."""

    def __init__(self, *, redis_url: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.routes = RouteCache()
        self.limiter = RateLimiter(gateway_redis_url() if redis_url is None else redis_url, clock=clock)
        self.usage = UsageMeter()
        self.picker = ServerPicker()
        self._flusher: asyncio.Task[None] | None = None
        self._users = 0

    @property
    def started(self) -> bool:
        """Whether `start` ran (and `stop` has not ended it)."""
        return self._users > 0

    async def start(self) -> None:
        """Start the limiter's Redis sync and the periodic usage flush; each edge calls it (counted: the last
        `stop` ends them)."""
        self._users += 1
        if self._users > 1:
            return
        self.limiter.start()
        self._flusher = asyncio.create_task(self.usage.flush_periodically(settings.CONCH_GATEWAY_USAGE_FLUSH_SECONDS))

    async def stop(self) -> None:
        """Undo one `start`; the last one flushes the usage and closes the limiter."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        await self.usage.flush()
        await self.limiter.close()

    async def route(self, authorization: str, team: str, deployment: str) -> Route:
        """The route for a request carrying `authorization` (`Bearer conch_…`) to `team`/`deployment`. Raises
        Unauthenticated (401), NotFound (404: no such running deployment this token can use, the same for another
        team's) or Forbidden (403: scope or role). The edge then calls `limiter.admit(route)`, so that a refusal
        for the rate limit is counted in the usage as an error."""
        return await self.routes.resolve(bearer_token(authorization), team, deployment)


def _resolve(raw: str, team: str, deployment: str) -> Route | ConchError:
    """`resolve_route` on a worker thread, with Django's connection hygiene; a refusal is returned, to be cached."""
    close_old_connections()
    try:
        return resolve_route(raw_token=raw, team_slug=team, name=deployment)
    except ConchError as exc:
        return exc
    finally:
        close_old_connections()


def _record_usage(pending: dict[UsageKey, UsageCounts]) -> None:
    close_old_connections()
    try:
        record_gateway_usage(counts=pending)
    finally:
        close_old_connections()


def _raise_or_return(found: Route | ConchError) -> Route:
    if isinstance(found, ConchError):
        raise found
    return found

"""The gateway's per-token rate limit shared by several gateway processes through the real Redis of the tests."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from django.conf import settings

from deployments.services.gateway import Route
from deployments.services.serving import RateLimiter, TooManyRequests


def _route(limit: int) -> Route:
    return Route(
        token_id=1,
        token_prefix=f"conch_{secrets.token_hex(3)}",  # a key of its own in the shared Redis
        team_id=1,
        deployment_id=1,
        deployment_name="adder",
        model_name="adder",
        ready=True,
        batching=True,
        servers=(("http://127.0.0.1:1", ""),),
        requests_per_minute=limit,
    )


class _Clock:
    """A clock for `RateLimiter` that moves only when the test sets `now` (seconds since the epoch); it starts 10 s
    into a minute, so no window ends during a test unless the test moves it."""

    def __init__(self) -> None:
        self.now = 1_800_000_010.0

    def __call__(self) -> float:
        return self.now


def test_two_gateway_processes_share_one_limit_through_redis():
    route = _route(5)
    clock = _Clock()

    async def run() -> list[str]:
        first = RateLimiter(settings.CELERY_BROKER_URL, clock=clock)
        second = RateLimiter(settings.CELERY_BROKER_URL, clock=clock)
        outcomes = []
        try:
            for limiter, count in ((first, 3), (second, 2)):
                for _ in range(count):
                    limiter.admit(route)
                await limiter.sync()
            for limiter in (first, second):
                try:
                    limiter.admit(route)
                    outcomes.append("admitted")
                except TooManyRequests as exc:
                    outcomes.append(exc.detail)
                await limiter.sync()
        finally:
            await first.close()
            await second.close()
        return outcomes

    outcomes = asyncio.run(run())
    # the second process learnt the first one's 3 when it synced its own 2; the first learns of the 5 when it
    # syncs the request it let through (one sync interval of overshoot at most)
    assert outcomes[1].startswith(f"Rate limit of 5 requests/minute for token {route.token_prefix}… reached")
    assert outcomes[0] == "admitted"


def test_without_redis_a_process_counts_alone():
    route = _route(2)
    limiter = RateLimiter("", clock=_Clock())
    limiter.admit(route)
    limiter.admit(route)
    with pytest.raises(TooManyRequests) as refused:
        limiter.admit(route)
    assert refused.value.retry_after_s == 50


def test_a_new_minute_counts_afresh_and_a_refusal_gives_the_seconds_left_in_the_minute():
    # given a token with 2 requests per minute that used both 10 s into a minute
    route = _route(2)
    clock = _Clock()
    limiter = RateLimiter("", clock=clock)
    limiter.admit(route)
    limiter.admit(route)
    # when it asks again 45.5 s into that minute, then it is told to retry in 15 s (rounded up)
    clock.now += 35.5
    with pytest.raises(TooManyRequests) as refused:
        limiter.admit(route)
    assert refused.value.retry_after_s == 15
    assert "retry in 15 s" in refused.value.detail
    # when the next minute starts, then it has 2 requests again, and a third is refused for 60 s
    clock.now += 14.5
    limiter.admit(route)
    limiter.admit(route)
    with pytest.raises(TooManyRequests) as again:
        limiter.admit(route)
    assert again.value.retry_after_s == 60


def test_an_unreachable_redis_falls_back_to_local_counts():
    route = _route(2)

    async def run() -> None:
        limiter = RateLimiter("redis://127.0.0.1:1/0")
        try:
            limiter.admit(route)
            limiter.admit(route)
            await limiter.sync()  # fails: the counts stay known here
            with pytest.raises(TooManyRequests):
                limiter.admit(route)
        finally:
            limiter._redis = None  # nothing to close
            await limiter.close()

    asyncio.run(run())


def test_requests_that_arrive_while_a_sync_waits_for_redis_count_what_it_is_sending():
    route = _route(3)

    async def run() -> tuple[bool, int]:
        limiter = RateLimiter(settings.CELERY_BROKER_URL)
        try:
            for _ in range(3):
                limiter.admit(route)
            syncing = asyncio.create_task(limiter.sync())
            await asyncio.sleep(0)  # the sync has taken the three counts and waits for Redis's answer
            try:
                limiter.admit(route)
                refused_meanwhile = False
            except TooManyRequests:
                refused_meanwhile = True
            await syncing
            return refused_meanwhile, limiter._shared[f"{route.token_id}:{route.token_prefix}"]
        finally:
            await limiter.close()

    assert asyncio.run(run()) == (True, 3)

"""Abuse and bad input: sign-in lockout, API rate limits, bounded pages, request body limits per endpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from axes.models import AccessAttempt
from django.core import checks
from django.test import Client

from conch.throttling import parse_rate
from tenancy.models import ApiToken
from tests.conch.conftest import TwoTeams
from tests.conch.test_idor_sweep import METHODS, Route, fill
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent.parent
PASSWORD = "pw-for-tests-1"  # tests.factories.UserFactory's


def _sign_in(client: Client, username: str, password: str, path: str = "/accounts/login/", **extra):
    return client.post(path, {"username": username, "password": password}, **extra)


def _fresh_window(period_seconds: int, margin_seconds: float = 10.0) -> None:
    """Wait for the next rate window when the current one ends within `margin_seconds`, so a test's requests all
    fall in one window (rates in these tests are per hour: this rarely waits)."""
    left = period_seconds - time.time() % period_seconds
    if left < margin_seconds:
        time.sleep(left + 0.05)


# --- Sign-in lockout (django-axes) ---------------------------------------------------------------------------


def test_sign_in_locks_after_the_failure_limit_and_says_when_to_retry(settings):
    # given a user and a limit of 3 failures with a 900 s cool-off
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(seconds=900)
    UserFactory(username="alice")
    browser = Client()
    # when two wrong passwords are sent, then a third
    first = [_sign_in(browser, "alice", "wrong").status_code for _ in range(2)]
    third = _sign_in(browser, "alice", "wrong")
    # and then the right one
    locked = _sign_in(browser, "alice", PASSWORD)

    # then the first two get the form again, the third and the right password get 429 saying when to retry
    assert first == [200, 200]
    for response in (third, locked):
        assert response.status_code == 429
        retry = int(response["Retry-After"])
        assert 890 <= retry <= 900
        page = response.content.decode()
        assert "Too many failed sign-ins for &#x27;alice&#x27; from your address (127.0.0.1)" in page
        assert re.search(r"locked until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\. Try again in 15 min\.", page)
    assert "_auth_user_id" not in browser.session
    assert AccessAttempt.objects.get(username="alice").failures_since_start == 3


def test_a_lockout_holds_one_username_from_one_address_only(settings):
    # given alice locked out from 127.0.0.1
    settings.AXES_FAILURE_LIMIT = 2
    UserFactory(username="alice")
    UserFactory(username="bob")
    for _ in range(2):
        _sign_in(Client(), "alice", "wrong")
    assert _sign_in(Client(), "alice", PASSWORD).status_code == 429
    # when alice signs in from another address, and bob from the same one
    elsewhere = _sign_in(Client(), "alice", PASSWORD, REMOTE_ADDR="10.9.8.7")
    neighbour = _sign_in(Client(), "bob", PASSWORD)
    # then both get in
    assert elsewhere.status_code == 302 and elsewhere["Location"] == "/"
    assert neighbour.status_code == 302


def test_the_admin_sign_in_is_locked_out_too(settings):
    settings.AXES_FAILURE_LIMIT = 2
    UserFactory(username="operator", is_staff=True)
    for _ in range(2):
        _sign_in(Client(), "operator", "wrong", path="/admin/login/")
    response = _sign_in(Client(), "operator", PASSWORD, path="/admin/login/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "Too many failed sign-ins for &#x27;operator&#x27;" in response.content.decode()


def test_sign_in_works_again_after_the_cool_off(settings):
    # given alice locked out
    settings.AXES_FAILURE_LIMIT = 2
    settings.AXES_COOLOFF_TIME = timedelta(seconds=900)
    UserFactory(username="alice")
    for _ in range(2):
        _sign_in(Client(), "alice", "wrong")
    assert _sign_in(Client(), "alice", PASSWORD).status_code == 429
    # when her last failure is 901 s old
    AccessAttempt.objects.filter(username="alice").update(
        attempt_time=AccessAttempt.objects.get(username="alice").attempt_time - timedelta(seconds=901)
    )
    # then she gets in
    assert _sign_in(Client(), "alice", PASSWORD).status_code == 302


def test_a_good_sign_in_clears_the_failures(settings):
    settings.AXES_FAILURE_LIMIT = 3
    UserFactory(username="alice")
    for _ in range(2):
        _sign_in(Client(), "alice", "wrong")
    assert _sign_in(Client(), "alice", PASSWORD).status_code == 302
    for _ in range(2):
        assert _sign_in(Client(), "alice", "wrong").status_code == 200
    assert _sign_in(Client(), "alice", PASSWORD).status_code == 302


def test_axes_is_installed_the_way_its_checks_ask(settings):
    # the lockout backend first, the middleware present (django-axes' own system checks), no other problem
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"
    problems = [message for message in checks.run_checks() if message.level >= checks.WARNING]
    assert problems == []


# --- API rate limits ---------------------------------------------------------------------------------------


def test_a_token_over_its_rate_gets_429_with_retry_after_and_the_limit(alice, bob, settings):
    # given 3 requests an hour per token
    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "token": "3/hour"}
    _fresh_window(3600)
    prefix = alice.user.api_tokens.get().prefix
    # when alice's token sends 4
    statuses = [alice.client.get("/api/v1/models/").status_code for _ in range(3)]
    refused = alice.client.get("/api/v1/models/")
    # then the 4th is refused, saying the rate, whose it is and when to retry
    assert statuses == [200, 200, 200]
    assert refused.status_code == 429
    retry = int(refused["Retry-After"])
    assert 1 <= retry <= 3600
    assert refused.json() == {
        "detail": f"Rate limit of 3 requests/hour for token {prefix}… reached; retry in {retry} s.",
        "field": None,
    }
    # and another token, of another user, still has its own budget
    assert bob.client.get("/api/v1/models/").status_code == 200


def test_each_token_of_a_user_has_its_own_budget(alice, settings):
    from tenancy.services import create_api_token

    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "token": "1/hour"}
    _fresh_window(3600)
    second = create_api_token(user=alice.user, team=alice.team, name="second").secret
    assert alice.client.get("/api/v1/models/").status_code == 200
    assert alice.client.get("/api/v1/models/").status_code == 429
    assert Client().get("/api/v1/models/", HTTP_AUTHORIZATION=f"Bearer {second}").status_code == 200


def test_a_console_user_and_an_anonymous_address_have_budgets_too(settings):
    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "user": "2/hour", "anonymous": "2/hour"}
    _fresh_window(3600)
    session = Client()
    session.force_login(UserFactory(username="alice"))
    anonymous = Client()
    # when each sends 3 requests
    user_answers = [session.get("/api/v1/models/") for _ in range(3)]
    anonymous_answers = [anonymous.get("/api/v1/schema/", REMOTE_ADDR="10.1.2.3") for _ in range(3)]
    # then the third of each is refused, naming the user and the address
    assert [r.status_code for r in user_answers] == [200, 200, 429]
    assert user_answers[2].json()["detail"].startswith("Rate limit of 2 requests/hour for user 'alice' reached;")
    assert [r.status_code for r in anonymous_answers] == [200, 200, 429]
    assert (
        anonymous_answers[2]
        .json()["detail"]
        .startswith("Rate limit of 2 requests/hour for client address 10.1.2.3 reached;")
    )
    # and another address is not held back
    assert anonymous.get("/api/v1/schema/", REMOTE_ADDR="10.1.2.4").status_code == 200


def test_requests_refused_before_the_rate_check_spend_nothing(alice, settings):
    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "anonymous": "1/hour"}
    _fresh_window(3600)
    for _ in range(3):  # unknown tokens: 401 each time, not 429
        assert Client().get("/api/v1/models/", HTTP_AUTHORIZATION="Bearer conch_nothing").status_code == 401


def test_inference_through_the_api_spends_a_budget_of_its_own(two_teams: TwoTeams, settings, inference_edge):
    # given a token limited to 1 request a minute (its gateway limit) and a generous token budget for the rest
    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "token": "3/hour", "inference": "100/hour"}
    _fresh_window(3600)
    ApiToken.objects.filter(prefix=two_teams.victim.token[:12]).update(requests_per_minute=1)
    client = two_teams.victim.token_client()
    url = f"/api/v1/deployments/{two_teams.victim.deployment.pk}/infer"
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    # when
    first = client.post(url, body, format="json")
    second = client.post(url, body, format="json")
    # then the token's inference limit is the one its requests through the gateway count against
    assert first.status_code == 409  # counted (the deployment is not started), not refused
    assert second.status_code == 429
    assert second.json()["detail"].startswith(
        f"Rate limit of 1 requests/minute for token {two_teams.victim.token[:12]}… reached"
    )
    assert second["Retry-After"] == "50"
    # the token's other budget is untouched by inference
    assert [client.get("/api/v1/models/").status_code for _ in range(3)] == [200, 200, 200]


def test_inference_through_the_api_in_a_console_session_spends_the_inference_budget(
    two_teams: TwoTeams, settings, inference_edge
):
    settings.CONCH_API_RATES = {**settings.CONCH_API_RATES, "user": "3/hour", "inference": "1/hour"}
    _fresh_window(3600)
    client = two_teams.victim.session_client()
    url = f"/api/v1/deployments/{two_teams.victim.deployment.pk}/infer"
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    first = client.post(url, body, content_type="application/json")
    second = client.post(url, body, content_type="application/json")
    assert first.status_code == 409
    assert second.status_code == 429
    assert second.json()["detail"].startswith("Rate limit of 1 requests/hour of inference for user ")


def test_the_counters_live_in_the_shared_redis_cache(alice, settings):
    # given make test's Redis broker: the cache follows it (CONCH_CACHE_URL unset)
    default = settings.CACHES["default"]
    assert default["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert default["LOCATION"] == os.environ["CELERY_BROKER_URL"]
    token_id = alice.user.api_tokens.get().pk
    # when the token makes a request
    assert alice.client.get("/api/v1/models/").status_code == 200
    # then its counter is a Redis key any web process sees, expiring with the window
    keys = redis.Redis.from_url(default["LOCATION"]).keys(f"{default['KEY_PREFIX']}:*:api-rate:token:{token_id}:*")
    assert len(keys) == 1
    assert 0 < redis.Redis.from_url(default["LOCATION"]).ttl(keys[0]) <= 61


def test_an_unreachable_cache_lets_requests_through_and_says_so(alice, settings, caplog):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    assert alice.client.get("/api/v1/models/").status_code == 200
    assert "api.rate_limit.cache_unavailable" in [record.getMessage() for record in caplog.records]


def test_rates_are_read_as_count_and_period():
    assert str(parse_rate("600/minute")) == "600 requests/minute"
    assert parse_rate("5/second").period_seconds == 1
    assert parse_rate("2/day").period_seconds == 86400
    for bad in ("0/minute", "ten/minute", "5/fortnight", "5", "-1/hour"):
        with pytest.raises(ValueError, match="is not a rate such as '600/minute'"):
            parse_rate(bad)


# --- Settings (each case in a fresh process: settings are read once) ----------------------------------------

PRINT_CACHE = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({'cache': s.CACHES['default'], 'rates': s.CONCH_API_RATES, 'limit': s.AXES_FAILURE_LIMIT}))"
)


def _django(tmp_path: Path, code: str, **variables: str) -> subprocess.CompletedProcess:
    environment = {
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "conch.settings",
        "CONCH_VAR_DIR": str(tmp_path / "var"),
        **variables,
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )


def test_the_cache_follows_a_redis_broker_else_stays_in_the_process(tmp_path):
    # (an empty CONCH_CACHE_URL, as `make test` sets it, means unset)
    on_redis = _django(
        tmp_path,
        PRINT_CACHE,
        CELERY_BROKER_URL="redis://queue.internal:6379/3",
        CONCH_CACHE_URL="",
        CONCH_INSTANCE_ID="conch",
    )
    alone = _django(tmp_path, PRINT_CACHE)
    chosen = _django(
        tmp_path, PRINT_CACHE, CELERY_BROKER_URL="redis://queue.internal:6379/3", CONCH_CACHE_URL="locmem://"
    )
    assert on_redis.returncode == alone.returncode == chosen.returncode == 0, on_redis.stderr + alone.stderr
    assert json.loads(on_redis.stdout)["cache"] == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://queue.internal:6379/3",
        "KEY_PREFIX": "conch",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
    assert json.loads(alone.stdout)["cache"]["BACKEND"] == "django.core.cache.backends.locmem.LocMemCache"
    assert json.loads(chosen.stdout)["cache"]["BACKEND"] == "django.core.cache.backends.locmem.LocMemCache"
    assert json.loads(alone.stdout)["rates"] == {
        "token": "600/minute",
        "user": "600/minute",
        "anonymous": "60/minute",
        "inference": "6000/minute",
    }
    assert json.loads(alone.stdout)["limit"] == 5


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"CONCH_CACHE_URL": "memcached://127.0.0.1:11211"}, "CONCH_CACHE_URL must be redis://host:port/db"),
        ({"CONCH_API_RATE_PER_TOKEN": "600 per minute"}, "CONCH_API_RATE_PER_TOKEN must look like '600/minute'"),
        ({"CONCH_LOGIN_FAILURE_LIMIT": "0"}, "CONCH_LOGIN_FAILURE_LIMIT and CONCH_LOGIN_COOLOFF_SECONDS must be"),
        ({"CONCH_MAX_JSON_BODY_BYTES": "10"}, "CONCH_MAX_JSON_BODY_BYTES must be at least 1024"),
    ],
)
def test_bad_abuse_settings_stop_start_up_naming_the_variable(tmp_path, variables, message):
    completed = _django(tmp_path, "import django; django.setup()", **variables)
    assert completed.returncode == 1
    assert message in completed.stderr


# --- Pages ---------------------------------------------------------------------------------------------------


def test_every_list_endpoint_is_paged_and_refuses_a_page_over_the_maximum(two_teams: TwoTeams):
    # given every GET operation of the schema, its path filled with acme's objects
    client = two_teams.victim.token_client()
    operations = [
        Route(template, tuple(re.findall(r"{(\w+)}", template)), None, "schema")
        for method, template in _all_schema_operations(client)
        if method == "get"
    ]
    lists = []
    for route in operations:
        url = fill(route, two_teams)
        # when asked for one item
        response = client.get(url, {"limit": 1})
        if not response.get("Content-Type", "").startswith("application/json"):
            continue  # the schema document itself
        body = response.json()
        # then no answer is a bare list: lists come in pages
        assert not isinstance(body, list), f"GET {route.template} answers a whole list; page it"
        if isinstance(body, dict) and "results" in body:
            lists.append(route.template)
            assert set(body) == {"count", "next", "previous", "results"} and len(body["results"]) <= 1
            # and a page over the maximum is refused naming `limit`
            refused = client.get(url, {"limit": 1001})
            assert refused.status_code == 400
            assert refused.json() == {
                "detail": "limit must be a whole number from 1 to 1000, got '1001'.",
                "field": "limit",
            }
    assert {"/api/v1/models/", "/api/v1/models/{model_id}/versions/", "/api/v1/clusters/"} <= set(lists)


def _all_schema_operations(client: Client) -> list[tuple[str, str]]:
    response = client.get("/api/v1/schema/", {"format": "json"})
    paths = response.json()["paths"]
    return [(method, template) for template, item in paths.items() for method in item if method in METHODS]


# --- Request body limits --------------------------------------------------------------------------------------


def test_a_json_body_over_the_limit_gets_413_saying_the_limit(alice, settings):
    settings.CONCH_MAX_JSON_BODY_BYTES = 2048
    body = json.dumps({"team": "acme", "name": "x" * 3000})
    response = alice.client.post("/api/v1/models/", body, content_type="application/json")
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"The request body is {len(body)} bytes, larger than the 2 KiB (2048 bytes) this endpoint accepts; "
        "send less data per request (an administrator sets the limit with CONCH_MAX_JSON_BODY_BYTES).",
        "field": None,
    }
    assert alice.client.get("/api/v1/models/").json()["count"] == 0


@pytest.mark.parametrize(
    ("operation", "limit", "field", "words"),
    [
        ("post /api/v1/deployments/{id}/infer/", 4096, None, "4 KiB (4096 bytes) this endpoint accepts"),
        ("post /api/v1/models/{model_id}/versions/", 2048, "file", "larger than the 2 KiB (2048 bytes)"),
        ("post /api/v1/versions/{version_id}/rebuild/", 34603008, "sample_inputs", "33 MiB (34603008 bytes)"),
    ],
)
def test_endpoints_that_take_more_say_their_own_limit(two_teams: TwoTeams, settings, operation, limit, field, words):
    # given small limits for JSON, inference and uploads
    settings.CONCH_MAX_JSON_BODY_BYTES = 1024
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    settings.CONCH_MAX_UPLOAD_BYTES = 2048
    method, template = operation.split()
    route = Route(template, tuple(re.findall(r"{(\w+)}", template)), None, "test")
    client = two_teams.victim.token_client()
    # when a body one byte over the endpoint's limit is declared (the upload's limit has room for the form fields)
    over = limit + 1 + (1024**2 + 32 * 1024**2 if field == "file" else 0)
    response = client.generic(
        method.upper(), fill(route, two_teams), b"{}", content_type="application/json", CONTENT_LENGTH=str(over)
    )
    # then it is refused before a byte is read, with the limit and the field
    assert response.status_code == 413, response.content
    assert response.json()["field"] == field
    assert words in response.json()["detail"]


def test_every_operation_with_a_body_has_a_limit(two_teams: TwoTeams, settings):
    # given every operation of the schema that takes a body, and a huge declared body
    settings.CONCH_MAX_JSON_BODY_BYTES = 1024
    client = two_teams.victim.token_client()
    declared = str(64 * 1024**3)
    refused = []
    for method, template in _all_schema_operations(client):
        if method not in ("post", "put", "patch"):
            continue
        route = Route(template, tuple(re.findall(r"{(\w+)}", template)), None, "schema")
        response = client.generic(
            method.upper(), fill(route, two_teams), b"{}", content_type="application/json", CONTENT_LENGTH=declared
        )
        # then each answers 413 naming what it accepts
        assert response.status_code == 413, (method, template, response.content)
        assert "this endpoint accepts" in response.json()["detail"], (method, template)
        refused.append(template)
    assert len(refused) >= 6


def test_console_and_admin_forms_have_the_json_limit(settings):
    settings.CONCH_MAX_JSON_BODY_BYTES = 1024
    for path in ("/accounts/login/", "/admin/login/"):
        response = Client().post(path, {"username": "alice", "password": "x" * 2000})
        assert response.status_code == 413
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert "larger than the 1 KiB (1024 bytes) this endpoint accepts" in response.content.decode()

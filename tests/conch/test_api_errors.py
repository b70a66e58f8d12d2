"""Every /api/ answer is JSON `{"detail", "field"}`, errors raised outside DRF included; other pages keep HTML.

Also the bounds of list pagination and the refusal of control characters, which were 500s found by schemathesis.
"""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _assert_api_error(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response.content
    body = response.json()
    assert set(body) == {"detail", "field"}, body
    assert body["field"] == field, body
    return body


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_unknown_api_url_gets_a_json_404(alice, settings, debug):
    # given DEBUG on or off (Django's technical 404 page is HTML too)
    settings.DEBUG = debug
    # when
    response = alice.client.get("/api/v1/no-such-thing/")
    # then
    body = _assert_api_error(response, 404)
    assert "/api/v1/no-such-thing/" in body["detail"] and "/api/v1/docs/" in body["detail"]


def test_unknown_api_url_gets_a_json_404_without_credentials(db):
    _assert_api_error(Client().post("/api/v2/deployments/", {}), 404)


def test_unknown_console_url_keeps_the_html_404(db):
    response = Client().get("/deployments/no/such/page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.urls("tests.conch.broken_urls")
@pytest.mark.parametrize("path", ["/api/v1/test-broken/", "/api/v1/test-broken-plain/"], ids=["drf", "plain"])
@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_unhandled_exception_in_an_api_view_gets_a_json_500(alice, settings, path, debug):
    # given a view with a bug, and a client that gets the response instead of the exception
    settings.DEBUG = debug
    alice.client.raise_request_exception = False
    # when
    response = alice.client.get(path)
    # then the body says what happened, without the internals
    body = _assert_api_error(response, 500)
    assert "internal error" in body["detail"]
    assert "a bug in" not in body["detail"] and "Traceback" not in response.content.decode()


def test_a_disallowed_host_gets_a_json_400(alice):
    response = alice.client.get("/api/v1/teams/", HTTP_HOST="attacker.example")
    _assert_api_error(response, 400)


def test_api_errors_are_json_even_when_the_client_asks_for_html(alice):
    response = alice.client.get("/api/v1/deployments/999999/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*")
    _assert_api_error(response, 404)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=42647538296621981696", "limit"),
        ("limit=1001", "limit"),
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("offset=99999999999999999999", "offset"),
        ("offset=-5", "offset"),
        ("offset=1.5", "offset"),
    ],
)
def test_page_bounds_are_checked_naming_the_parameter(alice, query, field):
    body = _assert_api_error(alice.client.get(f"/api/v1/versions/?{query}"), 400, field)
    assert body["detail"].startswith(f"{field} must be a whole number from")


def test_pages_within_bounds_are_served(alice, bob):
    # given teams acme and globex, of which alice sees one
    # when
    first = alice.client.get("/api/v1/teams/?limit=1&offset=0")
    blank = alice.client.get("/api/v1/teams/?limit=&offset=")
    # then
    assert first.status_code == 200 and blank.status_code == 200
    assert [team["slug"] for team in first.json()["results"]] == ["acme"]
    assert first.json()["count"] == 1 and blank.json()["results"] == first.json()["results"]


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/teams/%00/", None),
        ("/api/v1/teams/acme%01/", None),
        ("/api/v1/teams/?offset=%07%01", "offset"),
        ("/api/v1/teams/?limit=1&window=%C2%91", "window"),
        ("/api/v1/teams/?%00=1", None),
    ],
)
def test_control_characters_are_refused_before_the_database(alice, url, field):
    body = _assert_api_error(alice.client.get(url), 400, field)
    assert "control character" in body["detail"]

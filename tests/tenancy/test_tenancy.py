"""Tokens, bearer authentication, and team scoping."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from tenancy.models import ApiToken, Membership
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_create_token_prints_the_token_last_and_stores_only_its_hash():
    # given a user in one team (the token is bound to it)
    MembershipFactory(user=UserFactory(username="carol"), team=TeamFactory(slug="acme"))
    out = io.StringIO()
    # when
    call_command("create_token", "carol", stdout=out)
    # then
    token = out.getvalue().strip().splitlines()[-1]
    assert token.startswith("conch_")
    stored = ApiToken.objects.get(user__username="carol")
    assert stored.key_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in (stored.key_hash, stored.prefix)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/teams/").status_code == 200


def test_unknown_token_gets_401_with_detail():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer conch_not-a-real-token")
    response = client.get("/api/v1/models/")
    assert response.status_code == 401
    assert response.json() == {
        "detail": "Unknown or revoked token; create a new one on your team's page in the console or with "
        "POST /api/v1/tokens/ (signed in), and send it as 'Authorization: Bearer <token>'.",
        "field": None,
    }


@pytest.mark.parametrize("header", [None, "Token abc", "conch_abc"])
def test_missing_or_misspelled_credentials_get_401_saying_how_to_send_a_token(header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/deployments/")
    assert response.status_code == 401
    assert response.json() == {
        "detail": "Send an API token as 'Authorization: Bearer <token>'; create one on your team's page in the console "
        "or with POST /api/v1/tokens/ (an operator can also run 'python manage.py create_token <username>').",
        "field": None,
    }
    assert response["WWW-Authenticate"] == "Bearer"


def test_teams_list_shows_only_the_callers_teams(alice, bob):
    response = alice.client.get("/api/v1/teams/")
    assert response.status_code == 200
    assert [t["slug"] for t in response.json()["results"]] == ["acme"]


def test_create_team_command_adds_members_with_their_roles(alice, bob):
    # when
    out = io.StringIO()
    call_command("create_team", "initech", "--member", "alice", "--viewer", "bob", stdout=out)
    # then alice (in a console session: every team of hers) sees both teams; her token stays bound to acme
    session = APIClient()
    session.force_authenticate(alice.user)
    response = session.get("/api/v1/teams/")
    assert sorted(t["slug"] for t in response.json()["results"]) == ["acme", "initech"]
    assert [t["slug"] for t in alice.client.get("/api/v1/teams/").json()["results"]] == ["acme"]
    roles = dict(Membership.objects.filter(team__slug="initech").values_list("user__username", "role"))
    assert roles == {"alice": "developer", "bob": "viewer"}


def test_a_deactivated_users_token_says_so(db):
    from tests.conftest import make_caller

    caller = make_caller("gone", "acme")
    caller.user.is_active = False
    caller.user.save()
    response = caller.client.get("/api/v1/models/")
    assert response.status_code == 401
    assert response.json()["detail"] == (
        f"token {caller.token[:12]}… belongs to a deactivated user; ask an admin to reactivate it"
    )

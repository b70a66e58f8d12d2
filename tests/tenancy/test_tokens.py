"""API tokens: bound to a team, scoped, optionally limited to named deployments, expiring, revocable, hashed."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from deployments import services as deployments
from deployments.services.requests import DeploymentRequest, PlacementRequest
from tenancy.models import ApiToken
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.tiny_models import add_constant

pytestmark = pytest.mark.django_db


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def web(alice, tmp_path):
    """A pending local deployment `web` of team acme, and its version."""
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0))
    deployment = deployments.create_deployment(
        user=alice.user,
        request=DeploymentRequest(
            team_slug="acme", name="web", model_version_id=version.pk, placement=PlacementRequest(runtime="local")
        ),
    )
    return deployment


# --- manage.py create_token ------------------------------------------------------------


def test_create_token_command_binds_team_scopes_and_expiry():
    # given
    user = UserFactory(username="carol")
    MembershipFactory(user=user, team=TeamFactory(slug="acme"))
    MembershipFactory(user=user, team=TeamFactory(slug="globex"))
    out = io.StringIO()
    # when
    call_command(
        "create_token", "carol", "--team", "acme", "--scope", "read", "--scope", "infer", "--expires-in", "30d",
        stdout=out,
    )  # fmt: skip
    # then
    secret = out.getvalue().strip().splitlines()[-1]
    stored = ApiToken.objects.get(user=user)
    assert stored.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert (stored.team.slug, stored.scopes, stored.deployments) == ("acme", ["read", "infer"], [])
    assert abs(stored.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert [t["slug"] for t in _client(secret).get("/api/v1/teams/").json()["results"]] == ["acme"]


def test_create_token_command_needs_a_team_when_the_user_has_several():
    user = UserFactory(username="carol")
    MembershipFactory(user=user, team=TeamFactory(slug="acme"))
    MembershipFactory(user=user, team=TeamFactory(slug="globex"))
    with pytest.raises(CommandError, match=r"Give --team: a token acts in one team \(carol's teams: acme, globex\)"):
        call_command("create_token", "carol", stdout=io.StringIO())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--expires-in", "soon"], "--expires-in takes a number of days such as 30d, got 'soon'."),
        (["--expires-in", "9999d"], "expires_in_days must be a whole number of days from 1 to 365"),
        (["--team", "initech"], "Team 'initech' does not exist or you are not a member of it."),
    ],
)
def test_create_token_command_refuses_bad_arguments(alice, arguments, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("create_token", "alice", *arguments, stdout=io.StringIO())


# --- authentication: expired, revoked -------------------------------------------------------


def test_an_expired_token_gets_401_naming_it_and_its_date(alice):
    # given
    token = ApiToken.objects.get(user=alice.user)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=datetime(2026, 3, 1, 12, tzinfo=UTC))
    # when
    response = alice.client.get("/api/v1/models/")
    # then
    assert response.status_code == 401
    assert response.json() == {
        "detail": f"token {token.prefix}… expired on 2026-03-01; create a new one",
        "field": None,
    }
    assert alice.token.startswith(token.prefix) and len(token.prefix) == len("conch_ab12cd")


def test_a_revoked_token_gets_401(alice):
    token = ApiToken.objects.get(user=alice.user)
    assert alice.client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    response = alice.client.get("/api/v1/models/")
    assert response.status_code == 401
    assert response.json() == {"detail": f"token {token.prefix}… was revoked; create a new one", "field": None}


# --- scopes -----------------------------------------------------------------------------


def test_a_read_only_token_reads_and_gets_403_naming_the_scope_for_writes(web):
    reader = make_caller("rita", "acme", scopes=["read"])
    assert reader.client.get(f"/api/v1/deployments/{web.pk}/").status_code == 200
    prefix = reader.token[: len("conch_ab12cd")]
    cases = [
        (reader.client.post("/api/v1/models/", {"team": "acme", "name": "m"}, format="json"), "Registering a model",
         "models:write"),
        (reader.client.delete(f"/api/v1/deployments/{web.pk}/"), "Stopping a deployment", "deployments:write"),
        (reader.client.post(f"/api/v1/deployments/{web.pk}/infer", {}, format="json"), "Sending an inference request",
         "infer"),
    ]  # fmt: skip
    for response, action, scope in cases:
        assert response.status_code == 403
        assert response.json()["detail"] == (
            f"{action} needs a token with the '{scope}' scope; token {prefix}… has read. "
            "Create a token with that scope."
        )


def test_an_infer_only_token_infers_but_cannot_read(web):
    caller = make_caller("ivan", "acme", scopes=["infer"])
    # pending, not ready: 409 comes after the scope and role checks
    assert caller.client.post(f"/api/v1/deployments/{web.pk}/infer", {}, format="json").status_code == 409
    response = caller.client.get("/api/v1/deployments/")
    assert response.status_code == 403
    assert response.json()["detail"].startswith("Reading needs a token with the 'read' scope")


def test_a_token_limited_to_named_deployments_acts_on_those_only(web):
    # given a token limited to deployment `web`, and another deployment `other` of the same team
    user = web.created_by
    other = deployments.create_deployment(
        user=user,
        request=DeploymentRequest(
            team_slug="acme",
            name="other",
            model_version_id=web.model_version_id,
            placement=PlacementRequest(runtime="local"),
        ),
    )
    issued = create_api_token(user=user, team=web.team, deployments=["web"])
    client = _client(issued.secret)
    # when / then
    assert client.post(f"/api/v1/deployments/{web.pk}/infer", {}, format="json").status_code == 409
    # a deployment outside the token is not even seen (as another team's)
    assert client.post(f"/api/v1/deployments/{other.pk}/infer", {}, format="json").status_code == 404
    created = client.post(
        "/api/v1/deployments/", {"team": "acme", "name": "third", "model_version": web.model_version_id}, format="json"
    )
    assert created.status_code == 403
    assert created.json()["detail"] == (
        f"Creating a deployment on deployment 'third' is outside token {issued.token.prefix}…, which is "
        "limited to deployments web."
    )
    assert client.delete(f"/api/v1/deployments/{web.pk}/").status_code == 202


def test_a_token_limited_to_named_deployments_lists_and_sees_those_only(web):
    # given deployments `web` and `other` of acme, and a token limited to `web`
    user = web.created_by
    other = deployments.create_deployment(
        user=user,
        request=DeploymentRequest(
            team_slug="acme",
            name="other",
            model_version_id=web.model_version_id,
            placement=PlacementRequest(runtime="local"),
        ),
    )
    narrow = _client(create_api_token(user=user, team=web.team, deployments=["web"]).secret)
    # when / then: the list holds `web` only, and `other` is not found (as another team's would be)
    assert [d["name"] for d in narrow.get("/api/v1/deployments/").json()["results"]] == ["web"]
    assert narrow.get(f"/api/v1/deployments/{web.pk}/").status_code == 200
    assert narrow.get(f"/api/v1/deployments/{other.pk}/").status_code == 404
    assert narrow.get(f"/api/v1/deployments/{other.pk}/metrics").status_code == 404
    # and a token of the whole team sees both
    whole = _client(create_api_token(user=user, team=web.team).secret)
    assert sorted(d["name"] for d in whole.get("/api/v1/deployments/").json()["results"]) == ["other", "web"]


def test_a_token_of_one_team_sees_nothing_of_the_users_other_teams(web, bob):
    # given alice is also in globex, where a model exists; her token is bound to acme
    MembershipFactory(user=web.created_by, team=bob.team)
    globex_model = bob.client.post("/api/v1/models/", {"team": "globex", "name": "g"}, format="json").json()
    alice = _client(create_api_token(user=web.created_by, team=web.team).secret)
    # when / then: globex looks like someone else's team (404, as any other team's objects)
    assert alice.get(f"/api/v1/models/{globex_model['id']}/").status_code == 404
    assert alice.post("/api/v1/models/", {"team": "globex", "name": "h"}, format="json").status_code == 404
    assert [t["slug"] for t in alice.get("/api/v1/teams/").json()["results"]] == ["acme"]


# --- /api/v1/tokens/ -----------------------------------------------------------------------


def test_post_tokens_shows_the_secret_once_and_the_list_never(alice):
    # when
    response = alice.client.post(
        "/api/v1/tokens/",
        {"team": "acme", "name": "ci", "scopes": ["read", "infer"], "deployments": ["web"], "expires_in_days": 7},
        format="json",
    )
    # then
    assert response.status_code == 201
    created = response.json()
    secret = created["token"]
    stored = ApiToken.objects.get(pk=created["id"])
    assert stored.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert {k: created[k] for k in ("name", "user", "team", "scopes", "deployments", "last_used_at")} == {
        "name": "ci",
        "user": "alice",
        "team": "acme",
        "scopes": ["read", "infer"],
        "deployments": ["web"],
        "last_used_at": None,
    }
    assert created["prefix"] == secret[: len("conch_ab12cd")]
    listed = alice.client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci", "tests"]
    assert all(set(t) == {*created} - {"token"} for t in listed)
    text = alice.client.get("/api/v1/tokens/").content.decode()
    assert secret not in text and stored.key_hash not in text and alice.token not in text
    assert _client(secret).get("/api/v1/teams/").status_code == 200


def test_a_viewers_token_gets_only_the_read_scope_and_a_developers_every_scope():
    # given a viewer and a developer of acme, signed in to the console (no token)
    team = TeamFactory(slug="acme")
    viewer, developer = UserFactory(username="vera"), UserFactory(username="dev")
    MembershipFactory(user=viewer, team=team, role="viewer")
    MembershipFactory(user=developer, team=team, role="developer")
    client = APIClient()
    client.force_authenticate(viewer)
    # when the viewer asks for a token without naming scopes
    created = client.post("/api/v1/tokens/", {"team": "acme", "name": "dash"}, format="json")
    # then it can only read, as the viewer can
    assert created.status_code == 201, created.content
    assert created.json()["scopes"] == ["read"]
    assert ApiToken.objects.get(pk=created.json()["id"]).scopes == ["read"]
    # and asking for a scope a viewer cannot use is refused naming `scopes`, making no token
    refused = client.post("/api/v1/tokens/", {"team": "acme", "scopes": ["read", "infer"]}, format="json")
    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "A viewer cannot use the scope infer; a viewer's token may have read. Leave infer out, or ask a "
        "team admin for the developer role.",
        "field": "scopes",
    }
    assert ApiToken.objects.filter(user=viewer).count() == 1
    # while a developer's token gets every scope
    issued = create_api_token(user=developer, team=team)
    assert issued.token.scopes == ["read", "models:write", "deployments:write", "infer"]


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        ({"team": "acme", "expires_in_days": 366}, "expires_in_days", 400),
        ({"team": "acme", "scopes": ["admin"]}, "scopes", 400),
        ({"team": "acme", "scopes": []}, "scopes", 400),
        ({"team": "globex"}, "team", 404),
    ],
)
def test_post_tokens_refuses_bad_requests_naming_the_field(alice, bob, body, field, status):
    response = alice.client.post("/api/v1/tokens/", body, format="json")
    assert response.status_code == status, response.json()
    assert response.json()["field"] == field


def test_a_token_creates_tokens_within_itself_only():
    # given a token with read and infer that expires in 5 days
    caller = make_caller("cal", "acme", scopes=["read", "infer"])
    ApiToken.objects.filter(user=caller.user).update(expires_at=timezone.now() + timedelta(days=5))
    # when it asks for a wider scope, then 403 names it
    wider = caller.client.post("/api/v1/tokens/", {"team": "acme", "scopes": ["models:write"]}, format="json")
    assert wider.status_code == 403
    assert "needs a token with the 'models:write' scope" in wider.json()["detail"]
    # when it asks for a narrower one, then it gets one that expires no later than itself
    narrower = caller.client.post("/api/v1/tokens/", {"team": "acme", "scopes": ["infer"]}, format="json")
    assert narrower.status_code == 201
    assert ApiToken.objects.get(pk=narrower.json()["id"]).expires_at <= timezone.now() + timedelta(days=5)


def test_a_team_admin_lists_and_revokes_every_token_of_the_team(alice):
    # given an admin of acme, and a token of bob's team globex
    admin = make_caller("ada", "acme", role="admin")
    make_caller("bob", "globex")
    alices = ApiToken.objects.get(user=alice.user)
    # when
    listed = admin.client.get("/api/v1/tokens/").json()["results"]
    # then
    assert sorted((t["user"], t["team"]) for t in listed) == [("ada", "acme"), ("alice", "acme")]
    assert admin.client.delete(f"/api/v1/tokens/{alices.pk}/").status_code == 204
    assert alice.client.get("/api/v1/models/").status_code == 401


def test_a_developer_sees_and_revokes_only_their_own_tokens(alice):
    other = make_caller("dev2", "acme")
    others = ApiToken.objects.get(user=other.user)
    assert [t["user"] for t in alice.client.get("/api/v1/tokens/").json()["results"]] == ["alice"]
    assert alice.client.delete(f"/api/v1/tokens/{others.pk}/").status_code == 404
    assert other.client.get("/api/v1/teams/").status_code == 200


def test_a_viewer_sees_only_their_own_and_an_admin_of_another_team_none_of_this_one(alice):
    # given a viewer of acme, and an admin of globex who also develops in acme
    viewer = make_caller("vera", "acme", role="viewer")
    admin_elsewhere = make_caller("gail", "globex", role="admin")
    MembershipFactory(user=admin_elsewhere.user, team=alice.team, role="developer")
    in_acme = _client(create_api_token(user=admin_elsewhere.user, team=alice.team).secret)
    alices = ApiToken.objects.get(user=alice.user)
    # when / then
    assert [t["user"] for t in viewer.client.get("/api/v1/tokens/").json()["results"]] == ["vera"]
    assert viewer.client.delete(f"/api/v1/tokens/{alices.pk}/").status_code == 404
    # with her globex token she manages globex's tokens; with her acme one only her own of acme
    assert {t["team"] for t in admin_elsewhere.client.get("/api/v1/tokens/").json()["results"]} == {"globex"}
    assert [(t["user"], t["team"]) for t in in_acme.get("/api/v1/tokens/").json()["results"]] == [("gail", "acme")]
    assert in_acme.delete(f"/api/v1/tokens/{alices.pk}/").status_code == 404
    assert alice.client.get("/api/v1/models/").status_code == 200


# --- the demo's token ---------------------------------------------------------------------


def test_the_demo_keeps_one_token_and_revokes_the_one_it_replaces(settings, tmp_path):
    from devtools.management.commands.run_demo import Command

    # given the demo's admin and team, and its var folder
    settings.VAR_DIR = tmp_path
    admin = UserFactory(username="admin", is_superuser=True, is_staff=True)
    team = TeamFactory(slug="demo")
    MembershipFactory(user=admin, team=team, role="admin")
    command = Command()
    # when it runs twice, then the second run reuses the token
    first = command._ensure_token(admin, team)
    assert command._ensure_token(admin, team) == first
    # when its file is lost, then a new token replaces the old one, which is revoked
    (tmp_path / "demo-token").unlink()
    second = command._ensure_token(admin, team)
    assert second != first
    assert list(ApiToken.objects.filter(user=admin, is_revoked=False).values_list("prefix", flat=True)) == [
        second[: len("conch_ab12cd")]
    ]
    assert _client(first).get("/api/v1/teams/").status_code == 401

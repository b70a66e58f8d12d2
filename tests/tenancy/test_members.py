"""Members and roles: team admins (and staff) list, add, re-role and remove members; a team keeps an admin."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from conch.errors import Conflict, Forbidden
from tenancy.members import change_member_role
from tenancy.models import ApiToken, Membership
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/teams/acme/members/"


@pytest.fixture
def ada(db):
    """The admin of team acme (alice, a developer, is in it too)."""
    return make_caller("ada", "acme", role="admin")


def _roles() -> dict[str, str]:
    return dict(Membership.objects.filter(team__slug="acme").values_list("user__username", "role"))


def test_an_admin_lists_the_members_and_their_roles(ada, alice):
    response = ada.client.get(URL)
    assert response.status_code == 200, response.content
    assert [(m["username"], m["role"]) for m in response.json()["results"]] == [
        ("ada", "admin"),
        ("alice", "developer"),
    ]


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_viewers_and_developers_get_403_naming_the_admin_role(ada, role):
    caller = make_caller("mo", "acme", role=role)
    UserFactory(username="newbie")
    requests = [
        ("Listing a team's members", lambda: caller.client.get(URL)),
        ("Adding a team member", lambda: caller.client.post(URL, {"username": "newbie"}, format="json")),
        ("Changing a member's role", lambda: caller.client.patch(f"{URL}ada/", {"role": "viewer"}, format="json")),
        ("Removing a team member", lambda: caller.client.delete(f"{URL}ada/")),
    ]
    for action, send in requests:
        response = send()
        assert response.status_code == 403, action
        assert response.json() == {
            "detail": f"{action} needs the admin role in team 'acme'; you are a {role}.",
            "field": None,
        }
    assert _roles() == {"ada": "admin", "mo": role}


def test_another_teams_members_are_not_found(ada, bob):
    assert bob.client.get(URL).status_code == 404
    assert bob.client.delete(f"{URL}ada/").status_code == 404
    assert ada.client.get("/api/v1/teams/globex/members/").status_code == 404


def test_an_admin_adds_changes_and_removes_a_member(ada):
    # given a user in no team
    UserFactory(username="newbie")
    # when added (developer by default)
    response = ada.client.post(URL, {"username": "newbie"}, format="json")
    # then
    assert response.status_code == 201, response.content
    assert (response.json()["username"], response.json()["role"]) == ("newbie", "developer")
    # when made a viewer
    response = ada.client.patch(f"{URL}newbie/", {"role": "viewer"}, format="json")
    assert (response.status_code, response.json()["role"]) == (200, "viewer")
    assert _roles() == {"ada": "admin", "newbie": "viewer"}
    # when removed
    assert ada.client.delete(f"{URL}newbie/").status_code == 204
    assert _roles() == {"ada": "admin"}


def test_removing_a_member_revokes_their_tokens_of_that_team_only(ada, alice, bob):
    # given alice also develops in globex, with a token there
    MembershipFactory(user=alice.user, team=bob.team)
    globex_token = create_api_token(user=alice.user, team=bob.team).token
    # when ada removes her from acme
    assert ada.client.delete(f"{URL}alice/").status_code == 204
    # then her acme token answers 401, her globex one still works
    assert alice.client.get("/api/v1/teams/").status_code == 401
    assert ApiToken.objects.get(pk=globex_token.pk).is_revoked is False


@pytest.mark.parametrize(
    "body, field, status",
    [
        ({"username": "ghost"}, "username", 404),
        ({"username": "alice"}, "username", 409),
        ({"username": "alice", "role": "owner"}, "role", 400),
        ({}, "username", 400),
    ],
)
def test_bad_additions_name_the_field(ada, alice, body, field, status):
    response = ada.client.post(URL, body, format="json")
    assert (response.status_code, response.json()["field"]) == (status, field)
    assert _roles() == {"ada": "admin", "alice": "developer"}


def test_adding_a_member_twice_says_to_patch_instead(ada, alice):
    response = ada.client.post(URL, {"username": "alice", "role": "admin"}, format="json")
    assert response.json()["detail"] == (
        "'alice' is already a developer of team 'acme'; change the role with PATCH /api/v1/teams/acme/members/alice/."
    )


def test_changing_or_removing_a_non_member_is_not_found(ada, bob):
    response = ada.client.patch(f"{URL}bob/", {"role": "viewer"}, format="json")
    assert (response.status_code, response.json()) == (
        404,
        {"detail": "'bob' is not a member of team 'acme'.", "field": "username"},
    )
    assert ada.client.delete(f"{URL}bob/").status_code == 404


def test_the_last_admin_can_be_neither_demoted_nor_removed(ada, alice):
    # when
    demoted = ada.client.patch(f"{URL}ada/", {"role": "developer"}, format="json")
    removed = ada.client.delete(f"{URL}ada/")
    # then
    message = (
        "'ada' is the last admin of team 'acme'; a team must keep at least one admin. Make another member admin first."
    )
    assert (demoted.status_code, demoted.json()) == (409, {"detail": message, "field": "role"})
    assert (removed.status_code, removed.json()) == (409, {"detail": message, "field": "username"})
    assert _roles() == {"ada": "admin", "alice": "developer"}
    # and once alice is an admin too, ada may step down
    assert ada.client.patch(f"{URL}alice/", {"role": "admin"}, format="json").status_code == 200
    assert ada.client.delete(f"{URL}ada/").status_code == 204
    assert _roles() == {"alice": "admin"}


def test_staff_manage_members_of_any_team(ada):
    staff = APIClient()
    staff.force_authenticate(UserFactory(username="root", is_staff=True))
    UserFactory(username="newbie")
    assert staff.get(URL).status_code == 200
    assert staff.post(URL, {"username": "newbie", "role": "admin"}, format="json").status_code == 201
    assert staff.patch(f"{URL}ada/", {"role": "viewer"}, format="json").status_code == 200
    assert _roles() == {"ada": "viewer", "newbie": "admin"}


def test_through_a_token_managing_members_is_team_wide(ada):
    # given tokens of the admin: read-only, and limited to a deployment
    read_only, narrow = APIClient(), APIClient()
    secret = create_api_token(user=ada.user, team=ada.team, scopes=["read"]).secret
    read_only.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    secret = create_api_token(user=ada.user, team=ada.team, deployments=["web"]).secret
    narrow.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    UserFactory(username="newbie")
    # when / then: both may list, neither may change
    assert read_only.get(URL).status_code == 200
    refused = read_only.post(URL, {"username": "newbie"}, format="json")
    assert refused.status_code == 403
    assert "needs a token with the 'models:write' scope" in refused.json()["detail"]
    refused = narrow.post(URL, {"username": "newbie"}, format="json")
    assert refused.status_code == 403
    assert "is team-wide; token" in refused.json()["detail"]
    assert _roles() == {"ada": "admin"}


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin():
    # given a team with two admins
    first = make_caller("ada", "acme", role="admin")
    second = make_caller("ben", "acme", role="admin")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def demote(caller, username: str) -> None:
        try:
            barrier.wait()
            change_member_role(user=caller.user, slug="acme", username=username, role="viewer")
            outcomes.append("demoted")
        except (Conflict, Forbidden):  # the last admin, or no longer an admin by the time it checked
            outcomes.append("refused")
        finally:
            connection.close()

    # when each demotes the other at the same time
    threads = [
        threading.Thread(target=demote, args=(first, "ben")),
        threading.Thread(target=demote, args=(second, "ada")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then one of them won and the team still has an admin
    assert sorted(outcomes) == ["demoted", "refused"]
    assert list(_roles().values()).count("admin") == 1


def test_member_changes_are_in_the_audit_log(db):
    from tenancy.models import AuditEntry

    boss = make_caller("boss", "audited", role="admin")
    UserFactory(username="newcomer")
    assert (
        boss.client.post("/api/v1/teams/audited/members/", {"username": "newcomer", "role": "viewer"}).status_code
        == 201
    )
    assert boss.client.patch("/api/v1/teams/audited/members/newcomer/", {"role": "developer"}).status_code == 200
    assert boss.client.delete("/api/v1/teams/audited/members/newcomer/").status_code == 204
    entries = list(
        AuditEntry.objects.filter(team_slug="audited", object_type="membership")
        .order_by("pk")
        .values_list("action", "before", "after", "actor")
    )
    assert entries == [
        ("membership.changed", {}, {"role": "viewer"}, "boss"),
        ("membership.changed", {"role": "viewer"}, {"role": "developer"}, "boss"),
        ("membership.removed", {"role": "developer"}, {}, "boss"),
    ]

"""The admin console of teams: usage bars, the near/over filter, limits and members inline, token revocation,
staff only, the theme's static files. Through Django's test client, logged in as a superuser (pytest-django's
`admin_client`) unless a test says otherwise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import unfold
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from conch.errors import Unauthenticated
from deployments.models import Deployment
from models_registry.models import ModelVersion, RegisteredModel
from tenancy.choices import Role
from tenancy.models import ApiToken, AuditEntry, Membership
from tenancy.quotas import quota_limits, set_quota
from tenancy.services import authenticate_token, create_api_token
from tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

TEAMS = "/admin/tenancy/team/"

#: A local deployment's model configuration with 3 model instances (two instance groups).
THREE_INSTANCES = 'name: "m"\ninstance_group [ { count: 2, kind: KIND_CPU }, { count: 1, kind: KIND_CPU } ]\n'


def _version(team, name: str, size: int) -> ModelVersion:
    model = RegisteredModel.objects.create(team=team, name=name)
    return ModelVersion.objects.create(model=model, number=1, status="built", source_size_bytes=size)


def _deployment(team, version, name: str, status: str = "ready", **fields) -> Deployment:
    return Deployment.objects.create(team=team, name=name, model_version=version, status=status, **fields)


def _bars(html: str) -> dict[tuple[str, str], tuple[int, int, str]]:
    """The bars of one page: {(quota field, unit): (used, limit, the text shown)}."""
    found = {}
    pattern = re.compile(
        r'data-quota="([^"]+)" data-unit="([^"]+)" data-used="(\d+)" data-limit="(\d+)">\s*'
        r'<div class="[^"]*">\s*<span class="font-medium">([^<]*)</span>'
    )
    for field, unit, used, limit, text in pattern.findall(html):
        found[(field, unit)] = (int(used), int(limit), text.strip())
    return found


def _row(html: str, slug: str) -> str:
    """The changelist row (<tr>…</tr>) of team `slug`."""
    for row in re.findall(r"<tr\b.*?</tr>", html, flags=re.S):
        if re.search(rf">\s*{re.escape(slug)}\s*<", row):
            return row
    raise AssertionError(f"no row for team {slug}")


def _post_data(response) -> dict[str, object]:
    """What the change page just fetched posts back unchanged: its fields and every inline's forms."""
    data: dict[str, object] = {}
    for fieldset in response.context["adminform"].form:
        if not fieldset.field.disabled:
            data[fieldset.html_name] = fieldset.value() if fieldset.value() is not None else ""
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            data[f"{formset.prefix}-{name}"] = formset.management_form[name].value()
        for form in formset.forms:
            for name in form.fields:
                value = form[name].value()
                data[form.add_prefix(name)] = value if value is not None else ""
    return {key: value for key, value in data.items() if value is not False}


# --- the team list --------------------------------------------------------------------


def test_the_team_list_shows_each_teams_usage_against_its_limits(admin_client, settings):
    # given a team with known usage: 2 models (1536 + 512 bytes), a local deployment of 3 instances, a
    # Kubernetes one of 3 pods x 2 GPUs, a stopped one (not counted); and a team using nothing
    settings.CONCH_QUOTA_STORAGE_BYTES = 4096
    settings.CONCH_QUOTA_INSTANCES = 16
    vision = TeamFactory(slug="vision")
    TeamFactory(slug="idle")
    set_quota(team=vision, limits={"gpu": 8, "deployments": 2, "models": 5})
    first = _version(vision, "detector", 1536)
    _version(vision, "ranker", 512)
    _deployment(vision, first, "local-one", runtime="local", config_pbtxt=THREE_INSTANCES)
    _deployment(vision, first, "gpus", runtime="kubernetes", replicas=3, gpu={"count": 2})
    _deployment(vision, first, "old", status="stopped", runtime="local", config_pbtxt=THREE_INSTANCES)
    # when
    response = admin_client.get(TEAMS)
    # then
    assert response.status_code == 200
    html = response.content.decode()
    assert _bars(_row(html, "vision")) == {
        ("gpu", "nvidia.com/gpu"): (6, 8, "6 / 8"),
        ("storage_bytes", "bytes of storage"): (2048, 4096, "2.0\xa0KB / 4.0\xa0KB"),
        ("deployments", "deployments"): (2, 2, "2 / 2"),
        ("models", "models"): (2, 5, "2 / 5"),
        ("instances", "model instances"): (3, 16, "3 / 16"),
    }
    assert _bars(_row(html, "idle"))[("gpu", "nvidia.com/gpu")] == (0, 8, "0 / 8")
    # the full deployment quota is drawn orange, a default limit says so
    assert 'data-quota="deployments"' in _row(html, "vision")
    assert re.search(r'data-quota="deployments".*?bg-orange-500', _row(html, "vision"), flags=re.S)
    assert re.search(r'data-quota="instances".*?>default<', _row(html, "vision"), flags=re.S)


def test_a_mig_profile_gets_its_own_bar_beside_whole_gpus(admin_client):
    # given a team using 2 slices of a MIG profile
    team = TeamFactory(slug="mig")
    set_quota(team=team, limits={"gpu": 4})
    _deployment(
        team, _version(team, "m", 1), "sliced", runtime="kubernetes", replicas=2, gpu={"mig_profile": "1g.10gb"}
    )
    # when
    bars = _bars(_row(admin_client.get(TEAMS).content.decode(), "mig"))
    # then
    assert bars[("gpu", "nvidia.com/gpu")] == (0, 4, "0 / 4")
    assert bars[("gpu", "nvidia.com/mig-1g.10gb")] == (2, 4, "2 / 4 nvidia.com/mig-1g.10gb")


def test_the_team_lists_queries_do_not_grow_with_the_teams_on_the_page(admin_client):
    # given 3 teams with usage, then 40
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(TEAMS).status_code == 200
        return len(captured.captured_queries)

    for n in range(3):
        team = TeamFactory(slug=f"few{n}")
        _deployment(team, _version(team, "m", 10), "d", runtime="local", config_pbtxt=THREE_INSTANCES)
    few = queries()
    for n in range(37):
        team = TeamFactory(slug=f"many{n}")
        MembershipFactory(team=team)
        _deployment(team, _version(team, "m", 10), "d", runtime="kubernetes", gpu={"count": 1})
    # when
    many = queries()
    # then: the page's count is fixed: session, user, two counts, the teams, their limits, one per quota field
    # (5); 11 today
    assert many == few
    assert many <= 15


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("near", {"eighty", "full", "over"}), ("over", {"over"})],
)
def test_the_quota_filter_finds_teams_near_or_over_a_limit(admin_client, settings, choice, expected):
    # given: calm uses 3 of 5 deployments (60%); eighty 4 of 5 (80%); full 5 of 5 models; over 2 models
    # with a limit of 1 (lowered after they were made); offgpu has a GPU limit of 0 and uses none
    settings.CONCH_QUOTA_DEPLOYMENTS = 5
    for slug, deployments in (("calm", 3), ("eighty", 4)):
        team = TeamFactory(slug=slug)
        version = _version(team, "m", 1)
        for n in range(deployments):
            _deployment(team, version, f"d{n}", runtime="local")
    full = TeamFactory(slug="full")
    set_quota(team=full, limits={"models": 5})
    for n in range(5):
        _version(full, f"m{n}", 1)
    over = TeamFactory(slug="over")
    _version(over, "a", 1)
    _version(over, "b", 1)
    set_quota(team=over, limits={"models": 1})
    set_quota(team=TeamFactory(slug="offgpu"), limits={"gpu": 0})
    # when
    response = admin_client.get(TEAMS, {"quota": choice})
    # then
    assert response.status_code == 200
    assert {team.slug for team in response.context["cl"].result_list} == expected
    # and without the filter every team is listed
    everyone = admin_client.get(TEAMS).context["cl"].result_list
    assert {team.slug for team in everyone} == {"calm", "eighty", "full", "over", "offgpu"}


# --- limits and members inline --------------------------------------------------------


def test_a_limit_set_inline_is_saved_through_the_quota_service(admin_client, settings):
    # given a team on the default limits
    settings.CONCH_QUOTA_GPUS = 8
    team = TeamFactory(slug="vision")
    url = reverse("admin:tenancy_team_change", args=[team.pk])
    data = _post_data(admin_client.get(url))
    # when the limits form gets 3 GPUs and 10 GiB
    data["quota-0-gpus"] = "3"
    data["quota-0-storage_bytes"] = str(10 * 1024**3)
    response = admin_client.post(url, data)
    # then
    assert response.status_code == 302, response.context["errors"] if response.context else response
    assert quota_limits(team=team)["gpu"] == (3, False)
    assert quota_limits(team=team)["storage_bytes"] == (10 * 1024**3, False)
    assert quota_limits(team=team)["models"][1] is True
    # and the page shows it back; emptying it puts the default back
    data = _post_data(admin_client.get(url))
    assert data["quota-0-gpus"] == 3
    data["quota-0-gpus"] = ""
    assert admin_client.post(url, data).status_code == 302
    assert quota_limits(team=team)["gpu"] == (8, True)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("gpus", "-1", "gpu must be a whole number from 0 to 2147483647, or null for the default."),
        ("storage_bytes", str(2**63), "storage_bytes must be a whole number from 0 to 9223372036854775807"),
        ("deployments", "two", "Enter a whole number."),
    ],
)
def test_an_invalid_limit_is_a_form_error_and_changes_nothing(admin_client, column, value, message):
    # given a team with 4 GPUs
    team = TeamFactory(slug="vision")
    set_quota(team=team, limits={"gpu": 4})
    url = reverse("admin:tenancy_team_change", args=[team.pk])
    data = _post_data(admin_client.get(url))
    # when
    data[f"quota-0-{column}"] = value
    response = admin_client.post(url, data)
    # then the page comes back with the error under the field, and the limits are as they were
    assert response.status_code == 200
    quota_form = response.context["inline_admin_formsets"][0].formset.forms[0]
    assert message in " ".join(quota_form.errors[column])
    assert message in response.content.decode().replace("&#x27;", "'")
    assert quota_limits(team=team)["gpu"] == (4, False)
    assert quota_limits(team=team)["deployments"][1] is True


def test_members_and_roles_are_edited_inline(admin_client):
    # given a team with one developer
    team = TeamFactory(slug="vision")
    carol = UserFactory(username="carol")
    dave = UserFactory(username="dave")
    MembershipFactory(team=team, user=carol, role=Role.DEVELOPER)
    url = reverse("admin:tenancy_team_change", args=[team.pk])
    data = _post_data(admin_client.get(url))
    # when carol becomes an admin and dave joins as a viewer
    data["memberships-0-role"] = Role.ADMIN
    data["memberships-TOTAL_FORMS"] = 2
    data.update({"memberships-1-user": dave.pk, "memberships-1-role": Role.VIEWER, "memberships-1-team": team.pk})
    response = admin_client.post(url, data)
    # then
    assert response.status_code == 302
    assert dict(Membership.objects.filter(team=team).values_list("user__username", "role")) == {
        "carol": "admin",
        "dave": "viewer",
    }
    # when carol is removed
    data = _post_data(admin_client.get(url))
    carol_row = next(key for key, value in data.items() if key.endswith("-user") and value == carol.pk)
    data[carol_row.replace("-user", "-DELETE")] = "on"
    assert admin_client.post(url, data).status_code == 302
    # then
    assert list(Membership.objects.filter(team=team).values_list("user__username", flat=True)) == ["dave"]


# --- tokens ---------------------------------------------------------------------------


def test_the_revoke_action_revokes_tokens_and_no_page_shows_a_hash(admin_client):
    # given two tokens of a team member
    team = TeamFactory(slug="vision")
    erin = UserFactory(username="erin")
    MembershipFactory(team=team, user=erin)
    first = create_api_token(user=erin, team=team, name="ci")
    second = create_api_token(user=erin, team=team, name="laptop")
    # when staff revoke the first
    response = admin_client.post(
        "/admin/tenancy/apitoken/", {"action": "revoke_tokens", "_selected_action": [first.token.pk]}, follow=True
    )
    # then it answers 401 from now on, the other still works
    assert response.status_code == 200
    assert f"Revoked 1 token(s): {first.token.prefix}…" in response.content.decode()
    with pytest.raises(Unauthenticated, match="was revoked"):
        authenticate_token(raw=first.secret)
    assert authenticate_token(raw=second.secret)[0] == erin
    # and neither the list nor a token's page shows a hash or a secret
    pages = (
        response.content.decode()
        + admin_client.get(f"/admin/tenancy/apitoken/{second.token.pk}/change/").content.decode()
    )
    for issued in (first, second):
        row = ApiToken.objects.get(pk=issued.token.pk)
        assert row.key_hash not in pages
        assert issued.secret not in pages
    assert first.token.prefix in pages


def test_only_a_tokens_rate_limit_can_be_changed_in_the_admin(admin_client):
    # given a token
    team = TeamFactory(slug="vision")
    erin = MembershipFactory(team=team, user=UserFactory(username="erin")).user
    issued = create_api_token(user=erin, team=team, scopes=["read"])
    url = f"/admin/tenancy/apitoken/{issued.token.pk}/change/"
    # when staff try to add one, or to widen its scopes while setting its gateway rate limit
    adding = admin_client.get("/admin/tenancy/apitoken/add/")
    saving = admin_client.post(url, {"scopes": '["read", "infer"]', "name": "x", "requests_per_minute": "120"})
    refused = admin_client.post(url, {"requests_per_minute": "0"})
    # then adding is refused, the scopes and name stay, the limit is set (and audited); 0 is refused
    assert (adding.status_code, saving.status_code) == (403, 302)
    token = ApiToken.objects.get(pk=issued.token.pk)
    assert (token.scopes, token.name, token.requests_per_minute) == (["read"], "", 120)
    entry = AuditEntry.objects.get(action="token.rate_limit_changed")
    assert (entry.before, entry.after) == ({"requests_per_minute": None}, {"requests_per_minute": 120})
    assert refused.status_code == 200 and ApiToken.objects.get(pk=issued.token.pk).requests_per_minute == 120


def test_revoking_a_revoked_token_says_so(admin_client):
    # given a revoked token
    team = TeamFactory(slug="vision")
    erin = MembershipFactory(team=team, user=UserFactory(username="erin")).user
    issued = create_api_token(user=erin, team=team)
    ApiToken.objects.filter(pk=issued.token.pk).update(is_revoked=True)
    # when
    response = admin_client.post(
        "/admin/tenancy/apitoken/", {"action": "revoke_tokens", "_selected_action": [issued.token.pk]}, follow=True
    )
    # then
    assert f"Already revoked: {issued.token.prefix}…" in response.content.decode()


# --- staff only -----------------------------------------------------------------------


def _admin_pages() -> list[str]:
    """The index, and the list and add pages of every model in the admin."""
    pages = ["/admin/"]
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        pages += [reverse("admin:{}_{}_changelist".format(*info)), reverse("admin:{}_{}_add".format(*info))]
    return pages


def test_only_staff_reach_the_admin(client):
    # given a member of a team (an admin of it) who is not staff, logged in; and an anonymous client
    team = TeamFactory(slug="vision")
    frank = UserFactory(username="frank")
    MembershipFactory(team=team, user=frank, role=Role.ADMIN)
    member = Client()
    member.force_login(frank)
    pages = _admin_pages()
    assert "/admin/tenancy/team/" in pages and "/admin/deployments/cluster/" in pages
    for page in pages:
        # when
        for who in (member, client):
            response = who.get(page)
            # then: the admin's login page instead
            assert response.status_code == 302, page
            assert response["Location"].startswith("/admin/login/?next="), page


def test_a_user_who_is_not_staff_cannot_log_in_to_the_admin(client):
    # given a user who is not staff
    UserFactory(username="frank")
    # when they log in on the admin's login page
    response = client.post("/admin/login/?next=/admin/", {"username": "frank", "password": "pw-for-tests-1"})
    # then the login is refused (no session), and the admin stays closed
    assert response.status_code == 200
    assert "correct username and password for a staff account" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert client.get("/admin/tenancy/team/").status_code == 302


def test_staff_log_in_and_see_the_themed_admin(client):
    # given a staff user
    UserFactory(username="grace", is_staff=True, is_superuser=True)
    # when
    response = client.post("/admin/login/?next=/admin/", {"username": "grace", "password": "pw-for-tests-1"})
    # then
    assert response.status_code == 302
    page = client.get("/admin/tenancy/team/")
    assert page.status_code == 200
    assert "/static/unfold/css/styles.css" in page.content.decode()


# --- the theme's static files ---------------------------------------------------------


def test_the_themes_static_files_are_served_and_collected(client, settings, tmp_path):
    # when the theme's stylesheet is asked for (WhiteNoise, from the app's folder)
    response = client.get("/static/unfold/css/styles.css")
    # then
    assert response.status_code == 200
    shipped = Path(unfold.__file__).parent / "static" / "unfold" / "css" / "styles.css"
    assert b"".join(response.streaming_content) == shipped.read_bytes()
    # and collectstatic (make demo runs it) copies it
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", interactive=False, verbosity=0)
    assert (tmp_path / "static" / "unfold" / "css" / "styles.css").is_file()


def test_the_last_admin_of_a_team_cannot_be_deleted_in_the_admin(admin_client):
    # given carol, the one admin of team vision, and bob, a developer there
    team = TeamFactory(slug="vision")
    carol = MembershipFactory(team=team, user=UserFactory(username="carol"), role="admin").user
    MembershipFactory(team=team, user=UserFactory(username="bob"), role="developer")
    # when staff try to delete her
    page = admin_client.get(f"/admin/auth/user/{carol.pk}/delete/")
    posted = admin_client.post(f"/admin/auth/user/{carol.pk}/delete/", {"post": "yes"})
    # then the page names the team as protected, and she stays
    assert "team vision: its last admin; make another member admin first" in page.content.decode()
    assert posted.status_code == 200  # the "cannot delete" page again
    assert get_user_model().objects.filter(pk=carol.pk).exists()
    assert Membership.objects.filter(team=team, user=carol, role="admin").exists()

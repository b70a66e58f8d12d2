"""Roles: every write of every app checks the caller's role in the object's team, in the service."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from conch.errors import Forbidden
from deployments import services as deployments
from deployments.services.requests import DeploymentRequest, PlacementRequest
from models_registry import services as registry
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.tiny_models import add_constant, onnx_like

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_objects(tmp_path):
    """Team acme's model `adder` with a built version and a pending local deployment `web` of it."""
    team = TeamFactory(slug="acme")
    owner = UserFactory(username="owner")
    MembershipFactory(user=owner, team=team, role="developer")
    version = write_built_version(team, "adder", add_constant(tmp_path / "adder.onnx", 1.0))
    deployment = deployments.create_deployment(
        user=owner,
        request=DeploymentRequest(
            team_slug="acme", name="web", model_version_id=version.pk, placement=PlacementRequest(runtime="local")
        ),
    )
    return version, deployment


def _write(client: APIClient, write: str, version, deployment):
    """Send the API request of one kind of write; returns the response."""
    if write == "create model":
        return client.post("/api/v1/models/", {"team": "acme", "name": "fresh"}, format="json")
    if write == "upload version":
        body = {"file": SimpleUploadedFile("model.onnx", onnx_like(b"not really onnx"))}
        return client.post(f"/api/v1/models/{version.model_id}/versions/", body, format="multipart")
    if write == "rebuild":
        return client.post(f"/api/v1/versions/{version.pk}/rebuild/", {}, format="json")
    if write == "create deployment":
        body = {"team": "acme", "name": "second", "model_version": version.pk, "runtime": "local"}
        return client.post("/api/v1/deployments/", body, format="json")
    if write == "scale":
        return client.patch(f"/api/v1/deployments/{deployment.pk}/", {"replicas": 2}, format="json")
    if write == "stop":
        return client.delete(f"/api/v1/deployments/{deployment.pk}/")
    if write == "infer":
        return client.post(f"/api/v1/deployments/{deployment.pk}/infer", {"inputs": []}, format="json")
    if write == "delete version":
        return client.delete(f"/api/v1/versions/{version.pk}/")
    if write == "delete model":
        return client.delete(f"/api/v1/models/{version.model_id}/")
    raise AssertionError(write)


#: What each write answers a caller it lets through (nothing here starts a Triton): the status and the action
#: its 403 names for a viewer.
WRITES = {
    "create model": (201, "Registering a model"),
    "upload version": (201, "Uploading a model version"),
    "rebuild": (202, "Rebuilding a model version"),
    "create deployment": (201, "Creating a deployment"),
    "scale": (400, "Changing a deployment"),  # a local deployment has no replicas: past the role check
    "stop": (202, "Stopping a deployment"),
    "infer": (409, "Sending an inference request"),  # pending, not ready: past the role check
    "delete version": (409, "Deleting a model version"),  # deployment `web` uses it: past the role check
    "delete model": (409, "Deleting a model"),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_viewer_gets_403_naming_the_developer_role_for_each_write(write, acme_objects):
    # given a viewer of acme with a token of every scope
    version, deployment = acme_objects
    viewer = make_caller("vera", "acme", role="viewer")
    # when
    response = _write(viewer.client, write, version, deployment)
    # then
    assert response.status_code == 403, response.json()
    action = WRITES[write][1]
    assert response.json() == {
        "detail": f"{action} needs the developer role in team 'acme'; you are a viewer.",
        "field": None,
    }


@pytest.mark.parametrize("role", ["developer", "admin"])
@pytest.mark.parametrize("write", list(WRITES))
def test_developers_and_admins_get_past_the_role_check_of_each_write(write, role, acme_objects):
    version, deployment = acme_objects
    caller = make_caller("dana", "acme", role=role)
    response = _write(caller.client, write, version, deployment)
    assert response.status_code == WRITES[write][0], response.content


@pytest.mark.parametrize("write", list(WRITES))
def test_a_staff_user_outside_the_team_is_a_platform_admin(write, acme_objects):
    # given a staff user who is in no team, with a console session (no token)
    version, deployment = acme_objects
    staff = UserFactory(username="root", is_staff=True)
    client = APIClient()
    client.force_authenticate(staff)
    # when / then: every write of team acme gets past the role check
    response = _write(client, write, version, deployment)
    assert response.status_code == WRITES[write][0], response.content


def test_viewers_read_what_their_team_has(acme_objects):
    version, deployment = acme_objects
    viewer = make_caller("vera", "acme", role="viewer")
    assert viewer.client.get(f"/api/v1/deployments/{deployment.pk}/").status_code == 200
    assert viewer.client.get(f"/api/v1/versions/{version.pk}/").status_code == 200
    assert [m["name"] for m in viewer.client.get("/api/v1/models/").json()["results"]] == ["adder"]


def test_the_service_itself_refuses_a_viewer_whatever_the_edge(acme_objects):
    # given a viewer calling the services directly (a console page, a command, a task)
    version, deployment = acme_objects
    viewer = make_caller("vera", "acme", role="viewer")
    # when / then
    with pytest.raises(Forbidden, match="Stopping a deployment needs the developer role in team 'acme'"):
        deployments.request_stop(user=viewer.user, deployment=deployment)
    with pytest.raises(Forbidden, match="Uploading a model version needs the developer role"):
        registry.reserve_version(model=version.model, user=viewer.user)
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"
    assert version.model.versions.count() == 1


def test_a_user_in_two_teams_has_the_role_of_each(acme_objects):
    # given a viewer of acme who develops in globex
    version, deployment = acme_objects
    user = UserFactory(username="gil")
    MembershipFactory(user=user, team=deployment.team, role="viewer")
    MembershipFactory(user=user, team=TeamFactory(slug="globex"), role="developer")
    client = APIClient()
    client.force_authenticate(user)
    # when / then
    assert client.post("/api/v1/models/", {"team": "globex", "name": "mine"}, format="json").status_code == 201
    refused = client.post("/api/v1/models/", {"team": "acme", "name": "mine"}, format="json")
    assert refused.status_code == 403
    assert "needs the developer role in team 'acme'; you are a viewer" in refused.json()["detail"]


def test_create_team_refuses_unknown_users_before_writing_or_creates_them_when_asked(db):
    import io

    import pytest
    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    from tenancy.models import Membership, Team

    with pytest.raises(CommandError, match="No user 'alice', 'bob'; create them with --create-users"):
        call_command("create_team", "research", "--member", "alice", "--viewer", "bob", stdout=io.StringIO())
    assert not Team.objects.filter(slug="research").exists()
    out = io.StringIO()
    call_command("create_team", "research", "--member", "alice", "--viewer", "bob", "--create-users", stdout=out)
    assert "user alice created without a password: manage.py changepassword alice" in out.getvalue()
    assert not get_user_model().objects.get(username="alice").has_usable_password()
    assert sorted(Membership.objects.filter(team__slug="research").values_list("user__username", "role")) == [
        ("alice", "developer"),
        ("bob", "viewer"),
    ]

"""The admin console of deployments and clusters: the stop action (the API's stop), clusters under the theme.
Through Django's test client, logged in as a superuser (pytest-django's `admin_client`)."""

from __future__ import annotations

import pytest

from deployments.models import Cluster, Deployment
from models_registry.models import ModelVersion, RegisteredModel
from tenancy.quotas import team_usage
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db

DEPLOYMENTS = "/admin/deployments/deployment/"


def _ready_deployment(team, name: str) -> Deployment:
    """A local deployment's row marked ready, with no Triton behind it (its runtime state is empty: stopping it
    ends no process)."""
    model, _ = RegisteredModel.objects.get_or_create(team=team, name="m")
    version, _ = ModelVersion.objects.get_or_create(model=model, number=1, defaults={"status": "built"})
    return Deployment.objects.create(team=team, name=name, model_version=version, runtime="local", status="ready")


def _deployments(team) -> int:
    return next(line.used for line in team_usage(team=team) if line.field == "deployments")


def test_the_stop_action_stops_the_selected_deployments_as_the_api_does(
    admin_client, eager_tasks, django_capture_on_commit_callbacks
):
    # given two ready deployments of a team, and one of another team
    vision = TeamFactory(slug="vision")
    first, second = _ready_deployment(vision, "one"), _ready_deployment(vision, "two")
    other = _ready_deployment(TeamFactory(slug="nlp"), "three")
    assert _deployments(vision) == 2
    # when staff stop the first two (the stop task runs when the transaction commits)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        response = admin_client.post(
            DEPLOYMENTS, {"action": "stop_deployments", "_selected_action": [first.pk, second.pk]}, follow=True
        )
    # then both are stopped by the stop task, their quota is free, the other runs on
    assert response.status_code == 200
    assert "Stopping 2 deployment(s): vision/one, vision/two." in response.content.decode()
    assert len(queued) == 2
    for deployment in (first, second):
        deployment.refresh_from_db()
        assert (deployment.desired_state, deployment.status, deployment.status_message) == (
            "stopped",
            "stopped",
            "stopped",
        )
    assert _deployments(vision) == 0
    other.refresh_from_db()
    assert (other.desired_state, other.status) == ("running", "ready")


def test_the_stop_action_asks_for_the_stop_and_leaves_the_rest_to_the_task(admin_client):
    # given a ready deployment
    deployment = _ready_deployment(TeamFactory(slug="vision"), "one")
    # when staff stop it and no task runs yet
    admin_client.post(DEPLOYMENTS, {"action": "stop_deployments", "_selected_action": [deployment.pk]})
    # then it is stopping, as after the API's stop
    deployment.refresh_from_db()
    assert (deployment.desired_state, deployment.status) == ("stopped", "stopping")


def test_stopping_a_stopped_deployment_says_so(admin_client):
    # given a stopped deployment
    deployment = _ready_deployment(TeamFactory(slug="vision"), "one")
    Deployment.objects.filter(pk=deployment.pk).update(status="stopped", desired_state="stopped")
    # when
    response = admin_client.post(
        DEPLOYMENTS, {"action": "stop_deployments", "_selected_action": [deployment.pk]}, follow=True
    )
    # then
    assert "Already stopped: vision/one." in response.content.decode()
    deployment.refresh_from_db()
    assert deployment.status == "stopped"


def test_clusters_stay_in_the_admin_under_the_theme(admin_client):
    # given a registered cluster (in-cluster credentials: nothing to decrypt)
    Cluster.objects.create(name="gpu-east", namespace="conch", in_cluster=True)
    # when
    listing = admin_client.get("/admin/deployments/cluster/")
    adding = admin_client.get("/admin/deployments/cluster/add/")
    # then
    assert listing.status_code == 200
    assert "gpu-east" in listing.content.decode()
    assert adding.status_code == 200
    for page in (listing, adding):
        assert "/static/unfold/css/styles.css" in page.content.decode()
    assert 'name="kubeconfig"' in adding.content.decode()


def test_deployments_are_read_only_in_the_admin(admin_client):
    # given a ready deployment of 1 replica
    deployment = _ready_deployment(TeamFactory(slug="vision"), "one")
    # when staff try to add one, or to save another replica count over it (which no quota check would see)
    adding = admin_client.get(f"{DEPLOYMENTS}add/")
    saving = admin_client.post(f"{DEPLOYMENTS}{deployment.pk}/change/", {"replicas": 9, "status": "ready"})
    # then neither is allowed; the page still shows it
    assert adding.status_code == 403
    assert saving.status_code == 403
    deployment.refresh_from_db()
    assert deployment.replicas == 1
    assert admin_client.get(f"{DEPLOYMENTS}{deployment.pk}/change/").status_code == 200


def test_staff_read_gateway_usage_in_the_admin_and_cannot_change_it(admin_client):
    # given a day of gateway use by a token on a deployment
    import datetime as dt

    from deployments.models import GatewayUsage
    from tenancy.services import create_api_token
    from tests.factories import MembershipFactory, UserFactory

    team = TeamFactory(slug="vision")
    user = MembershipFactory(team=team, user=UserFactory(username="ivy")).user
    token = create_api_token(user=user, team=team, scopes=["infer"]).token
    deployment = _ready_deployment(team, "adder")
    GatewayUsage.objects.create(
        token=token, team=team, deployment=deployment, day=dt.date(2026, 11, 30), requests=7, inferences=21
    )
    # when staff open the list, and try to change the row
    page = admin_client.get("/admin/deployments/gatewayusage/")
    change = admin_client.post(f"/admin/deployments/gatewayusage/{GatewayUsage.objects.get().pk}/change/", {})
    # then the row is there with its figures, and it cannot be changed
    assert page.status_code == 200 and token.prefix in page.content.decode()
    assert ">21<" in page.content.decode()
    assert change.status_code == 403


def test_deployments_cannot_be_deleted_in_the_admin_only_stopped(admin_client):
    team = TeamFactory(slug="vision")
    deployment = _ready_deployment(team, "adder")
    page = admin_client.get(DEPLOYMENTS)
    assert "delete_selected" not in page.content.decode()
    refused = admin_client.post(f"{DEPLOYMENTS}{deployment.pk}/delete/", {"post": "yes"})
    assert refused.status_code == 403 and Deployment.objects.filter(pk=deployment.pk).exists()

"""The deploy step's data: what a team can deploy on, and "would it fit", which must refuse exactly as the create."""

from __future__ import annotations

import pytest

from conch.errors import QuotaExceeded
from deployments import services
from deployments.models import Deployment
from tenancy.quotas import set_quota

pytestmark = [pytest.mark.django_db]


def _body(caller, version, name: str, **extra) -> dict:
    return {"name": name, "team": caller.team.slug, "model_version": version.pk, "runtime": "local", **extra}


def test_would_it_fit_refuses_with_the_create_s_own_answer(alice, built_classifier):
    # given a team with room for 2 model instances, 1 in use
    set_quota(team=alice.team, limits={"instances": 2})
    assert alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "one"), format="json").status_code
    # when a deployment of 2 instances is checked, then created
    check = alice.client.post("/api/v1/deployments/check", _body(alice, built_classifier, "two", instance_count=2))
    create = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "two", instance_count=2))
    # then both refuse with the same body, and nothing was written by the check
    assert check.status_code == create.status_code == 409
    assert (
        check.json()
        == create.json()
        == {
            "detail": "Model instance quota exceeded: team 'acme' uses 1 of 2 model instances; this deployment needs 2",
            "field": "instances",
            "quota": {"limit": 2, "used": 1, "requested": 2},
        }
    )
    assert list(Deployment.objects.values_list("name", flat=True)) == ["one"]


def test_would_it_fit_service_raises_what_create_raises(alice, built_classifier):
    # given
    set_quota(team=alice.team, limits={"deployments": 0})
    request = {
        "user": alice.user,
        "team_slug": "acme",
        "name": "web",
        "model_version_id": built_classifier.pk,
    }
    # when
    with pytest.raises(QuotaExceeded) as checked:
        services.check_deployment_fits(**request)
    with pytest.raises(QuotaExceeded) as created:
        services.create_deployment(**request)
    # then
    assert (checked.value.detail, checked.value.field, checked.value.quota) == (
        created.value.detail,
        created.value.field,
        created.value.quota,
    )


def test_would_it_fit_says_yes_with_what_it_takes(alice, built_classifier):
    # when
    response = alice.client.post(
        "/api/v1/deployments/check", _body(alice, built_classifier, "web", instance_count=3), format="json"
    )
    # then
    assert response.status_code == 200
    assert response.json() == {"fits": True, "requested": {"deployments": 1, "instances": 3}}
    assert not Deployment.objects.exists()


def test_would_it_fit_names_the_field_of_a_bad_option_and_a_taken_name(alice, built_classifier):
    # given
    alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "web"), format="json")
    # when
    bad = alice.client.post("/api/v1/deployments/check", _body(alice, built_classifier, "x", instance_count=0))
    taken = alice.client.post("/api/v1/deployments/check", _body(alice, built_classifier, "web"), format="json")
    # then
    assert bad.status_code == 400 and bad.json()["field"] == "instance_count"
    assert taken.status_code == 409
    assert taken.json() == {"detail": "Team 'acme' already has an active deployment named 'web'.", "field": "name"}


def test_a_viewer_is_refused_by_the_check_as_by_the_create(built_classifier, alice):
    # given
    from tests.conftest import make_caller

    viewer = make_caller("victor", "acme", role="viewer")
    # when
    check = viewer.client.post("/api/v1/deployments/check", _body(viewer, built_classifier, "web"), format="json")
    create = viewer.client.post("/api/v1/deployments/", _body(viewer, built_classifier, "web"), format="json")
    # then
    assert check.status_code == create.status_code == 403
    assert check.json() == create.json()


def test_offers_list_runtimes_and_quota_use(alice, built_classifier):
    # given
    set_quota(team=alice.team, limits={"instances": 4})
    alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "web"), format="json")
    # when
    body = alice.client.get("/api/v1/deployments/offers?team=acme").json()
    # then
    assert body["runtimes"][0] == {
        "name": "local",
        "label": "This machine (a local Triton on the worker host)",
        "available": True,
        "reason": "",
    }
    kubernetes = body["runtimes"][1]
    assert kubernetes["name"] == "kubernetes" and not kubernetes["available"]
    assert "S3-compatible storage" in kubernetes["reason"]
    instances = next(line for line in body["quota"] if line["field"] == "instances")
    assert instances == {
        "field": "instances",
        "name": "Model instance",
        "unit": "model instances",
        "limit": 4,
        "used": 1,
        "free": 3,
        "is_default": False,
    }


def test_offers_of_another_team_are_not_found(alice, bob):
    response = bob.client.get("/api/v1/deployments/offers?team=acme")
    assert response.status_code == 404
    assert alice.client.get("/api/v1/deployments/offers").json()["field"] == "team"

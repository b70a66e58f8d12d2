"""The deploy step's data: what a team can deploy on, and "would it fit", which must refuse exactly as the create."""

from __future__ import annotations

import pytest

from conch.errors import QuotaExceeded
from deployments import services
from deployments.models import Deployment
from deployments.services.requests import DeploymentRequest
from models_registry.storage import get_object_store
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
    refusal = {
        "detail": "Model instance quota exceeded: team 'acme' uses 1 of 2 model instances; this deployment needs 2",
        "field": "instances",
        "quota": {"limit": 2, "used": 1, "requested": 2},
    }
    assert create.json() == refusal
    # (the check's body is the create's, plus the list of every refusal: here that one)
    assert check.json() == {**refusal, "errors": [refusal]}
    assert list(Deployment.objects.values_list("name", flat=True)) == ["one"]


def test_would_it_fit_service_raises_what_create_raises(alice, built_classifier):
    # given
    set_quota(team=alice.team, limits={"deployments": 0})
    request = DeploymentRequest(team_slug="acme", name="web", model_version_id=built_classifier.pk)
    # when
    with pytest.raises(QuotaExceeded) as checked:
        services.check_deployment_fits(user=alice.user, request=request)
    with pytest.raises(QuotaExceeded) as created:
        services.create_deployment(user=alice.user, request=request)
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
    requested = response.json()["requested"]
    storage = requested.pop("storage_bytes")
    assert response.json()["fits"] is True
    assert requested == {"deployments": 1, "instances": 3}
    assert not Deployment.objects.exists()
    # and the storage it takes is what its own repository holds once written
    created = alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "web", instance_count=3))
    row = Deployment.objects.get(pk=created.json()["id"])
    services.ensure_deployment_repository(deployment=row)
    store = get_object_store()
    own = services.deployment_repository_prefix(row.pk)
    assert storage == sum(store.size(key) for key in store.list_keys(own + "/"))


def test_would_it_fit_names_the_field_of_a_bad_option_and_a_taken_name(alice, built_classifier):
    # given
    alice.client.post("/api/v1/deployments/", _body(alice, built_classifier, "web"), format="json")
    # when
    bad = alice.client.post("/api/v1/deployments/check", _body(alice, built_classifier, "x", instance_count=0))
    taken = alice.client.post("/api/v1/deployments/check", _body(alice, built_classifier, "web"), format="json")
    # then
    assert bad.status_code == 400 and bad.json()["field"] == "instance_count"
    assert taken.status_code == 409
    refusal = {"detail": "Team 'acme' already has an active deployment named 'web'.", "field": "name"}
    assert taken.json() == {**refusal, "errors": [refusal]}


def test_a_viewer_is_refused_by_the_check_as_by_the_create(built_classifier, alice):
    # given
    from tests.conftest import make_caller

    viewer = make_caller("victor", "acme", role="viewer")
    # when
    check = viewer.client.post("/api/v1/deployments/check", _body(viewer, built_classifier, "web"), format="json")
    create = viewer.client.post("/api/v1/deployments/", _body(viewer, built_classifier, "web"), format="json")
    # then
    assert check.status_code == create.status_code == 403
    assert check.json() == {**create.json(), "errors": [create.json()]}


def test_the_check_names_every_refusal_at_once_the_first_as_before(alice, built_classifier):
    # given a team whose deployments quota is used up and that has room for 2 model instances
    set_quota(team=alice.team, limits={"deployments": 0, "instances": 2})
    # when a request with a bad name and 3 instances is checked
    body = _body(alice, built_classifier, "Not A Name", instance_count=3)
    check = alice.client.post("/api/v1/deployments/check", body, format="json")
    create = alice.client.post("/api/v1/deployments/", body, format="json")
    # then every refusal is listed, each naming its field, in the order the create checks them
    errors = check.json()["errors"]
    assert [error["field"] for error in errors] == ["name", "deployments", "instances"]
    assert errors[1] == {
        "detail": "Deployment quota exceeded: team 'acme' uses 0 of 0 deployments; this deployment needs 1",
        "field": "deployments",
        "quota": {"limit": 0, "used": 0, "requested": 1},
    }
    assert errors[2]["quota"] == {"limit": 2, "used": 0, "requested": 3}
    # and the body's own detail, field and status are the first refusal's: the create's answer
    assert check.status_code == create.status_code == 400
    assert {key: value for key, value in check.json().items() if key != "errors"} == create.json() == errors[0]
    assert not Deployment.objects.exists()


def test_the_check_names_kubernetes_fields_given_to_a_local_deployment_and_a_gpu_kind_without_gpus(
    alice, built_classifier, settings
):
    # given a machine without GPUs
    settings.CONCH_LOCAL_GPUS = "0"
    # when a local deployment is checked with two kubernetes-only fields and GPU instances
    body = _body(alice, built_classifier, "web", cluster="big", replicas=2, instance_kind="KIND_GPU")
    check = alice.client.post("/api/v1/deployments/check", body, format="json")
    # then the three are named at once
    assert check.status_code == 400
    assert check.json()["errors"] == [
        {"detail": "cluster applies to the kubernetes runtime only.", "field": "cluster"},
        {"detail": "replicas applies to the kubernetes runtime only.", "field": "replicas"},
        {
            "detail": "instance_kind KIND_GPU needs a GPU, and this machine (the local runtime's worker host) has "
            "none: choose KIND_CPU, or deploy on a Kubernetes cluster with GPUs.",
            "field": "instance_kind",
        },
    ]


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


def test_the_schema_documents_the_check_s_list_of_refusals(alice):
    # when the OpenAPI schema is read
    schema = alice.client.get("/api/v1/schema/?format=json").json()
    responses = schema["paths"]["/api/v1/deployments/check/"]["post"]["responses"]
    components = schema["components"]["schemas"]

    def component(ref: str) -> dict:
        return components[ref.rsplit("/", 1)[1]]

    # then each refusal status is the error body plus `errors`, a list of {"detail", "field", "quota"?}
    for status in ("400", "403", "404", "409", "503"):
        body = component(responses[status]["content"]["application/json"]["schema"]["$ref"])
        assert {"detail", "field", "quota", "errors"} <= set(body["properties"]), status
        assert set(body["required"]) == {"detail", "field", "errors"}
        item = component(body["properties"]["errors"]["items"]["$ref"])
        assert set(item["properties"]) == {"detail", "field", "quota"}
        assert set(component(item["properties"]["quota"]["allOf"][0]["$ref"])["properties"]) == {
            "limit",
            "used",
            "requested",
        }
    # and the create's body takes the instance kind
    create = schema["paths"]["/api/v1/deployments/"]["post"]["requestBody"]["content"]["application/json"]
    assert "instance_kind" in component(create["schema"]["$ref"])["properties"]

"""Team quotas: limits and defaults, the usage endpoint, setting limits (API, command), models and storage."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from tenancy.models import TeamQuota
from tenancy.quotas import quota_limits, set_quota
from tests.factories import UserFactory
from tests.tiny_models import onnx_like

pytestmark = pytest.mark.django_db


def _usage(caller) -> dict[tuple[str, str], dict]:
    response = caller.client.get(f"/api/v1/teams/{caller.team.slug}/usage")
    assert response.status_code == 200, response.content
    assert response.json()["team"] == caller.team.slug
    return {(line["field"], line["unit"]): line for line in response.json()["quotas"]}


def _staff_client() -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory(username="operator", is_staff=True))
    return client


def test_a_team_without_limits_uses_the_defaults_from_settings(alice, settings):
    # given
    settings.CONCH_QUOTA_GPUS = 3
    settings.CONCH_QUOTA_DEPLOYMENTS = 7
    # when
    usage = _usage(alice)
    # then
    assert usage[("gpu", "nvidia.com/gpu")] == {
        "field": "gpu",
        "unit": "nvidia.com/gpu",
        "limit": 3,
        "used": 0,
        "is_default": True,
    }
    assert usage[("deployments", "deployments")]["limit"] == 7
    assert set(usage) == {
        ("gpu", "nvidia.com/gpu"),
        ("instances", "model instances"),
        ("storage_bytes", "bytes of storage"),
        ("models", "models"),
        ("deployments", "deployments"),
    }


def test_usage_is_for_members_only(alice, bob):
    response = bob.client.get(f"/api/v1/teams/{alice.team.slug}/usage")
    assert response.status_code == 404


def test_staff_set_limits_with_patch_and_null_puts_one_back_to_the_default(alice, settings):
    # given
    settings.CONCH_QUOTA_MODELS = 20
    client = _staff_client()
    # when
    response = client.patch(f"/api/v1/teams/{alice.team.slug}/quota", {"models": 2, "gpu": 4}, format="json")
    # then
    assert response.status_code == 200, response.content
    lines = {line["field"]: line for line in response.json()["quotas"]}
    assert (lines["models"]["limit"], lines["models"]["is_default"]) == (2, False)
    assert lines["gpu"]["limit"] == 4
    assert quota_limits(team=alice.team)["models"] == (2, False)
    # when a limit is put back to the default
    response = client.patch(f"/api/v1/teams/{alice.team.slug}/quota", {"models": None}, format="json")
    # then
    assert quota_limits(team=alice.team)["models"] == (20, True)
    assert quota_limits(team=alice.team)["gpu"] == (4, False)


def test_members_cannot_set_limits(alice):
    response = alice.client.patch(f"/api/v1/teams/{alice.team.slug}/quota", {"models": 100}, format="json")
    assert response.status_code == 403
    assert not TeamQuota.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"models": -1}, "models"),
        ({"gpu": "many"}, "gpu"),
        ({"storage_bytes": 2**63}, "storage_bytes"),
        ({}, "request"),
    ],
)
def test_bad_limits_get_400_naming_the_field(alice, body, field):
    response = _staff_client().patch(f"/api/v1/teams/{alice.team.slug}/quota", body, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_set_quota_command_sets_and_resets_limits(alice, settings):
    # given
    settings.CONCH_QUOTA_INSTANCES = 16
    out = io.StringIO()
    # when
    call_command("set_quota", "acme", "--gpus", "2", "--storage-bytes", "1000", "--instances", "4", stdout=out)
    # then
    assert quota_limits(team=alice.team)["gpu"] == (2, False)
    assert quota_limits(team=alice.team)["storage_bytes"] == (1000, False)
    assert "instances      model instances          used 0 of 4" in out.getvalue()
    # when
    call_command("set_quota", "acme", "--instances", "default", stdout=io.StringIO())
    # then only that limit changed
    assert quota_limits(team=alice.team)["instances"] == (16, True)
    assert quota_limits(team=alice.team)["gpu"] == (2, False)
    with pytest.raises(CommandError, match="does not exist"):
        call_command("set_quota", "nope", "--gpus", "1")


def test_model_quota_refuses_the_next_model_with_409_and_the_quota(alice):
    # given
    set_quota(team=alice.team, limits={"models": 1})
    assert alice.client.post("/api/v1/models/", {"name": "one", "team": "acme"}, format="json").status_code == 201
    # when
    response = alice.client.post("/api/v1/models/", {"name": "two", "team": "acme"}, format="json")
    # then
    assert response.status_code == 409
    assert response.json() == {
        "detail": "Model quota exceeded: team 'acme' uses 1 of 1 models; this model needs 1",
        "field": "models",
        "quota": {"limit": 1, "used": 1, "requested": 1},
    }
    assert _usage(alice)[("models", "models")]["used"] == 1


def test_storage_quota_refuses_an_upload_that_does_not_fit_and_discards_it(alice):
    # given a model with one 100-byte version and a storage limit of 150 bytes
    set_quota(team=alice.team, limits={"storage_bytes": 150})
    model_id = alice.client.post("/api/v1/models/", {"name": "blob", "team": "acme"}, format="json").json()["id"]
    url = f"/api/v1/models/{model_id}/versions/"
    assert alice.client.post(url, {"file": SimpleUploadedFile("m.onnx", onnx_like(b"1" * 100))}).status_code == 201
    # when another 100 bytes are uploaded
    response = alice.client.post(url, {"file": SimpleUploadedFile("m.onnx", onnx_like(b"2" * 100))})
    # then (refused while streaming, once more bytes than the 50 free had arrived)
    assert response.status_code == 409
    assert response.json() == {
        "detail": "Storage quota exceeded: team 'acme' uses 100 of 150 bytes of storage; this upload needs at least "
        "100",
        "field": "storage_bytes",
        "quota": {"limit": 150, "used": 100, "requested": 100},
    }
    assert [version["number"] for version in alice.client.get(url).json()["results"]] == [1]
    assert _usage(alice)[("storage_bytes", "bytes of storage")]["used"] == 100
    # and a file that fits is still taken
    assert alice.client.post(url, {"file": SimpleUploadedFile("m.onnx", onnx_like(b"3" * 50))}).status_code == 201


def test_quota_changes_through_a_token_stay_in_its_team_and_need_both_write_scopes(alice, bob):
    # a staff user's tokens: one of bob's team with every scope, one read-only, one limited to a deployment
    from tenancy.services import create_api_token, ensure_membership

    staff = UserFactory(username="root-ish", is_staff=True)
    ensure_membership(team=bob.team, user=staff)
    full = create_api_token(user=staff, team=bob.team, name="full").secret
    read_only = create_api_token(user=staff, team=bob.team, name="ro", scopes=["read"]).secret
    narrow = create_api_token(user=staff, team=bob.team, name="narrow", deployments=["web"]).secret

    def patch(secret: str, slug: str):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client.patch(f"/api/v1/teams/{slug}/quota", {"gpu": 99}, format="json")

    # another team's quota cannot be touched through a token of bob's team
    assert patch(full, alice.team.slug).status_code == 404
    refused = patch(read_only, bob.team.slug)
    assert refused.status_code == 403 and "'models:write' scope" in refused.json()["detail"]
    assert patch(narrow, bob.team.slug).status_code == 403
    assert not TeamQuota.objects.exists()
    # a token of the team with every scope may
    assert patch(full, bob.team.slug).status_code == 200
    assert quota_limits(team=bob.team)["gpu"] == (99, False)

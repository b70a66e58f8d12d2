"""Pipelines through the REST API (POST /api/v1/pipelines/, POST /api/v1/pipelines/{id}/versions/): each version's
steps, built model versions of the team, checked as a graph against the configurations they serve, with every
problem told at once, and the ensemble's configuration generated; other teams see nothing."""

from __future__ import annotations

import pytest

from devtools.seed import add_constant, write_built_version
from tritonserving.config import config_from_pbtxt

pytestmark = pytest.mark.django_db


def _spec(first: int, second: int, **changes) -> dict:
    spec = {
        "inputs": {"input": {"datatype": "FP32", "dims": [4]}},
        "outputs": ["output"],
        "max_batch_size": 8,
        "steps": [
            {"name": "second", "model_version": second, "inputs": {"x": "between"}, "outputs": {"y": "output"}},
            {"name": "first", "model_version": first, "inputs": {"x": "input"}, "outputs": {"y": "between"}},
        ],
    }
    spec.update(changes)
    return spec


def test_a_pipeline_version_is_checked_ordered_and_its_ensemble_generated(alice, bob, tmp_path):
    one = write_built_version(alice.team, "plus-one", add_constant(tmp_path / "one.onnx", 1.0))
    two = write_built_version(alice.team, "plus-two", add_constant(tmp_path / "two.onnx", 2.0))
    created = alice.client.post("/api/v1/pipelines/", {"team": alice.team.slug, "name": "chain"}, format="json")
    assert created.status_code == 201, created.content
    pipeline = created.json()
    made = alice.client.post(f"/api/v1/pipelines/{pipeline['id']}/versions/", _spec(one.pk, two.pk), format="json")
    assert made.status_code == 201, made.content
    version = made.json()
    assert version["number"] == 1 and version["graph"]["order"] == ["first", "second"]
    assert version["graph"]["tensors"]["between"] == {"datatype": "FP32", "dims": [-1, 4], "producer": "first"}
    config = config_from_pbtxt(version["config_pbtxt"])
    assert config.platform == "ensemble" and config.name == "chain" and config.max_batch_size == 8
    assert [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step] == [
        ("plus-one", one.number),
        ("plus-two", two.number),
    ]
    # the pipeline lists its versions; another team sees neither
    shown = alice.client.get(f"/api/v1/pipelines/{pipeline['id']}/").json()
    assert [v["number"] for v in shown["versions"]] == [1]
    assert bob.client.get(f"/api/v1/pipelines/{pipeline['id']}/").status_code == 404
    assert bob.client.get("/api/v1/pipelines/").json()["results"] == []
    assert (
        alice.client.post("/api/v1/pipelines/", {"team": alice.team.slug, "name": "chain"}, format="json").status_code
        == 409
    )


def test_every_problem_of_a_pipeline_version_is_told_at_once(alice, bob, tmp_path):
    one = write_built_version(alice.team, "plus-one", add_constant(tmp_path / "one.onnx", 1.0))
    theirs = write_built_version(bob.team, "plus-two", add_constant(tmp_path / "two.onnx", 2.0))
    pipeline = alice.client.post("/api/v1/pipelines/", {"team": alice.team.slug, "name": "chain"}, format="json").json()
    url = f"/api/v1/pipelines/{pipeline['id']}/versions/"
    # another team's model version is not found, as if it did not exist
    refused = alice.client.post(url, _spec(one.pk, theirs.pk), format="json")
    assert refused.status_code == 400 and "does not exist or is not in one of your teams" in refused.json()["detail"]
    # a mis-typed input and an unused one, told together
    spec = _spec(
        one.pk,
        one.pk,
        inputs={"input": {"datatype": "FP16", "dims": [4]}, "mask": {"datatype": "BOOL", "dims": [1]}},
        steps=[{"name": "first", "model_version": one.pk, "inputs": {"x": "input"}, "outputs": {"y": "output"}}],
    )
    refused = alice.client.post(url, spec, format="json")
    assert refused.status_code == 400, refused.content
    details = [error["detail"] for error in refused.json()["errors"]]
    assert (
        "Step `first` expects FP32 [-1, 4] as its input 'x' (tensor 'input'); the pipeline input FP16 [-1, 4]."
        in details
    )
    assert "Pipeline input 'mask' is used by no step; map it to a step's input or remove it." in details
    # a malformed spec names its field
    refused = alice.client.post(url, {"inputs": {}, "outputs": [], "steps": []}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "inputs"
    refused = alice.client.post(url, {**_spec(one.pk, one.pk), "colour": "red"}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "colour"


def test_the_console_draws_a_pipeline_s_graph_and_lists_its_steps(alice, bob, tmp_path):
    from django.test import Client

    one = write_built_version(alice.team, "plus-one", add_constant(tmp_path / "one.onnx", 1.0))
    two = write_built_version(alice.team, "plus-two", add_constant(tmp_path / "two.onnx", 2.0))
    pipeline = alice.client.post("/api/v1/pipelines/", {"team": alice.team.slug, "name": "chain"}, format="json").json()
    alice.client.post(f"/api/v1/pipelines/{pipeline['id']}/versions/", _spec(one.pk, two.pk), format="json")
    browser = Client()
    browser.force_login(alice.user)
    listed = browser.get("/pipelines/").content.decode()
    assert f'href="/pipelines/{pipeline["id"]}/"' in listed and "first → second" in listed
    page = browser.get(f"/pipelines/{pipeline['id']}/").content.decode()
    assert (
        'data-testid="pipeline-graph"' in page and 'data-node="in:input"' in page and 'data-node="out:output"' in page
    )
    assert 'data-node="first"' in page and "plus-one:1" in page and "<title>between FP32</title>" in page
    assert "<code>x</code> ← <code>between</code>" in page and "platform: &quot;ensemble&quot;" in page
    other = Client()
    other.force_login(bob.user)
    assert other.get(f"/pipelines/{pipeline['id']}/").status_code == 404

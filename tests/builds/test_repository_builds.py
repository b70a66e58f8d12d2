"""Triton model repositories built end to end (issue 20): uploaded through the API as a zip, every model's
config.pbtxt checked, the model named as the Conch model served as configured and verified on the session's warm
Triton; a configuration that disagrees with its model file fails its build naming model, tensor and field (builds
run inline, eager Celery)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from devtools.seed import add_constant
from tests.builds.test_archive_builds import _build, _log, _upload
from tests.builds.test_triton_repository import BATCHED, _model


def _zip(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(folder.rglob("*")):
            bundle.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


@pytest.mark.e2e
def test_a_repository_of_two_models_serves_the_one_named_as_configured(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a Triton model repository of two ONNX models, one with a config.pbtxt that batches, one without
    _model(tmp_path / "model_repository", "doubler", BATCHED)
    _model(tmp_path / "model_repository", "tripler", None, versions=(1, 2))
    # when it is uploaded as a version of the model named "doubler"
    version = _upload(alice, django_capture_on_commit_callbacks, "doubler", "repo.zip", _zip(tmp_path))
    # then that model is built as its config.pbtxt configures it, and verified on a real Triton
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "triton_repository" and build["conversion"] is None
    inspect = _log(build, "inspect")
    assert "the archive holds Triton model repository: model_repository" in inspect
    assert (
        "Triton model repository of 2 model(s): every config.pbtxt parsed with Triton's model_config.proto and "
        "checked against its folder"
    ) in inspect
    assert (
        "model 'tripler': backend onnxruntime, version(s) 2, no config.pbtxt (auto-completed from the model file)"
        in (inspect)
    )
    assert "building doubler/1/model.onnx as its config.pbtxt configures it" in inspect
    configure = _log(build, "configure")
    assert "as configured: max_batch_size=16 dynamic_batching=on" in configure
    assert (
        "config.pbtxt: instance_group #: KIND_GPU made KIND_AUTO (a deployment's instance kind chooses CPU or GPU)"
        in (configure)
    )
    pbtxt = version["config_pbtxt"]
    assert "max_batch_size: 16" in pbtxt and "preferred_batch_size: 4" in pbtxt and "preferred_batch_size: 8" in pbtxt
    assert "max_queue_delay_microseconds: 500" in pbtxt and "count: 2" in pbtxt and "platform" not in pbtxt
    assert any(line.startswith("batching proven") for line in _log(build, "verify"))
    # and the repository's other model became a model of the team, with a version built from its folder
    assert "model 'tripler': registered as Conch model 'tripler' (new), version 1 (id " in "\n".join(inspect)
    models = {m["name"]: m for m in alice.client.get("/api/v1/models/").json()["results"]}
    [other] = alice.client.get(f"/api/v1/models/{models['tripler']['id']}/versions/").json()["results"]
    assert other["status"] == "built", other["error"]
    other_build = _build(alice, other["id"])
    assert other_build["source_format"] == "triton_repository"
    assert (
        "config.pbtxt: config.pbtxt configures no inputs: took 1 from the model file, as Triton's auto-complete does"
        in (_log(other_build, "configure"))
    )
    assert "model 'tripler': skipped version 1 (not served by the version policy), as Triton does" in _log(
        other_build, "inspect"
    )


@pytest.mark.e2e
def test_a_repositorys_other_models_are_registered_once_and_those_conch_cannot_serve_are_left_out_saying_why(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    repository = tmp_path / "repo"
    _model(repository, "doubler", BATCHED)
    _model(repository, "Text_Scorer", None)
    (repository / "legacy" / "1" / "model.savedmodel").mkdir(parents=True)
    (repository / "legacy" / "1" / "model.savedmodel" / "saved_model.pb").write_bytes(b"graph")
    (repository / "legacy" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\n')
    data = _zip(repository)
    version = _upload(alice, django_capture_on_commit_callbacks, "doubler", "repo.zip", data)
    assert version["status"] == "built", version["error"]
    inspect = "\n".join(_log(_build(alice, version["id"]), "inspect"))
    assert "model 'Text_Scorer': registered as Conch model 'text-scorer' (new), version 1" in inspect
    assert (
        "model 'legacy': not registered: it is a TensorFlow model; Triton's TensorFlow backend is deprecated" in inspect
    )
    # a rebuild of the same upload registers nothing twice: the folder packs to the same bytes
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(f"/api/v1/versions/{version['id']}/rebuild")
    assert response.status_code in (200, 202), response.content
    inspect = "\n".join(_log(_build(alice, version["id"]), "inspect"))
    assert "model 'Text_Scorer': already Conch model 'text-scorer' version 1 (the same folder); nothing registered" in (
        inspect
    )
    names = sorted(m["name"] for m in alice.client.get("/api/v1/models/").json()["results"])
    assert names == ["doubler", "text-scorer"]
    # and a rebuild that would set what config.pbtxt sets is refused before anything is queued
    response = alice.client.post(f"/api/v1/versions/{version['id']}/rebuild", {"instance_count": 3}, format="json")
    assert response.status_code == 400, response.content
    assert "instance_count configures the model, but this upload is a Triton model repository" in str(
        response.content, "utf-8"
    )


def test_a_configuration_that_disagrees_with_its_model_file_fails_the_build_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    _model(
        tmp_path, "doubler", BATCHED.replace("TYPE_FP32 dims: [ 4 ] } ]\noutput", "TYPE_FP16 dims: [ 4 ] } ]\noutput")
    )
    version = _upload(alice, django_capture_on_commit_callbacks, "doubler", "repo.zip", _zip(tmp_path))
    assert version["status"] == "failed" and version["error_field"] == "file"
    assert version["error"] == (
        "Triton model repository, model 'doubler': input 'x': data_type is TYPE_FP16 but the model file has FP32. "
        "Set data_type: TYPE_FP32."
    )


def test_a_build_option_that_config_pbtxt_sets_is_refused_naming_it(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    _model(tmp_path, "doubler", BATCHED)
    response = alice.client.post("/api/v1/models/", {"name": "doubler", "team": alice.team.slug}, format="json")
    from django.core.files.uploadedfile import SimpleUploadedFile

    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/",
            {"file": SimpleUploadedFile("repo.zip", _zip(tmp_path)), "max_batch_size": "4"},
        )
    version = alice.client.get(f"/api/v1/versions/{response.json()['id']}/").json()
    assert version["status"] == "failed" and version["error_field"] == "max_batch_size"
    assert version["error"].startswith(
        "max_batch_size configures the model, but this upload is a Triton model repository whose config.pbtxt"
    )


@pytest.mark.e2e
def test_every_version_a_repository_model_serves_becomes_a_version_of_the_conch_model_in_order(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given a model whose version policy serves all of its versions 1 (y = 2x), 2 (y = x + 1) and 3 (y = x + 2),
    # with a file beside its version folders
    folder = _model(tmp_path, "doubler", BATCHED.replace("latest { num_versions: 1 }", "all { }"))
    add_constant(folder / "2" / "model.onnx", 1.0)
    add_constant(folder / "3" / "model.onnx", 2.0)
    (folder / "labels.txt").write_text("a\nb\nc\nd\n")
    # when the folder is uploaded as a version of model "doubler"
    version = _upload(alice, django_capture_on_commit_callbacks, "doubler", "doubler.zip", _zip(tmp_path))
    # then this version is its version 1, and versions 2 and 3 become the next Conch versions, in order
    assert version["status"] == "built", version["error"]
    inspect = "\n".join(_log(_build(alice, version["id"]), "inspect"))
    assert (
        "model 'doubler' serves versions 1, 2, 3: this Conch version is its version 1, and each other one becomes "
        "the next version of 'doubler', in order"
    ) in inspect
    assert "model 'doubler' version 2: registered as Conch model 'doubler', version 2 (id " in inspect
    assert "model 'doubler' version 3: registered as Conch model 'doubler', version 3 (id " in inspect
    listed = alice.client.get(f"/api/v1/models/{version['model']}/versions/").json()["results"]
    by_number = {v["number"]: v for v in listed}
    assert sorted(by_number) == [1, 2, 3] and all(v["status"] == "built" for v in listed), listed
    # and each is built from its own version's file, its configuration serving that one version
    for number in (2, 3):
        build = _build(alice, by_number[number]["id"])
        log = _log(build, "inspect")
        assert "model 'doubler': backend onnxruntime, version(s) " + str(number) + ", config.pbtxt" in log
        assert f"building doubler/{number}/model.onnx as its config.pbtxt configures it" in log
        assert "version_policy" not in build["config_pbtxt"] and "max_batch_size: 16" in build["config_pbtxt"]
    # and a rebuild of version 1 registers no version twice
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(f"/api/v1/versions/{version['id']}/rebuild")
    inspect = "\n".join(_log(_build(alice, version["id"]), "inspect"))
    assert "model 'doubler' version 2: already Conch model 'doubler' version 2 (the same folder)" in inspect
    assert len(alice.client.get(f"/api/v1/models/{version['model']}/versions/").json()["results"]) == 3


SCORER = """
name: "scorer"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [
  { name: "probs__0" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "logits__1" data_type: TYPE_FP32 dims: [ 3 ] }
]
dynamic_batching { }
"""


@pytest.mark.e2e
def test_a_torchscript_model_in_a_repository_is_served_by_the_pytorch_backend_under_its_configured_names(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    from devtools import torch_models

    # given a repository model of Triton's pytorch backend: a TorchScript model.pt whose config.pbtxt names the
    # input by forward's argument index and the outputs by the backend's <name>__<index> convention
    folder = tmp_path / "scorer"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(SCORER)
    torch_models.torchscript(folder / "1" / "model.pt")
    # when it is uploaded
    version = _upload(alice, django_capture_on_commit_callbacks, "scorer", "scorer.zip", _zip(tmp_path))
    # then it is read by torch with the inputs config.pbtxt gives, served by the pytorch backend under the
    # configured names, and verified on Triton against torch
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    inspect = _log(build, "inspect")
    assert "inputs as config.pbtxt configures them: INPUT__0" in inspect
    assert "input INPUT__0: FP32 [-1, 5] axes [N, -]" in inspect
    assert (
        "output probs__0: FP32 [-1, 3] axes [N, -]" in inspect
        and "output logits__1: FP32 [-1, 3] axes [N, -]" in inspect
    )
    pbtxt = version["config_pbtxt"]
    assert 'backend: "pytorch"' in pbtxt and 'default_model_filename: "model.pt"' in pbtxt and "platform" not in pbtxt
    rows = {row["output"]: row for row in build["conversion"]["comparison"]}
    assert set(rows) == {"probs__0", "logits__1"} and all(row["ok"] for row in rows.values()), rows
    assert any(line.startswith("batching proven") for line in _log(build, "verify"))


@pytest.mark.e2e
def test_a_torchscript_repository_model_without_configured_inputs_fails_naming_the_model(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    from devtools import torch_models

    folder = tmp_path / "scorer"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "scorer"\nbackend: "pytorch"\nmax_batch_size: 8\n')
    torch_models.torchscript(folder / "1" / "model.pt")
    version = _upload(alice, django_capture_on_commit_callbacks, "scorer", "scorer.zip", _zip(tmp_path))
    assert version["status"] == "failed" and version["error_field"] == "file"
    assert "model 'scorer'" in version["error"] and "configures none" in version["error"], version["error"]

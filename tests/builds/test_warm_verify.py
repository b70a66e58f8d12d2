"""The build's verify step on the worker process's warm Triton: one server for many builds, replaced when it dies.

Builds run inline (eager Celery) in this process, so "the worker process" is the test process here.
"""

from __future__ import annotations

import os
import signal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds import services as builds
from models_registry.storage import FileObjectStore
from tests import real_models
from tritonserving import server as triton_server
from tritonserving import smoke
from tritonserving.client import TritonClient

pytestmark = [pytest.mark.django_db, pytest.mark.triton, pytest.mark.own_verify_server]


def _upload(caller, data: bytes, *, capture, name: str = "classifier") -> dict:
    response = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json")
    assert response.status_code == 201, response.content
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{response.json()['id']}/versions/", {"file": SimpleUploadedFile("model.onnx", data)}
        )
    assert response.status_code == 201, response.content
    return caller.client.get(f"/api/v1/versions/{response.json()['id']}/").json()


def _verify_servers(settings) -> list[triton_server.ServerProcess]:
    return triton_server.find_servers(f"{settings.CONCH_INSTANCE_ID}{builds.SERVER_ID_INFIX_VERIFY}")


def _leftovers(server: smoke.VerifyServer) -> tuple[list[dict], list]:
    """Models still loading/ready/unloading on the warm server, and what its scratch repository still holds."""
    assert server.wait_idle()
    process = server.process
    with TritonClient(process.http_url, api_key=process.api_key) as client:
        busy = [entry for entry in client.repository_index() if entry.get("state") in ("LOADING", "READY", "UNLOADING")]
    return busy, sorted(server.scratch_repository.iterdir())


def _verify_log(version: dict) -> list[str]:
    return next(step["log"] for step in version["steps"] if step["name"] == "verify")


def test_two_builds_verify_on_one_warm_server_that_unloads_after_each(
    alice, settings, eager_tasks, django_capture_on_commit_callbacks
):
    # given the worker process's warm-up, as Celery's worker_process_init runs it
    builds.warm_up_verify_server()
    warm = smoke.current_verify_server()
    warm.start()  # waits for the warm-up's start
    [started] = _verify_servers(settings)

    # when two models are built one after the other
    first = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks)
    after_first = (_verify_servers(settings), _leftovers(warm))
    second = _upload(
        alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks, name="second"
    )

    # then both verified on the server the warm-up started, which holds nothing after either build
    assert (first["status"], second["status"]) == ("built", "built"), (first["error"], second["error"])
    assert started.server_id.startswith(f"{settings.CONCH_INSTANCE_ID}.verify.{os.getpid()}-")
    assert after_first == ([started], ([], []))
    assert _verify_servers(settings) == [started]
    assert _leftovers(warm) == ([], [])
    for version, model in ((first, "classifier"), (second, "second")):
        log = _verify_log(version)
        load_name = f"{model}--v{version['id']}-a1-"
        assert any(f"into verify server {started.server_id} as {load_name}" in line for line in log), log
        assert any("output fetch_name_0: [1, 4]" in line for line in log)
        assert not any("started verify server" in line for line in log)


def test_a_build_after_the_warm_server_was_killed_verifies_on_a_new_one(
    alice, settings, eager_tasks, django_capture_on_commit_callbacks
):
    # given a build that verified on the warm server, which is then killed
    first = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks)
    [killed] = _verify_servers(settings)
    os.kill(killed.pid, signal.SIGKILL)

    # when the next build runs
    second = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks, name="b")

    # then it verified on a fresh server
    assert (first["status"], second["status"]) == ("built", "built"), second["error"]
    [replacement] = _verify_servers(settings)
    assert replacement.pid != killed.pid
    assert any(
        f"verify server {killed.server_id} (pid {killed.pid}) is replaced" in line for line in _verify_log(second)
    )
    assert any(f"started verify server {replacement.server_id}" in line for line in _verify_log(second))


def test_a_build_whose_model_fails_to_load_leaves_the_warm_server_usable(
    alice, settings, eager_tasks, django_capture_on_commit_callbacks, monkeypatch
):
    # given the object store writes a truncated model file into the repository (a storage fault)
    copy = FileObjectStore.copy

    def truncating_copy(store, src_key: str, dst_key: str) -> None:
        copy(store, src_key, dst_key)
        store.put_bytes(dst_key, store.read_bytes(dst_key)[:100_000])

    monkeypatch.setattr(FileObjectStore, "copy", truncating_copy)
    builds.warm_up_verify_server()
    warm = smoke.current_verify_server()
    server = warm.start()

    # when that build runs, and another one after the store is fixed
    broken = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks)
    monkeypatch.setattr(FileObjectStore, "copy", copy)
    good = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks, name="ok")

    # then the first failed at verify with Triton's reason, and the second built on the same server
    assert (broken["status"], broken["error_field"]) == ("failed", "file")
    assert broken["error"].startswith("Triton could not load the model: ")
    assert [step["status"] for step in broken["steps"]] == ["succeeded", "succeeded", "succeeded", "failed"]
    assert good["status"] == "built", good["error"]
    assert warm.process == server
    assert [found.pid for found in _verify_servers(settings)] == [server.pid]
    assert _leftovers(warm) == ([], [])


def test_the_worker_shutdown_hook_stops_the_warm_server(
    alice, settings, eager_tasks, django_capture_on_commit_callbacks
):
    # given a build verified on the warm server
    version = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks)
    assert version["status"] == "built", version["error"]
    [server] = _verify_servers(settings)

    # when the worker process shuts down
    builds.stop_warm_verify_server()

    # then the server and its scratch repository are gone
    assert _verify_servers(settings) == []
    assert not triton_server.is_alive(server.pid, server.create_time)
    assert list((settings.CONCH_TRITON_DIR / "verify").iterdir()) == []


def test_without_the_warm_server_a_build_verifies_on_a_throwaway_server(
    alice, settings, eager_tasks, django_capture_on_commit_callbacks
):
    # given the warm server is switched off
    settings.CONCH_VERIFY_WARM_SERVER = False

    # when a model is built
    version = _upload(alice, real_models.classifier().read_bytes(), capture=django_capture_on_commit_callbacks)

    # then it verified on a server of its own, stopped afterwards
    assert version["status"] == "built", version["error"]
    assert any(line.split(" ", 1)[1].startswith("started tritonserver pid ") for line in _verify_log(version))
    assert _verify_servers(settings) == []

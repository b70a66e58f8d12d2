"""`conch upload` against a live Conch with the resumable upload API, on folder storage and on S3 storage (the
moto S3 server over HTTP: parts go straight to the bucket with presigned URLs): parts in parallel, sha256 checked
by the server (the version's build), an interrupted upload resumed by running the same command again, and the
refusals' exit codes.

Tasks run inline (eager): completing an upload checks it and makes the version, whose build then fails at once
(these files are random bytes after ONNX's first two, which pass the check of a name and first bytes but are no
model), which
`--wait` reports with exit 5.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import signal
import socket
import threading
import time
import zlib
from urllib.parse import urlsplit

import httpx
import pytest
from conch_cli import transfer

from builds.services import current_build, current_options
from models_registry.models import ModelVersion
from models_registry.storage import get_object_store
from uploads.models import Upload

MIB = 1024 * 1024


@pytest.fixture(params=["folder", "s3"])
def storage(request, settings):
    """Folder storage (the default of the tests) or an S3 bucket on the moto server."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
        settings.CONCH_S3_ENDPOINT_URL = endpoint
        settings.CONCH_S3_ACCESS_KEY_ID = server.access_key
        settings.CONCH_S3_SECRET_ACCESS_KEY = server.secret_key
    return request.param


@pytest.fixture
def model_file(tmp_path):
    """A 13 MiB file of random bytes (three parts of 5 MiB, the last one shorter) and its sha256."""
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(13 * MIB))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def model(cli):
    result = cli("models", "create", "big", "--json")
    assert result.code == 0, result.err
    return result.json()


def random_model_bytes(size: int) -> bytes:
    """`size` random bytes that open like an ONNX file (field 1, ir_version 8), so `conch upload` sends them."""
    return b"\x08\x08" + os.urandom(size - 2)


def _stored_sha256(key: str) -> str:
    digest = hashlib.sha256()
    with get_object_store().open_reader(key) as handle:
        while piece := handle.read(MIB):
            digest.update(piece)
    return digest.hexdigest()


def test_upload_sends_parts_and_the_server_checks_the_sha256(cli, storage, model, model_file, eager_tasks):
    path, sha256 = model_file
    # when the file is uploaded in 5 MiB parts
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then the upload completed through the storage's own transport, and the version holds the same bytes
    assert result.code == 0, result.err
    body = result.json()
    upload, version = body["upload"], body["version"]
    assert upload["status"] == "completed" and upload["transport"] == ("s3" if storage == "s3" else "conch")
    assert (upload["sha256"], upload["size_bytes"], upload["part_count"]) == (sha256, 13 * MIB, 3)
    assert upload["version"] == version["id"] and version["model"] == model["id"]
    assert version["source"]["sha256"] == sha256 and version["source"]["size_bytes"] == 13 * MIB
    assert _stored_sha256(version["source"]["key"]) == sha256
    assert (body["sent_bytes"], body["resumed_parts"]) == (13 * MIB, 0)


def test_upload_wait_exits_5_when_the_build_fails(cli, storage, model, model_file, eager_tasks):
    path, _ = model_file
    result = cli("upload", str(model["id"]), path, "--wait")
    assert result.code == 5
    assert result.out.startswith(f"uploaded big:1 (version id {Upload.objects.get().version_id}): 13.0 MiB")
    assert "error: The build of version " in result.err


def test_upload_wait_on_a_file_changed_after_its_sha256_exits_5_with_the_server_s_message(
    cli, storage, model, model_file, eager_tasks, monkeypatch
):
    # given a file that changes (same size, other bytes) once the CLI has hashed it
    from conch_cli import main

    path, sha256 = model_file
    other = random_model_bytes(13 * MIB)

    def hash_then_change(file, progress):
        digest = transfer.file_sha256(file, progress)
        file.write_bytes(other)
        return digest

    class HashThenChange(transfer.BackgroundHash):
        """The hash of the file as it was, taken before any part is read; then the file changes."""

        def __init__(self, file):
            self.seconds, self._error = 0.0, None
            self._digest = hash_then_change(file, transfer.Progress())
            self._thread = threading.Thread(target=lambda: None)
            self._thread.start()

    monkeypatch.setattr(main, "BackgroundHash", HashThenChange)
    # when it is uploaded with --wait
    result = cli("upload", "big", path, "--part-size", "5M", "--wait")
    # then the upload completes (the size matches) and the build, which checks the sha256, fails: exit 5 with the
    # server's message naming sha256, expected and got, and what to do
    assert result.code == 5, result.err
    assert result.out.startswith("uploaded big:1 (version id ") and "its build checks it" in result.out
    got = hashlib.sha256(other).hexdigest()
    message = result.err.strip().splitlines()[-1]
    assert message.startswith("error: The build of version ")
    assert f"failed: The uploaded file's SHA-256 is {got}, not the {sha256} promised" in message
    assert "upload the file again (re-run `conch upload MODEL FILE`" in message
    assert message.endswith("(field: sha256)")


def test_an_upload_killed_midway_resumes_when_the_same_command_runs_again(
    cli_process, conch_env, storage, model, tmp_path, eager_tasks
):
    # given a 40 MiB file sent one 5 MiB part at a time at 8 MiB/s
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(40 * MIB))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    command = ["upload", "big", path, "--part-size", "5M", "--parallel", "1", "--limit-rate", "8M", "--json"]
    uploads = f"/api/v1/models/{model['id']}/uploads/"
    client = conch_env.caller.client
    # when the CLI is killed once the store holds two parts
    running = cli_process(*command, background=True)
    deadline = time.monotonic() + 60
    while True:
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "the store never held two parts"
        listing = client.get(uploads).json()
        open_uploads = listing["results"] if isinstance(listing, dict) else listing
        if open_uploads:
            upload = client.get(f"{uploads}{open_uploads[0]['id']}/").json()
            if len(upload["parts"]) >= 2:
                break
        time.sleep(0.1)
    running.send_signal(signal.SIGKILL)
    running.communicate(timeout=30)
    assert running.returncode == -signal.SIGKILL
    stored_before = len(client.get(f"{uploads}{upload['id']}/").json()["parts"])
    assert 2 <= stored_before < 8
    # and the same command runs again
    again = cli_process(*command)
    # then it resumed that upload, sent only the missing parts, and the version has the file's sha256
    assert again.code == 0, again.err
    assert f"resuming upload {upload['id']}: {stored_before} of 8 parts already stored" in again.err
    body = again.json()
    assert body["upload"]["id"] == upload["id"] and body["resumed_parts"] == stored_before
    assert body["sent_bytes"] == (8 - stored_before) * 5 * MIB
    assert body["version"]["source"]["sha256"] == sha256
    assert _stored_sha256(body["version"]["source"]["key"]) == sha256


def test_a_part_that_keeps_failing_exits_6_and_the_next_run_sends_only_it(
    cli, storage, model, model_file, monkeypatch, eager_tasks
):
    path, sha256 = model_file
    # given the network drops every PUT of part 2 (and two tries per part)
    monkeypatch.setattr(transfer, "PART_ATTEMPTS", 2)
    real_request = httpx.Client.request

    def flaky(self, method, url, *args, **kwargs):
        text = str(url)
        if method == "PUT" and ("partNumber=2&" in text or text.endswith("partNumber=2") or text.endswith("/parts/2")):
            raise httpx.ConnectError("connection reset (test)")
        return real_request(self, method, url, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "request", flaky)
    # when the upload runs: exit 6 naming the part
    failed = cli("upload", "big", path, "--part-size", "5M")
    assert failed.code == 6
    assert "part 2" in failed.err
    # and runs again once the network is back: only part 2 goes, and the version has the right sha256
    monkeypatch.setattr(httpx.Client, "request", real_request)
    again = cli("upload", "big", path, "--part-size", "5M", "--json")
    assert again.code == 0, again.err
    body = again.json()
    assert (body["resumed_parts"], body["sent_bytes"]) == (2, 5 * MIB)
    assert body["version"]["source"]["sha256"] == sha256


class StallingProxy:
    """A TCP proxy to `target` (host, port) that passes bytes both ways, except on the first connection whose bytes
    match `pattern` (a request line): from there it reads nothing more from that client and answers nothing, the
    connection held open, as a link whose bytes stopped moving. `url` is its address as http://localhost:PORT;
    `stalled` lists the request lines it held."""

    def __init__(self, target: tuple[str, int], pattern: bytes) -> None:
        self.target = target
        self.pattern = re.compile(pattern)
        self.stalled: list[bytes] = []
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        # small buffers, so a held connection fills them soon and the client's sending blocks
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.url = f"http://localhost:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._forward, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._forward, args=(upstream, client, False), daemon=True).start()

    def _forward(self, source: socket.socket, sink: socket.socket, watch: bool) -> None:
        tail = b""
        try:
            while data := source.recv(64 * 1024):
                found = self.pattern.search(tail + data) if watch and not self.stalled else None
                if found:
                    self.stalled.append(found.group(0))
                    return  # read no more: the client's bytes pile up in the buffers, then stop moving
                tail = data[-200:]
                sink.sendall(data)
        except OSError:
            return
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()


def test_a_part_whose_connection_stalls_is_sent_again_after_the_stall_timeout(
    cli, conch_env, storage, settings, model, model_file, eager_tasks
):
    path, sha256 = model_file
    # given a link that holds the first PUT of part 2 (the connection open, no byte moving) and passes the rest:
    # in front of Conch (folder storage: the parts go to Conch) or of the bucket (S3: presigned URLs to it)
    if storage == "s3":
        endpoint = urlsplit(settings.CONCH_S3_ENDPOINT_URL)
        proxy = StallingProxy((endpoint.hostname, endpoint.port), rb"PUT \S*partNumber=2[& ]")
        settings.CONCH_S3_PUBLIC_ENDPOINT_URL = proxy.url
        url = conch_env.url
    else:
        server = urlsplit(conch_env.url)
        proxy = StallingProxy((server.hostname, server.port), rb"PUT \S*/parts/2 ")
        url = proxy.url
    try:
        # when the file is uploaded with a stall timeout of 2 s (from the environment, as a user may set it)
        started = time.monotonic()
        result = cli("upload", "big", path, "--part-size", "5M", "--json", CONCH_URL=url, CONCH_STALL_TIMEOUT="2")
        took = time.monotonic() - started
    finally:
        proxy.close()
    # then part 2 was held once, sent again after about 2 s without progress, and the version has the file's sha256
    assert result.code == 0, result.err
    assert len(proxy.stalled) == 1, proxy.stalled
    assert 2 <= took < 30, took
    body = result.json()
    assert body["version"]["source"]["sha256"] == sha256
    assert _stored_sha256(body["version"]["source"]["key"]) == sha256


def test_an_open_upload_of_another_file_of_the_same_name_and_size_is_not_resumed(
    cli, conch_env, storage, model, model_file, eager_tasks
):
    import base64

    path, sha256 = model_file
    # given an open upload (as the wizard starts one: first bytes, no sha256) of another file of the same name and size
    other = random_model_bytes(path.stat().st_size)
    body = {"filename": path.name, "size_bytes": len(other), "head": base64.b64encode(other[:512]).decode()}
    started = conch_env.caller.client.post(f"/api/v1/models/{model['id']}/uploads/", body, format="json")
    assert started.status_code == 201, started.content
    # when this file is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then a new upload carried it whole, and the other upload is left as it was
    assert result.code == 0, result.err
    done = result.json()
    assert done["upload"]["id"] != started.json()["id"] and done["resumed_parts"] == 0
    assert done["upload"]["head_sha256"] == hashlib.sha256(path.read_bytes()[:512]).hexdigest()
    assert done["version"]["source"]["sha256"] == sha256
    assert Upload.objects.get(pk=started.json()["id"]).status == "uploading"


def test_a_file_over_the_storage_quota_is_refused_before_any_part_with_exit_4(
    cli, storage, model, model_file, settings
):
    path, _ = model_file
    settings.CONCH_QUOTA_STORAGE_BYTES = 10 * MIB
    result = cli("upload", "big", path, "--json")
    assert result.code == 4
    error = result.json()["error"]
    assert error["status"] == 409 and error["quota"]["limit"] == 10 * MIB
    assert error["quota"]["requested"] >= 13 * MIB


def test_a_file_over_the_upload_size_limit_exits_4_naming_size_bytes(cli, storage, model, model_file, settings):
    path, _ = model_file
    settings.CONCH_MAX_UPLOAD_BYTES = 8 * MIB
    result = cli("upload", "big", path, "--json")
    assert result.code == 4
    assert result.json()["error"]["status"] == 413 and result.json()["error"]["field"] == "size_bytes"


def test_a_conch_without_the_upload_api_gets_a_clear_error_and_exit_3(cli, model, model_file, settings):
    # given a server from before the resumable upload API
    settings.ROOT_URLCONF = "tests.cli.urls_without_uploads"
    path, _ = model_file
    # when the CLI uploads
    result = cli("upload", "big", path)
    # then it says so, and how to upload anyway, before hashing the file
    assert result.code == 3
    # (the last line: the live server's "Not Found" log may come before it in this process's stderr)
    message = result.err.strip().splitlines()[-1]
    assert message.startswith("error: This Conch server (http://")
    assert "[HTTP 404 from GET /api/v1/models/" in message and "sha256" not in result.err
    assert "has no resumable upload API" in message and "curl" in message


def test_ctrl_c_during_an_upload_says_how_to_resume_and_exits_130(cli_process, conch_env, model, tmp_path):
    # given a 40 MiB file sent one 5 MiB part at a time at 8 MiB/s
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(40 * MIB))
    command = ["upload", "big", path, "--part-size", "5M", "--parallel", "1", "--limit-rate", "8M"]
    uploads = f"/api/v1/models/{model['id']}/uploads/"
    client = conch_env.caller.client
    running = cli_process(*command, background=True)
    # when Ctrl-C (SIGINT) comes once the store holds two parts
    deadline = time.monotonic() + 60
    while True:
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "the store never held two parts"
        listing = client.get(uploads).json()
        open_uploads = listing["results"] if isinstance(listing, dict) else listing
        if open_uploads and len(client.get(f"{uploads}{open_uploads[0]['id']}/").json()["parts"]) >= 2:
            break
        time.sleep(0.1)
    running.send_signal(signal.SIGINT)
    _, err = running.communicate(timeout=60)
    # then it exits 130 saying how to go on and how many parts the store keeps
    assert running.returncode == 130, err
    said = " ".join(err.split())
    found = re.search(r"interrupted; run the same command again to resume \((\d+) of 8 parts stored\)", said)
    assert found, said
    # (the CLI counts the parts whose answer it read: the store's second part may have been in flight for it)
    assert 1 <= int(found.group(1)) < 8


class RecordingProgress(transfer.Progress):
    """Records each advance of the upload's progress with the time it came (monotonic seconds)."""

    def __init__(self) -> None:
        self.advances: list[tuple[float, int]] = []

    def start(self, label: str, total: int, done: int = 0) -> None:
        self.label, self.started = label, time.monotonic()

    def advance(self, count: int) -> None:
        self.advances.append((time.monotonic() - self.started, count))


def test_a_limited_upload_stores_parts_one_after_another_and_its_progress_counts_stored_parts(
    cli, model, tmp_path, monkeypatch, eager_tasks
):
    # given a 40 MiB file in 5 MiB parts sent at most 8 at a time over a 20 MiB/s link (the trial's case, smaller:
    # 8 parts started together share the link and are all stored at the end, so an interruption keeps none)
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(40 * MIB))
    progresses: list[RecordingProgress] = []
    monkeypatch.setattr(
        "conch_cli.output.progress_for_terminal", lambda quiet: progresses.append(RecordingProgress()) or progresses[-1]
    )
    # when it is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--limit-rate", "20M", "--json")
    # then the progress advanced only by whole stored parts, all eight of them
    assert result.code == 0, result.err
    advances = next(p for p in progresses if p.label.startswith("upload")).advances
    assert [count for _, count in advances] == [5 * MIB] * 8
    # and the parts were stored steadily: the first in the first third of the time, not all at the end
    times = [at for at, _ in advances]
    assert times[0] < times[-1] / 3, times


def test_a_limited_upload_without_a_part_size_asks_for_parts_of_about_two_seconds(cli, model, tmp_path, eager_tasks):
    # given a 20 MiB file and a 4 MiB/s limit
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(20 * MIB))
    # when it is uploaded without --part-size
    result = cli("upload", "big", path, "--limit-rate", "4M", "--json")
    # then the client asked for 8 MiB parts (not the server's 16 MiB), so 3 parts
    assert result.code == 0, result.err
    upload = result.json()["upload"]
    assert (upload["part_size_bytes"], upload["part_count"]) == (8 * MIB, 3)
    assert transfer.choose_part_size(1 * MIB) == 5 * MIB and transfer.choose_part_size(100 * MIB) == 16 * MIB


@pytest.mark.parametrize(
    ("name", "head", "says"),
    [
        ("weights.bin", os.urandom(64), "a .bin file is usually a weights file (no graph)"),
        ("notes.docx", b"some notes\n", "'notes.docx' is not a model file Conch builds: Conch builds ONNX model"),
        ("model.ckpt", b"PK\x03\x04" + os.urandom(60), "a .ckpt file is usually a training checkpoint"),
        ("model.onnx", b"PK\x03\x04" + os.urandom(60), "This is not an ONNX model: it looks like a ZIP archive"),
        ("model.onnx", b"just text, no model\n", "but this file begins with the bytes 6a 75 73 74 20 74 65 78"),
    ],
    ids=["bin", "txt", "ckpt", "zip-as-onnx", "text-as-onnx"],
)
def test_a_file_conch_cannot_build_is_refused_before_a_byte_is_sent(cli, model, tmp_path, name, head, says):
    # given a 6 MiB file that is not an ONNX model
    path = tmp_path / name
    path.write_bytes(head + os.urandom(6 * MIB))
    # when it is uploaded
    result = cli("upload", "big", path, "--json")
    # then the server's check refuses it (usage, exit 1) and the CLI says so naming the file, before it hashed or
    # sent a byte: nothing was stored
    assert result.code == 1, result.err
    error = result.json()["error"]
    assert (error["field"], error["status"], error["exit_code"]) == ("file", 400, 1)
    assert "[HTTP 400 from POST /api/v1/uploads/check/]" in cli("upload", "big", path).err
    assert error["detail"].startswith(f"{path}: ") and says in error["detail"], error["detail"]
    assert not Upload.objects.exists() and not ModelVersion.objects.exists()


def test_uploading_a_file_that_already_is_a_version_says_so_and_exits_0(cli, model, tmp_path, eager_tasks):
    # given a file uploaded once: version 1
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(6 * MIB))
    first = cli("upload", "big", path, "--json")
    assert first.code == 0, first.err
    version = first.json()["version"]
    assert first.json()["duplicate"] is False
    # when the same command runs again (a pipeline re-run)
    again = cli("upload", "big", path, "--json")
    # then it exits 0 with that version, said to be a duplicate, having sent nothing and left no upload open
    assert again.code == 0, again.err
    body = again.json()
    assert (body["duplicate"], body["version"]["id"], body["version"]["number"]) == (True, version["id"], 1)
    assert (body["upload"], body["sent_bytes"]) == (None, 0)
    assert Upload.objects.count() == 1 and ModelVersion.objects.count() == 1
    # and without --json it says so in a line
    said = cli("upload", "big", path)
    assert said.code == 0, said.err
    assert said.out == (
        f"model.onnx already is big:1 (version id {version['id']}, failed): no new version made "
        "(--new-version makes one)\n"
    )
    # and --wait waits for that version's build as usual (these bytes are no model: it failed)
    waited = cli("upload", "big", path, "--wait")
    assert waited.code == 5 and f"error: The build of version {version['id']} failed" in waited.err


def test_build_options_given_with_a_duplicate_are_said_not_applied_and_the_rebuild_it_prints_applies_them(
    cli, model, tmp_path, eager_tasks
):
    # given a file uploaded once with the default options: version 1
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(6 * MIB))
    first = cli("upload", "big", path, "--json")
    assert first.code == 0, first.err
    version = first.json()["version"]
    assert first.json()["build_options_applied"] is True and first.json()["rebuild_command"] is None
    # when the same file is uploaded again with -o max_batch_size=8
    again = cli("upload", "big", path, "-o", "max_batch_size=8")
    # then it says the options were not applied, and the command that applies them
    assert again.code == 0, again.err
    assert again.out.splitlines()[1] == (
        "the build options (-o max_batch_size=8) were not applied: big:1 keeps its own; to build it with them: "
        "conch builds rebuild big:1 -o max_batch_size=8"
    )
    as_json = cli("upload", "big", path, "-o", "max_batch_size=8", "--json").json()
    assert (as_json["duplicate"], as_json["build_options_applied"]) == (True, False)
    assert as_json["rebuild_command"] == "conch builds rebuild big:1 -o max_batch_size=8"
    # and that command, run as printed, rebuilds version 1 with them
    rebuilt = cli(*shlex.split(as_json["rebuild_command"])[1:])
    assert rebuilt.code == 0, rebuilt.err
    assert rebuilt.out == f"rebuild of big:1 (version id {version['id']}) queued with -o max_batch_size=8\n"
    stored = ModelVersion.objects.get(pk=version["id"])
    assert (current_options(stored)["max_batch_size"], current_build(stored).attempt) == (8, 2)


def test_new_version_uploads_the_same_file_as_the_next_version(cli, model, tmp_path, eager_tasks):
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(6 * MIB))
    assert cli("upload", "big", path).code == 0
    again = cli("upload", "big", path, "--new-version", "--json")
    assert again.code == 0, again.err
    body = again.json()
    assert (body["duplicate"], body["version"]["number"], body["sent_bytes"]) == (False, 2, 6 * MIB)
    assert body["upload"]["allow_duplicate"] is True


def test_a_duplicate_found_at_the_completion_aborts_the_upload_and_gives_the_version(
    conch_env, model, tmp_path, eager_tasks
):
    from conch_cli.api import ConchApi

    # given version 1 of a file, and the file sent again with its sha256 computed beside the parts (as a run that
    # did not find that version first does), so the server learns it at the completion
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(6 * MIB))
    with ConchApi(conch_env.url, conch_env.token) as api:
        options = dict(
            build_options={}, parallel=2, part_size=None, progress=transfer.Progress(), timeout_s=60, say=print
        )
        made = transfer.upload_file(api, model["id"], path, sha256=transfer.BackgroundHash(path), **options)
        # when
        again = transfer.upload_file(api, model["id"], path, sha256=transfer.BackgroundHash(path), **options)
    # then the upload it started is aborted (nothing stays reserved) and the result is version 1
    assert (again.duplicate, again.version["id"], again.upload["status"]) == (True, made.version["id"], "aborted")
    assert ModelVersion.objects.count() == 1


# --- Per-part CRC32 -------------------------------------------------------------------------------------------------


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_upload_sends_each_part_with_its_crc32(cli, storage, model, model_file, eager_tasks, request):
    path, sha256 = model_file
    # when the file is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then the upload asked for CRC32 per part, and every part was taken (the store checked each CRC32)
    assert result.code == 0, result.err
    body = result.json()
    assert body["upload"]["part_checksum_algorithm"] == "CRC32"
    assert Upload.objects.get().part_checksum_algorithm == "CRC32"
    assert body["version"]["source"]["sha256"] == sha256
    if storage == "s3":
        # and the object has S3's COMPOSITE CRC32 of the parts' CRC32s
        data = path.read_bytes()
        chunks = [data[start : start + 5 * MIB] for start in range(0, len(data), 5 * MIB)]
        composite = _crc32(b"".join(zlib.crc32(chunk).to_bytes(4, "big") for chunk in chunks))
        client = request.getfixturevalue("s3_client")
        _, bucket = request.getfixturevalue("s3_bucket")
        key = f"conch/{body['version']['source']['key']}"
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ChecksumCRC32"].split("-")[0] == composite


def _damage_part_2(monkeypatch, times: int) -> list[int]:
    """Flip a byte of the first `times` PUTs of part 2 on the way (a fault of the network, after the CLI read its
    CRC32); returns the status codes the store answered them."""
    real_request = httpx.Client.request
    answers: list[int] = []

    def damaged(pieces):
        first = True
        for piece in pieces:
            if first:
                piece, first = bytes([piece[0] ^ 0xFF]) + piece[1:], False
            yield piece

    def flaky(self, method, url, *args, **kwargs):
        if method == "PUT" and str(url).endswith("/parts/2") and len(answers) < times:
            kwargs["content"] = damaged(kwargs["content"])
            response = real_request(self, method, url, *args, **kwargs)
            answers.append(response.status_code)
            return response
        return real_request(self, method, url, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "request", flaky)
    return answers


def test_a_part_damaged_on_the_way_is_refused_by_the_store_and_sent_again(
    cli, model, model_file, monkeypatch, eager_tasks
):
    # given folder storage (Conch checks each part's CRC32, as S3 and MinIO do; moto does not) and a network that
    # damages the first PUT of part 2
    path, sha256 = model_file
    answers = _damage_part_2(monkeypatch, times=1)
    # when the file is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then the damaged copy was refused (400), the part sent again, and the version holds the file
    assert result.code == 0, result.err
    assert answers == [400]
    assert result.json()["version"]["source"]["sha256"] == sha256
    assert _stored_sha256(result.json()["version"]["source"]["key"]) == sha256


def test_a_part_the_store_keeps_refusing_is_reported_naming_it(cli, model, model_file, monkeypatch, eager_tasks):
    # given two tries per part and a network that damages part 2 every time
    path, _ = model_file
    monkeypatch.setattr(transfer, "PART_ATTEMPTS", 2)
    answers = _damage_part_2(monkeypatch, times=2)
    # when the file is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then it stops after the tries with exit 6 (as for a network error: running it again resends the part), naming
    # the part and the store's reason; the other parts are kept
    assert answers == [400, 400]
    assert result.code == 6, result.err
    error = result.json()["error"]
    assert error["field"] == "parts[2]"
    assert error["detail"].startswith("Part 2 failed 2 times: Part 2's ")
    assert "send part 2 again" in error["detail"]
    upload = Upload.objects.get()
    assert [part.number for part in get_object_store().list_parts(upload.object_key, upload.store_upload_id)] == [1, 3]


def test_an_upload_started_without_the_algorithm_resumes_without_checksums(
    cli, conch_env, storage, model, model_file, eager_tasks
):
    # given an open upload of the file started without part_checksum_algorithm (an older client), part 1 stored
    path, sha256 = model_file
    data = path.read_bytes()
    client = conch_env.caller.client
    base = f"/api/v1/models/{model['id']}/uploads/"
    started = client.post(
        base, {"filename": path.name, "size_bytes": len(data), "sha256": sha256, "part_size_bytes": 5 * MIB}, "json"
    ).json()
    assert started["part_checksum_algorithm"] is None
    (target,) = client.post(f"{base}{started['id']}/parts/", {"numbers": [1]}, "json").json()["parts"]
    if storage == "s3":
        assert httpx.put(target["url"], content=data[: 5 * MIB], headers=target["headers"]).status_code == 200
    else:
        assert (
            client.put(target["url"], data=data[: 5 * MIB], content_type="application/octet-stream").status_code == 200
        )
    # when `conch upload` runs on the same file
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    # then it resumed that upload, sending the other parts without checksums, and the version has the file
    assert result.code == 0, result.err
    body = result.json()
    assert body["upload"]["id"] == started["id"] and body["upload"]["part_checksum_algorithm"] is None
    assert (body["resumed_parts"], body["sent_bytes"]) == (1, 8 * MIB)
    assert body["version"]["source"]["sha256"] == sha256


def test_an_upload_another_client_completed_meanwhile_ends_with_its_version(
    conch_env, model, tmp_path, eager_tasks, monkeypatch
):
    from conch_cli.api import ConchApi

    # given two clients sending the same file at once: the second one (another pipeline) resumes the first one's
    # open upload and completes it while the first is about to send its parts
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(12 * MIB))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    options = dict(build_options={}, parallel=2, part_size=None, progress=transfer.Progress(), timeout_s=60)
    original = transfer.PartSender.send_missing
    other: dict = {}
    said: list[str] = []

    def other_client_first(sender):
        if not other:
            other["started"] = True  # (its own send_missing is the plain one)
            with ConchApi(conch_env.url, conch_env.token) as api:
                other["result"] = transfer.upload_file(api, model["id"], path, sha256=sha256, say=print, **options)
        return original(sender)

    monkeypatch.setattr(transfer.PartSender, "send_missing", other_client_first)
    # when the first client goes on
    with ConchApi(conch_env.url, conch_env.token) as api:
        first = transfer.upload_file(api, model["id"], path, sha256=sha256, say=said.append, **options)
    # then it ends with the version the other made from the same upload, saying so, and no second version exists
    assert other["result"].upload["id"] == first.upload["id"]
    assert first.version["id"] == other["result"].version["id"]
    assert any("was completed meanwhile by another client" in line for line in said), said
    assert ModelVersion.objects.count() == 1


@pytest.mark.parametrize("server_waits", [True, False], ids=["long-poll", "server-answers-at-once"])
def test_upload_waits_for_a_worker_s_check_that_ends_later(cli, model, model_file, monkeypatch, server_waits):
    from conch_cli.api import ConchApi

    from uploads import services as uploads

    # given no task runs inline: the check waits for a worker, here a thread that runs it 0.5 s after the upload
    # becomes `completing`
    path, sha256 = model_file
    if not server_waits:  # a Conch that answers at once, `wait` or not (one before the long poll)
        monkeypatch.setattr(uploads, "wait_for_check", lambda *, upload, wait_s: upload)
    asked: list[dict] = []
    original_get = ConchApi.get

    def recording_get(api, path, **kwargs):
        if "/uploads/" in path and path.endswith("/"):
            asked.append(kwargs.get("params") or {})
        return original_get(api, path, **kwargs)

    monkeypatch.setattr(ConchApi, "get", recording_get)
    checked: list[str] = []

    def worker() -> None:
        from django.db import connection

        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                upload = Upload.objects.filter(status="completing").first()
                if upload is not None:
                    time.sleep(0.5)
                    checked.append(uploads.finish_upload(upload_id=upload.pk))
                    return
                time.sleep(0.02)
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    # when the file is uploaded
    result = cli("upload", "big", path, "--part-size", "5M", "--json")
    thread.join()
    # then the CLI waited for the check and ends with the version it made
    assert result.code == 0, result.err
    assert checked == ["completed"]
    body = result.json()
    assert body["upload"]["status"] == "completed" and body["version"]["source"]["sha256"] == sha256
    # each GET of the completing upload asked the server to wait; a server that waits needed one, one that answers
    # at once was asked again after pauses
    assert asked and all(float(params["wait"]) > 0 for params in asked)
    assert len(asked) == 1 if server_waits else len(asked) > 1


def test_create_model_registers_a_missing_model_only_for_a_file_that_passes_the_check(cli, tmp_path, eager_tasks):
    from models_registry.models import RegisteredModel

    # a refused file registers nothing
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"some notes\n")
    assert cli("upload", "fresh", bad, "--create-model", "--json").code == 1
    assert not RegisteredModel.objects.filter(name="fresh").exists()
    # a good file registers the model, then becomes its version 1
    path = tmp_path / "model.onnx"
    path.write_bytes(random_model_bytes(6 * MIB))
    result = cli("upload", "fresh", path, "--create-model", "--json")
    assert result.code == 0, result.err
    body = result.json()
    assert body["model_created"] is True and body["version"]["number"] == 1
    assert body["version"]["model"] == RegisteredModel.objects.get(name="fresh").pk
    # run again, the model exists: it is used, not created again (and the file is that version already)
    again = cli("upload", "fresh", path, "--create-model", "--json")
    assert again.code == 0, again.err
    assert again.json()["model_created"] is False and again.json()["duplicate"] is True
    # without the flag, a missing model is still not found (exit 3)
    assert cli("upload", "other", path, "--json").code == 3
    # a pickle for a team not allowed pickles (the token's only team: no --team given) is refused by the file's
    # check, before a model is registered for it
    from devtools.tree_models import sklearn_model

    pickled = sklearn_model(tmp_path / "clf.joblib")
    refused = cli("upload", "pickled", pickled, "--create-model")
    assert refused.code == 1 and "Allow pickled models" in refused.err, refused.err
    assert "created" not in refused.err and "deleted again" not in refused.err, refused.err
    assert not RegisteredModel.objects.filter(name="pickled").exists()


def test_an_empty_file_is_refused_before_anything_is_asked(cli, model, tmp_path):
    # given an empty file
    path = tmp_path / "model.onnx"
    path.write_bytes(b"")
    # when it is uploaded, then it is refused (usage, exit 1) naming it, and nothing was stored
    result = cli("upload", "big", path, "--json")
    assert result.code == 1, result.err
    assert result.json()["error"]["detail"] == f"{path} is empty (0 bytes): there is no model in it to upload."
    assert not Upload.objects.exists()


@pytest.mark.e2e
def test_a_folder_is_zipped_reproducibly_uploaded_and_built_and_a_rerun_finds_its_version(
    cli, model, tmp_path, eager_tasks
):
    from tests.builds.test_inspection import save_model_with_external_weights

    # given a folder holding an ONNX model and its external data file
    folder = tmp_path / "adder"
    folder.mkdir()
    save_model_with_external_weights(folder)
    # when the folder is uploaded and its build waited for
    first = cli("upload", "big", folder, "--wait", "--json")
    # then it was packed into adder.zip, sent, unpacked by the build and built
    assert first.code == 0, first.err
    version = first.json()["version"]
    assert version["status"] == "built", version
    assert version["source"]["filename"] == "adder.zip"
    # when the same command runs again after the files were touched (their times change, their bytes do not)
    for path in folder.iterdir():
        os.utime(path, (1_000_000_000, 1_000_000_000))
    again = cli("upload", "big", folder, "--json")
    # then the zip is the same bytes: it is found to be that version, nothing is sent
    assert again.code == 0, again.err
    assert (again.json()["duplicate"], again.json()["version"]["id"]) == (True, version["id"])
    assert again.json()["sent_bytes"] == 0


def test_a_folder_with_no_file_or_with_a_link_outside_it_is_refused_before_anything_is_sent(cli, model, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("upload", "big", empty)
    assert result.code == 1 and f"{empty} holds no files" in result.err
    (tmp_path / "secret").write_text("x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "weights.bin").symlink_to(tmp_path / "secret")
    result = cli("upload", "big", linked)
    assert result.code == 1 and "links to" in result.err and "outside" in result.err
    assert Upload.objects.count() == 0


def test_several_bad_build_options_are_all_told_before_a_part_is_sent(cli, model, model_file):
    path, _ = model_file
    # when a file is uploaded with two options wrong on their own
    result = cli("upload", "big", path, "-o", "max_batch_size=lots", "-o", "instance_count=99")
    # then both are told, one per line, and nothing was stored
    assert result.code == 1, result.err
    assert (
        "max_batch_size must be a whole number" in result.err and "(field: build_options.max_batch_size)" in result.err
    )
    assert "instance_count must be between 1 and 16" in result.err
    assert "(field: build_options.instance_count)" in result.err
    assert not Upload.objects.exists()

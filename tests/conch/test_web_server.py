"""The console's web server as the demo starts it (`conch.processes.web_command`: `python -m conch.web`), in a
subprocess on 127.0.0.1 against the test database: slow clients hold no thread, stalled ones are cut off (408),
and sign-in, uploads, downloads and static files work through it."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from conch.processes import web_command
from tests.conftest import make_caller
from tests.services import free_port
from tests.tiny_models import onnx_like

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
SLOW_CLIENTS = 20  # more than the 2 x 4 threads of the gunicorn this replaced, and than the 16
LOGIN_FAILURE_LIMIT = 2
#: Seconds any answer may take here (a generous bound; the point is that one comes at all).
ANSWER_TIMEOUT = 30


@dataclass
class WebServer:
    url: str
    process: subprocess.Popen
    port: int

    def raw(self) -> socket.socket:
        """A plain TCP connection to the server."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_TIMEOUT)


def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[WebServer]:
    """`python -m conch.web` with two workers, short head/body timeouts, folder storage and a broker of its own."""
    var = tmp_path_factory.mktemp("web-var")
    with django_db_blocker.unblock():
        database_url = _database_url()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "CONCH_"))}
    env |= {
        "DATABASE_URL": database_url,
        "CONCH_VAR_DIR": str(var),  # the broker (filesystem) and the storage folder live here
        "CONCH_CACHE_URL": "locmem://",
        "CONCH_WEB_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "CONCH_WEB_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        "CONCH_LOGIN_FAILURE_LIMIT": str(LOGIN_FAILURE_LIMIT),
        "CONCH_WEB_WORKERS": "2",
    }
    port = free_port()
    log = (var / "web.log").open("wb")
    process = subprocess.Popen(
        web_command(Path(sys.executable).parent, port), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    server = WebServer(url=f"http://127.0.0.1:{port}", process=process, port=port)
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, (var / "web.log").read_text()
        try:
            if requests.get(f"{server.url}/accounts/login/", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, (var / "web.log").read_text()
        time.sleep(0.2)
    yield server
    process.terminate()
    process.wait(timeout=30)
    log.close()


def _slow_login_post(server: WebServer) -> socket.socket:
    """A connection that has sent the head of a sign-in POST declaring a 100,000-byte body, and one byte of it."""
    connection = server.raw()
    connection.sendall(
        b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\nu"
    )
    return connection


def _answer(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def test_slow_clients_do_not_keep_pages_or_the_api_from_answering(web):
    # given a user with a token, and twenty clients trickling the bodies of sign-in POSTs, faster than the body
    # timeout (a byte every 0.5 s) so that none is cut off
    caller = make_caller("slowpoke-victim", "acme")
    slow = [_slow_login_post(web) for _ in range(SLOW_CLIENTS)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def trickle() -> None:
        try:
            while not stop.wait(0.5):
                for connection in slow:
                    connection.sendall(b"x")
        except OSError as exc:
            failures.append(exc)

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        # when others ask for the sign-in page and an API list while those are open
        page = requests.get(f"{web.url}/accounts/login/", timeout=ANSWER_TIMEOUT)
        api = requests.get(
            f"{web.url}/api/v1/models/", headers={"Authorization": f"Bearer {caller.token}"}, timeout=ANSWER_TIMEOUT
        )
        # then both answer
        assert page.status_code == 200 and b"csrfmiddlewaretoken" in page.content
        assert api.status_code == 200 and api.json()["count"] == 0
        # and the slow clients are all still connected, still sending
        stop.wait(1.0)
        assert not failures
    finally:
        stop.set()
        trickler.join()
    for connection in slow:
        connection.close()


def test_a_stalled_body_is_cut_off_with_408_after_the_body_timeout_and_its_slot_freed(web):
    # given a client that sent the head of a sign-in POST and 10 bytes of its 100,000, then nothing more
    connection = _slow_login_post(web)
    connection.sendall(b"sername=x")
    started = time.monotonic()
    # when it waits
    answer = _answer(connection)
    waited = time.monotonic() - started
    connection.close()
    # then after the body timeout it got 408 saying why, and the connection was closed
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"stopped arriving for 3 s" in answer
    assert BODY_TIMEOUT * 0.9 <= waited < ANSWER_TIMEOUT
    # and the server goes on serving
    assert requests.get(f"{web.url}/accounts/login/", timeout=ANSWER_TIMEOUT).status_code == 200


def test_a_slow_head_is_cut_off_with_408_after_the_header_timeout(web):
    # given a client that sent half a request head and stopped
    connection = web.raw()
    connection.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    started = time.monotonic()
    # when it waits
    answer = _answer(connection)
    connection.close()
    # then it is answered 408 once the header timeout passed, and the connection closed
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert HEADER_TIMEOUT * 0.9 <= time.monotonic() - started < ANSWER_TIMEOUT


def test_a_declared_body_over_the_view_s_limit_is_refused_before_it_is_read(web):
    # given a sign-in POST declaring 10 GB, of which nothing is sent
    connection = web.raw()
    connection.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000000\r\n\r\n")
    # then it is answered 413 at once, naming the limit, and the connection closed
    answer = _answer(connection)
    connection.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"10000000000 bytes, larger than the 1 MiB" in answer


def test_a_chunked_body_over_the_view_s_limit_is_cut_off_with_413(web):
    # given a sign-in POST with a chunked body (no declared length) that goes on past the 1 MiB limit
    connection = web.raw()
    connection.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    # (1 MiB and 4 KiB of it, then nothing: the server has read all that was sent when it answers and closes)
    for size in (256 * 1024,) * 4 + (4096,):
        connection.sendall(b"%x\r\n" % size + b"u" * size + b"\r\n")
    # then it is answered 413 naming the limit, and the connection closed
    answer = _answer(connection)
    connection.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"larger than the 1 MiB" in answer


class _PeakRss:
    """Samples the summed RSS of `process` and its children every 20 ms while in the `with` block; `growth` is
    the peak minus the RSS at the start."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._processes = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        self._stop = threading.Event()
        self._start = self._peak = 0

    def _rss(self) -> int:
        return sum(process.memory_info().rss for process in self._processes)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self._peak = max(self._peak, self._rss())

    def __enter__(self) -> _PeakRss:
        self._start = self._peak = self._rss()
        self._thread = threading.Thread(target=self._sample)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._rss())

    @property
    def growth(self) -> int:
        return self._peak - self._start


def _sign_in(session: requests.Session, url: str, username: str, password: str) -> requests.Response:
    page = session.get(f"{url}/accounts/login/", timeout=ANSWER_TIMEOUT)
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    return session.post(
        f"{url}/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/accounts/login/"},
        allow_redirects=False,
        timeout=ANSWER_TIMEOUT,
    )


def test_sign_in_works_and_failed_ones_are_locked_out(web):
    # given a user
    caller = make_caller("carol", "acme")
    # when it signs in with its password
    session = requests.Session()
    signed_in = _sign_in(session, web.url, "carol", "pw-for-tests-1")
    # then it is sent on, and its session cookie opens the console
    assert signed_in.status_code == 302, signed_in.text
    assert "sessionid" in session.cookies
    overview = session.get(f"{web.url}/", timeout=ANSWER_TIMEOUT)
    assert overview.status_code == 200 and caller.team.slug in overview.text
    # when someone fails to sign in as carol more often than the failure limit
    other = requests.Session()
    failed = [_sign_in(other, web.url, "carol", "wrong").status_code for _ in range(LOGIN_FAILURE_LIMIT + 1)]
    # then django-axes answers the failure that reaches the limit, and every later attempt, with 429
    assert failed == [200] * (LOGIN_FAILURE_LIMIT - 1) + [429, 429]


def test_uploads_downloads_and_static_files_go_through_with_the_web_process_bounded_in_memory(web):
    # given a user with a token, and a model
    caller = make_caller("dave", "acme")
    headers = {"Authorization": f"Bearer {caller.token}"}
    created = requests.post(
        f"{web.url}/api/v1/models/", json={"name": "big", "team": "acme"}, headers=headers, timeout=ANSWER_TIMEOUT
    )
    assert created.status_code == 201, created.text
    model_id = created.json()["id"]
    # when a 96 MiB file is uploaded by the old path (multipart through the web process)
    data = onnx_like(os.urandom(96 * MIB))
    with _PeakRss(web.process) as upload_memory:
        uploaded = requests.post(
            f"{web.url}/api/v1/models/{model_id}/versions/",
            files={"file": ("big.onnx", data)},
            headers=headers,
            timeout=120,
        )
    # then it makes a version of that size, and the web processes never grew by half the file
    assert uploaded.status_code == 201, uploaded.text
    version = uploaded.json()
    assert version["source"]["size_bytes"] == len(data)
    assert version["source"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert upload_memory.growth < 48 * MIB, upload_memory.growth
    # when a resumable upload sends a 5 MiB part through Conch (folder storage)
    part = os.urandom(5 * MIB)
    whole = part + os.urandom(MIB)
    start = requests.post(
        f"{web.url}/api/v1/models/{model_id}/uploads/",
        json={
            "filename": "model.onnx",
            "size_bytes": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(),
            "part_size_bytes": 5 * MIB,
        },
        headers=headers,
        timeout=ANSWER_TIMEOUT,
    )
    assert start.status_code == 201, start.text
    upload_id = start.json()["id"]
    targets = requests.post(
        f"{web.url}/api/v1/models/{model_id}/uploads/{upload_id}/parts/",
        json={"numbers": [1]},
        headers=headers,
        timeout=ANSWER_TIMEOUT,
    )
    sent = requests.put(
        targets.json()["parts"][0]["url"],
        data=part,
        headers={**headers, "Content-Type": "application/octet-stream"},
        timeout=ANSWER_TIMEOUT,
    )
    # then the store holds it
    assert sent.status_code == 200, sent.text
    assert sent.json() == {"number": 1, "size_bytes": len(part), "etag": hashlib.sha256(part).hexdigest()}
    # when the signed-in user downloads the first version's file from the console
    session = requests.Session()
    assert _sign_in(session, web.url, "dave", "pw-for-tests-1").status_code == 302
    digest = hashlib.sha256()
    with _PeakRss(web.process) as download_memory:
        download = session.get(
            f"{web.url}/models/{model_id}/versions/{version['id']}/download/", timeout=120, stream=True
        )
        for piece in download.iter_content(MIB):
            digest.update(piece)
    # then it gets the file's bytes, streamed: the web processes never held half of it
    assert download.status_code == 200
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert download_memory.growth < 48 * MIB, download_memory.growth
    # and static files are served (WhiteNoise)
    css = next((ROOT / "static" / "console").glob("*.css"))
    static = requests.get(f"{web.url}/static/console/{css.name}", timeout=ANSWER_TIMEOUT)
    assert static.status_code == 200 and static.content == css.read_bytes()

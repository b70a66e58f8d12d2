"""`tritonserving.relay.TritonRelay` against a real HTTP/1.1 server (Python's http.server on a thread), for what
a Triton rarely does on cue: closing pooled connections, chunked answers, answers slower than the timeout.
Relaying to a real Triton is covered by tests/deployments/test_gateway.py."""

from __future__ import annotations

import asyncio
import http.server
import socketserver
import threading
import time

import pytest

from tests.services import free_port
from tritonserving.client import TritonUnavailable, TritonUnreachable
from tritonserving.relay import TritonRelay


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self._answer(self.rfile.read(length))

    def _answer(self, body: bytes) -> None:
        server = self.server
        server.requests.append((self.command, self.path, dict(self.headers), body))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for piece in (b'{"a":', b"1}"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        payload = b"got %d bytes on %s" % (len(body), self.path.encode())
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Content-Type", "text/plain")
        self.send_header("Inference-Header-Content-Length", "7")
        self.send_header("X-Internal", "not relayed")
        self.end_headers()
        self.wfile.write(payload)
        if self.path == "/then-hang-up":
            self.close_connection = True  # no "Connection: close" said: the client finds out on its next use


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self, address) -> None:
        super().__init__(address, _Handler)
        self.requests: list = []
        self.connections = 0

    def handle_error(self, request, client_address) -> None:
        pass  # a client that timed out and left (the slow-answer test): not this server's news

    def get_request(self):
        self.connections += 1
        return super().get_request()


@pytest.fixture
def server():
    srv = _Server(("127.0.0.1", free_port()))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _run(coroutine):
    return asyncio.run(coroutine)


def test_requests_reuse_one_keep_alive_connection_and_only_relayed_headers_pass(server):
    async def scenario():
        relay = TritonRelay(max_connections=4)
        bodies = []
        for n in range(3):
            answer = await relay.send(
                "POST",
                f"{server.url}/v2/models/m/infer?x={n}",
                headers={
                    "Content-Type": "application/octet-stream",
                    "Authorization": "Bearer secret",
                    "X-Conch-Key": "k",
                },
                body=b"x" * 1000,
            )
            assert answer.status == 200
            assert answer.headers == {
                "content-length": str(len(await_body := b"got 1000 bytes on /v2/models/m/infer?x=%d" % n)),
                "content-type": "text/plain",
                "inference-header-content-length": "7",
            }
            bodies.append((await answer.read(), await_body))
        await relay.close()
        return bodies

    for got, expected in _run(scenario()):
        assert got == expected
    assert server.connections == 1
    (_, path, headers, body) = server.requests[0]
    assert path == "/v2/models/m/infer?x=0" and body == b"x" * 1000
    assert "Authorization" not in headers and headers["X-Conch-Key"] == "k"


def test_a_streamed_body_goes_with_its_content_length(server):
    async def pieces():
        for _ in range(4):
            yield b"y" * 300_000
            await asyncio.sleep(0)

    async def scenario():
        relay = TritonRelay()
        answer = await relay.send("POST", f"{server.url}/v2/x", body=pieces(), content_length=1_200_000)
        text = await answer.read()
        await relay.close()
        return text

    assert _run(scenario()) == b"got 1200000 bytes on /v2/x"
    assert server.requests[0][2]["Content-Length"] == "1200000"


def test_a_connection_the_server_closed_after_answering_is_replaced_for_the_next_request(server):
    async def scenario():
        relay = TritonRelay()
        first = await relay.send("GET", f"{server.url}/then-hang-up")
        await first.read()
        await asyncio.sleep(0.2)  # the server's close reaches us (or not yet: either way the next request works)
        second = await relay.send("POST", f"{server.url}/v2/again", body=b"abc")
        text = await second.read()
        await relay.close()
        return text

    assert _run(scenario()) == b"got 3 bytes on /v2/again"
    assert server.connections == 2


def test_a_chunked_answer_is_decoded(server):
    async def scenario():
        relay = TritonRelay()
        answer = await relay.send("GET", f"{server.url}/chunked")
        text = await answer.read()
        await relay.close()
        return answer, text

    answer, text = _run(scenario())
    assert text == b'{"a":1}'
    assert "content-length" not in answer.headers  # the gateway's server sends its own framing


def test_connections_per_server_are_bounded_and_waiting_requests_are_served(server):
    async def one(relay, n):
        answer = await relay.send("POST", f"{server.url}/v2/{n}", body=b"z" * n)
        return await answer.read()

    async def scenario():
        relay = TritonRelay(max_connections=2)
        texts = await asyncio.gather(*(one(relay, n) for n in range(1, 9)))
        await relay.close()
        return texts

    assert _run(scenario()) == [b"got %d bytes on /v2/%d" % (n, n) for n in range(1, 9)]
    assert server.connections <= 2


def test_nothing_listening_is_unreachable_and_a_slow_answer_times_out(server):
    async def unreachable():
        relay = TritonRelay(connect_timeout_s=1)
        try:
            await relay.send("GET", f"http://127.0.0.1:{free_port()}/v2")
        finally:
            await relay.close()

    with pytest.raises(TritonUnreachable):
        _run(unreachable())

    async def slow():
        relay = TritonRelay(timeout_s=0.3)
        try:
            await relay.send("GET", f"{server.url}/slow")
        finally:
            await relay.close()

    with pytest.raises(TritonUnavailable, match="timed out"):
        _run(slow())

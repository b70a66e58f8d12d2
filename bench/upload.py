"""Benchmark: a 1 GiB upload through Conch's REST API into S3 storage vs boto3's upload_file.

Both send the same file to the same S3 protocol server (moto, over HTTP on 127.0.0.1):
  baseline: boto3 `upload_file` (managed multipart upload, its default thread pool)
  conch:    POST /api/v1/models/{id}/versions/ (multipart/form-data) to a gunicorn web
            process whose upload handler streams the body into an S3 multipart upload
The web process's RSS is sampled every 20 ms during the upload.

Targets (issue 2): time_ratio = conch/baseline <= 1.5; the web process's peak RSS grows
by < 100 MiB. Ends with one machine-readable line:
  upload: time_ratio=<conch/baseline> rss_growth_mib=<peak - before>
Run: .venv/bin/python bench/upload.py [--size-mib 1024]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import boto3
import psutil
from botocore.config import Config

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ACCESS, SECRET, REGION, BUCKET = "bench-access", "bench-secret", "us-east-1", "conch-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str = "/", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answered on port {port}")


def make_file(path: Path, size: int) -> None:
    block = os.urandom(8 * 1024 * 1024)
    with path.open("wb") as fh:
        written = 0
        while written < size:
            chunk = block[: min(len(block), size - written)]
            fh.write(chunk)
            written += len(chunk)


class RssSampler(threading.Thread):
    """Samples a process tree's resident set size (bytes) until stopped; keeps the peak."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.processes = [psutil.Process(p) for p in pids]
        self.peak = self.current()
        self.stop_event = threading.Event()

    def current(self) -> int:
        total = 0
        for p in self.processes:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def run(self) -> None:
        while not self.stop_event.wait(0.02):
            self.peak = max(self.peak, self.current())


def cpu_seconds(pids: list[int], *, children: bool = True) -> float:
    """User + system CPU seconds used so far by the processes `pids` (and their children)."""
    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for p in [process, *(process.children(recursive=True) if children else [])]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def upload_through_api(port: int, token: str, model_id: int, path: Path) -> tuple[float, dict]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="max_batch_size"\r\n\r\n8\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = path.stat().st_size
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    conn.putrequest("POST", f"/api/v1/models/{model_id}/versions/")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(len(head) + size + len(tail)))
    conn.endheaders()
    conn.send(head)
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            conn.send(chunk)
    conn.send(tail)
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 201:
        raise SystemExit(f"upload failed: {response.status} {body[:500]!r}")
    return elapsed, json.loads(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2, help="Alternating rounds; the best time of each counts.")
    args = parser.parse_args()
    size = args.size_mib * 1024 * 1024
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="conch-bench-upload-") as tmp:
        tmp = Path(tmp)
        try:
            s3_port = free_port()
            procs.append(
                subprocess.Popen(
                    [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_http(s3_port)
            endpoint = f"http://127.0.0.1:{s3_port}"
            s3 = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id=ACCESS,
                aws_secret_access_key=SECRET,
                region_name=REGION,
                config=Config(retries={"max_attempts": 2}),
            )
            s3.create_bucket(Bucket=BUCKET)

            env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_"))}
            env.update(
                {
                    "CONCH_VAR_DIR": str(tmp / "var"),
                    "CONCH_STORAGE_URL": f"s3://{BUCKET}/conch",
                    "CONCH_S3_ENDPOINT_URL": endpoint,
                    "CONCH_S3_ACCESS_KEY_ID": ACCESS,
                    "CONCH_S3_SECRET_ACCESS_KEY": SECRET,
                    "CONCH_S3_REGION": REGION,
                    "CONCH_MAX_UPLOAD_BYTES": str(2 * size + 1024 * 1024),
                }
            )
            manage = [sys.executable, str(ROOT / "manage.py")]
            subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, cwd=ROOT)
            subprocess.run(
                [*manage, "shell", "-c", "from tenancy.services import ensure_user; ensure_user(username='bench')"],
                env=env,
                check=True,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            subprocess.run(
                [*manage, "create_team", "bench", "--member", "bench"],
                env=env,
                check=True,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
            token = (
                subprocess.run(
                    [*manage, "create_token", "bench"], env=env, check=True, cwd=ROOT, capture_output=True, text=True
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            web_port = free_port()
            procs.append(
                subprocess.Popen(
                    # The same server settings as `make demo` (gunicorn.conf.py), with one worker process.
                    [
                        str(BIN / "gunicorn"),
                        "-c",
                        str(ROOT / "gunicorn.conf.py"),
                        "--bind",
                        f"127.0.0.1:{web_port}",
                        "--workers",
                        "1",
                    ],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_http(web_port, "/api/v1/schema/")
            conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=60)
            conn.request(
                "POST",
                "/api/v1/models/",
                body=json.dumps({"name": "big", "team": "bench"}),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            model_id = json.loads(conn.getresponse().read())["id"]

            path = tmp / "model.onnx"
            make_file(path, size)
            print(f"file: {args.size_mib} MiB")

            moto_pid, me = procs[0].pid, os.getpid()
            web = psutil.Process(procs[-1].pid)
            sampler = RssSampler([web.pid] + [c.pid for c in web.children(recursive=True)])
            before = sampler.current()
            sampler.start()
            # Alternate the two, each on a server emptied of the previous object, and keep each one's
            # best time: the S3 server slows down as it holds more, and the machine's speed drifts.
            baseline_times, conch_times = [], []
            for round_number in range(1, args.rounds + 1):
                cpu0 = cpu_seconds([moto_pid]), cpu_seconds([me], children=False)
                started = time.perf_counter()
                s3.upload_file(str(path), BUCKET, "baseline/model.onnx")
                baseline_times.append(time.perf_counter() - started)
                print(
                    f"round {round_number} baseline boto3 upload_file: {baseline_times[-1]:6.2f} s "
                    f"{size / baseline_times[-1] / 2**20:5.0f} MiB/s   CPU s: S3 server "
                    f"{cpu_seconds([moto_pid]) - cpu0[0]:.1f}, client {cpu_seconds([me], children=False) - cpu0[1]:.1f}"
                )
                s3.delete_object(Bucket=BUCKET, Key="baseline/model.onnx")

                cpu0 = cpu_seconds([moto_pid]), cpu_seconds([me], children=False), cpu_seconds([web.pid])
                elapsed, version = upload_through_api(web_port, token, model_id, path)
                conch_times.append(elapsed)
                assert version["source"]["size_bytes"] == size
                print(
                    f"round {round_number} conch API upload:           {elapsed:6.2f} s "
                    f"{size / elapsed / 2**20:5.0f} MiB/s   CPU s: S3 server "
                    f"{cpu_seconds([moto_pid]) - cpu0[0]:.1f}, "
                    f"client {cpu_seconds([me], children=False) - cpu0[1]:.1f}, "
                    f"web {cpu_seconds([web.pid]) - cpu0[2]:.1f}   sha256 {version['source']['sha256'][:12]}…"
                )
                for key in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
                    s3.delete_object(Bucket=BUCKET, Key=key["Key"])
                print(
                    f"round {round_number} web RSS now {sampler.current() / 2**20:.0f} MiB, "
                    f"peak so far {sampler.peak / 2**20:.0f} MiB"
                )
            sampler.stop_event.set()
            sampler.join()
            growth = (sampler.peak - before) / 2**20
            print(f"web RSS: before {before / 2**20:.0f} MiB, peak {sampler.peak / 2**20:.0f} MiB")
            print(f"best: baseline {min(baseline_times):.2f} s, conch {min(conch_times):.2f} s")
            print(f"upload: time_ratio={min(conch_times) / min(baseline_times):.2f} rss_growth_mib={growth:.1f}")
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()

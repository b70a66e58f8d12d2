"""Benchmark: a 1 GiB file through `conch upload` into S3 storage vs boto3's upload_file of the same file.

All send the same file to the same S3 protocol server (moto, over HTTP on 127.0.0.1):
  baseline: boto3 `upload_file` (managed multipart upload, its default thread pool)
  conch:    the `conch upload` command (a subprocess, as a pipeline runs it): POST /api/v1/models/{id}/uploads/,
            its parts PUT in parallel straight to the bucket with presigned URLs while a thread computes the file's
            sha256, complete (with the sha256), and a Celery worker's join of the parts and size check until the
            version exists (the sha256 is checked later by the version's build, on the file it downloads anyway:
            untimed here)
  old path: POST /api/v1/models/{id}/versions/ (multipart/form-data through the web process, which streams the
            body into an S3 multipart upload), for comparison
Conch's worker gets its tasks from a Redis, as in production (`--broker-url`; the demo's filesystem broker looks
for tasks every 0.1 s). The web process's RSS (`python -m conch.web`, one worker, as `make demo` runs it) is sampled
every 20 ms during the `conch upload` runs, after a first small upload by each path (what the process loads on its
first request of a kind is not growth); the old path's growth is shown beside it. The timed `conch upload`
includes everything its user waits for: the CLI's start, the sha256, the parts, and the worker's check until the
version exists.

Both end with the S3 server's CompleteMultipartUpload, which moto does by copying the 1 GiB twice into new memory.
On a virtual machine that hands freed memory back to its host at once (free page reporting: Firecracker's
virtio-balloon), every such copy pays the host's page faults again, and the completion moved from about 3 s to over
13 s from one upload to the next, for boto3 and Conch alike. So that the bench compares the two clients and not the
host's faults, moto runs here with its memory kept once touched (glibc's allocator in one arena, never returning
memory: GLIBC_TUNABLES arena_max=1, mmap_max=0, trim_threshold) and its objects in that memory instead of temporary
files (MOTO_S3_DEFAULT_KEY_BUFFER_SIZE), and an untimed upload of the full size by each side first makes moto's
memory grow to its working size; then its completion of 1 GiB takes about 0.5-1 s. `--plain-s3-server` runs moto as
it comes. Each round prints the server's completion beside each side's time (boto3's CompleteMultipartUpload call;
Conch's check, which is mostly that call), and the summary gives, besides the ratio of the best times, the median of
the rounds' ratios and the ratio of the best times with the completion taken out.

Targets (issue 8): time_ratio = conch/baseline <= 1.1; the web process's peak RSS grows by < 20 MiB. Ends with one
machine-readable line:
  upload: time_ratio=<best conch/best baseline> rss_growth_mib=<peak - before> \
      parts_ratio=<conch's parts alone/baseline> median_round_ratio=<median of conch/baseline per round> \
      without_completion_ratio=<best (conch - its check)/best (baseline - its completion)> \
      old_path_ratio=<old/baseline> old_path_rss_growth_mib=<…>
Run: .venv/bin/python bench/upload.py [--size-mib 1024] [--rounds 5] [--skip-old-path] [--plain-s3-server]
     [--broker-url redis://127.0.0.1:6379/12 | filesystem://]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import boto3
import psutil
import redis
from botocore.config import Config

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from conch.processes import web_command  # noqa: E402  (needs ROOT on sys.path)

ACCESS, SECRET, REGION, BUCKET = "bench-access", "bench-secret", "us-east-1", "conch-bench"
#: moto's environment unless --plain-s3-server (see the docstring): glibc's malloc in one arena that never unmaps or
#: trims (the memory of one completion is reused by the next instead of faulted in again from the host), and objects
#: up to 4 GiB kept in that memory rather than spilled to temporary files.
S3_SERVER_MEMORY_KEPT = {
    "GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736",
    "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(4 * 2**30),
}


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


def bench_broker(url: str) -> str:
    """The Celery broker the bench's web process and worker use: `url` (a Redis, as in production), emptied first so
    that no task of an earlier run reaches this run's worker; kombu's filesystem transport (the demo's, which looks
    into its folder every 0.1 s) when `url` is "filesystem://" or no Redis answers there."""
    if url.startswith("filesystem://"):
        return url
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).flushdb()
    except redis.RedisError as exc:
        print(f"no Redis at {url} ({exc}): the Celery broker is kombu's filesystem transport")
        return "filesystem://"
    return url


def make_file(path: Path, size: int) -> None:
    """Write `size` random bytes that open like an ONNX file (field 1, ir_version 8): `conch upload` and the
    single-request upload refuse a file whose first bytes are not ONNX's; what follows does not matter here."""
    block = os.urandom(8 * 1024 * 1024)
    with path.open("wb") as fh:
        fh.write(b"\x08\x08")
        written = 2
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
        # every round sends the same file: each one is a new version
        f'--{boundary}\r\nContent-Disposition: form-data; name="allow_duplicate"\r\n\r\ntrue\r\n'
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


def conch_upload(
    env: dict, model: str, path: Path, parallel: int | None, part_size: str | None
) -> tuple[float, dict, int, float]:
    """Run `conch upload MODEL PATH --json`; return (seconds, its JSON, its peak RSS in bytes, its CPU seconds)."""
    # --new-version: every round sends the same file, and each one must be sent (not found to be a version).
    command = [str(BIN / "conch"), "upload", model, str(path), "--json", "--quiet", "--new-version"]
    if parallel:
        command += ["--parallel", str(parallel)]
    if part_size:
        command += ["--part-size", part_size]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = RssSampler([process.pid])
    sampler.start()
    out, err = process.communicate(timeout=1800)
    elapsed = time.perf_counter() - started
    sampler.stop_event.set()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"conch upload failed ({process.returncode}): {err[-2000:]}")
    # The other children (the servers) still run: only this one, now waited for, is counted here.
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return elapsed, json.loads(out), sampler.peak, cpu


def wait_build(port: int, token: str, version_id: int, timeout: float = 600) -> None:
    """Poll the version until its build has ended (built or failed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/api/v1/versions/{version_id}/", headers={"Authorization": f"Bearer {token}"})
        if json.loads(conn.getresponse().read())["status"] in ("built", "failed"):
            return
        time.sleep(0.5)
    raise SystemExit(f"the build of version {version_id} did not end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds; the best time of each counts.")
    parser.add_argument("--parallel", type=int, help="conch upload --parallel (parts at once; default: the CLI's).")
    parser.add_argument("--part-size", help="conch upload --part-size (default: the server's choice).")
    parser.add_argument("--skip-old-path", action="store_true", help="Leave out the old single-request upload.")
    parser.add_argument(
        "--broker-url",
        default="redis://127.0.0.1:6379/12",
        help="Celery broker (production's is a Redis; this database is emptied); filesystem:// for the demo's.",
    )
    parser.add_argument(
        "--plain-s3-server",
        action="store_true",
        help="Run moto as it comes: its memory given back after each request, objects in temporary files.",
    )
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
                    env=os.environ if args.plain_s3_server else {**os.environ, **S3_SERVER_MEMORY_KEPT},
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
            # boto3's own CompleteMultipartUpload, timed by botocore's events around the call.
            completion: dict[str, float] = {}
            s3.meta.events.register(
                "before-call.s3.CompleteMultipartUpload",
                lambda **_: completion.__setitem__("started", time.perf_counter()),
            )
            s3.meta.events.register(
                "after-call.s3.CompleteMultipartUpload",
                lambda **_: completion.__setitem__("seconds", time.perf_counter() - completion["started"]),
            )

            env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CONCH_"))}
            broker = bench_broker(args.broker_url)
            env.update(
                {
                    "CELERY_BROKER_URL": broker,
                    "CONCH_VAR_DIR": str(tmp / "var"),
                    "CONCH_STORAGE_URL": f"s3://{BUCKET}/conch",
                    "CONCH_S3_ENDPOINT_URL": endpoint,
                    "CONCH_S3_ACCESS_KEY_ID": ACCESS,
                    "CONCH_S3_SECRET_ACCESS_KEY": SECRET,
                    "CONCH_S3_REGION": REGION,
                    "CONCH_MAX_UPLOAD_BYTES": str(2 * size + 1024 * 1024),
                    "CONCH_QUOTA_STORAGE_BYTES": str(8 * args.rounds * size + 2**30),
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
                    # The same server as `make demo` runs, with one worker process.
                    web_command(BIN, web_port, workers=1),
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            web_index = len(procs) - 1
            # The Celery worker joins a completed upload's parts and checks its size (then runs the version's build,
            # which checks the sha256 on its download).
            procs.append(
                subprocess.Popen(
                    [str(BIN / "celery"), "-A", "conch", "worker", "-Q", "celery,periodic", "--concurrency", "1"],
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
            cli_env = {**env, "CONCH_URL": f"http://127.0.0.1:{web_port}", "CONCH_TOKEN": token}
            cli_env["CONCH_CONFIG"] = str(tmp / "cli-config.json")

            def empty_bucket() -> None:
                for key in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
                    s3.delete_object(Bucket=BUCKET, Key=key["Key"])

            path = tmp / "model.onnx"
            make_file(path, size)
            print(f"file: {args.size_mib} MiB; Celery broker: {broker}")

            # Warm up: a first small upload by each path, so that what the web process loads on its first request
            # of each kind (code, connections) is not counted as growth.
            small = tmp / "warmup.onnx"
            make_file(small, 1024 * 1024)
            conch_upload(cli_env, str(model_id), small, args.parallel, None)
            if not args.skip_old_path:
                upload_through_api(web_port, token, model_id, small)
            time.sleep(3)  # the warm-up versions' builds (a 1 MiB file fails at once)
            empty_bucket()
            # And one untimed upload of the full size by each side, after which the S3 server's memory has grown to
            # what each one's parts and completion need (with --plain-s3-server it is given back anyway).
            s3.upload_file(str(path), BUCKET, "warmup/model.onnx")
            empty_bucket()
            _, warmup, _, _ = conch_upload(cli_env, str(model_id), path, args.parallel, args.part_size)
            empty_bucket()
            wait_build(web_port, token, warmup["version"]["id"])

            moto_pid, me = procs[0].pid, os.getpid()
            web = psutil.Process(procs[web_index].pid)
            web_pids = [web.pid] + [c.pid for c in web.children(recursive=True)]
            # Alternate the three, each on a server emptied of the previous object, and keep each one's best time:
            # the S3 server slows down as it holds more, and the machine's speed drifts.
            baseline_times, conch_times, old_times, parts_times = [], [], [], []
            baseline_completions, conch_checks = [], []
            conch_growth, old_growth = 0.0, 0.0

            for round_number in range(1, args.rounds + 1):
                cpu0 = cpu_seconds([moto_pid]), cpu_seconds([me], children=False)
                started = time.perf_counter()
                completion.clear()
                s3.upload_file(str(path), BUCKET, "baseline/model.onnx")
                baseline_times.append(time.perf_counter() - started)
                baseline_completions.append(completion["seconds"])
                print(
                    f"round {round_number} baseline boto3 upload_file: {baseline_times[-1]:6.2f} s "
                    f"{size / baseline_times[-1] / 2**20:5.0f} MiB/s   CPU s: S3 server "
                    f"{cpu_seconds([moto_pid]) - cpu0[0]:.1f}, client {cpu_seconds([me], children=False) - cpu0[1]:.1f}"
                    f"\n        (the server's CompleteMultipartUpload {completion['seconds']:.1f} s)"
                )
                s3.delete_object(Bucket=BUCKET, Key="baseline/model.onnx")

                sampler = RssSampler(web_pids)
                before = sampler.current()
                sampler.start()
                cpu0 = cpu_seconds([moto_pid]), cpu_seconds(web_pids, children=False)
                elapsed, result, client_peak, client_cpu = conch_upload(
                    cli_env, str(model_id), path, args.parallel, args.part_size
                )
                sampler.stop_event.set()
                sampler.join()
                conch_times.append(elapsed)
                parts_times.append(result["seconds"]["parts"])
                conch_checks.append(result["seconds"]["check"])
                conch_growth = max(conch_growth, (sampler.peak - before) / 2**20)
                version = result["version"]
                timed = ("parts", "sha256_wait", "check")
                assert version["source"]["size_bytes"] == size and result["upload"]["transport"] == "s3"
                print(
                    f"round {round_number} conch upload (CLI):         {elapsed:6.2f} s "
                    f"{size / elapsed / 2**20:5.0f} MiB/s   CPU s: S3 server {cpu_seconds([moto_pid]) - cpu0[0]:.1f}, "
                    f"web {cpu_seconds(web_pids, children=False) - cpu0[1]:.1f}, client {client_cpu:.1f}   "
                    f"{result['upload']['part_count']} parts of {result['upload']['part_size_bytes'] / 2**20:.0f} MiB, "
                    f"client peak RSS {client_peak / 2**20:.0f} MiB, "
                    f"web RSS growth {(sampler.peak - before) / 2**20:.1f} MiB, "
                    f"sha256 {version['source']['sha256'][:12]}…\n"
                    f"        (sha256 {result['seconds']['sha256']:.1f} s beside the parts, parts "
                    f"{result['seconds']['parts']:.1f} s, then waiting for the sha256 "
                    f"{result['seconds']['sha256_wait']:.1f} s, server's check {result['seconds']['check']:.1f} s, "
                    f"the rest (CLI start, API calls) {elapsed - sum(result['seconds'][k] for k in timed):.1f} s)"
                )
                # Untimed: the version's build (it fails: random bytes) would download the file, which moto serves
                # slowly in ranges (it reads the whole object for each); emptied first, the build fails at once.
                # Let it end before the next upload, so it takes no CPU from it.
                empty_bucket()
                wait_build(web_port, token, version["id"])

                if not args.skip_old_path:
                    sampler = RssSampler(web_pids)
                    before = sampler.current()
                    sampler.start()
                    elapsed, version = upload_through_api(web_port, token, model_id, path)
                    sampler.stop_event.set()
                    sampler.join()
                    old_times.append(elapsed)
                    old_growth = max(old_growth, (sampler.peak - before) / 2**20)
                    assert version["source"]["size_bytes"] == size
                    print(
                        f"round {round_number} old path (POST /versions/): {elapsed:6.2f} s "
                        f"{size / elapsed / 2**20:5.0f} MiB/s   "
                        f"web RSS growth {(sampler.peak - before) / 2**20:.1f} MiB"
                    )
                    empty_bucket()
                    wait_build(web_port, token, version["id"])
            print(
                f"best: baseline {min(baseline_times):.2f} s, conch upload {min(conch_times):.2f} s"
                + (f", old path {min(old_times):.2f} s" if old_times else "")
            )
            # The parts alone (what compares with boto3's transfer): the rest is the CLI's start, its sha256 and the
            # server's check (join the parts, check the size).
            parts_ratio = min(parts_times) / min(baseline_times)
            # Each round's two uploads run back to back, so their ratio is little moved by the machine's drift.
            median_round_ratio = statistics.median(c / b for c, b in zip(conch_times, baseline_times, strict=True))
            without_completion = min(c - k for c, k in zip(conch_times, conch_checks, strict=True)) / min(
                b - k for b, k in zip(baseline_times, baseline_completions, strict=True)
            )
            print(
                f"the server's completion: boto3's {', '.join(f'{k:.1f}' for k in baseline_completions)} s; "
                f"Conch's check {', '.join(f'{k:.1f}' for k in conch_checks)} s"
            )
            line = (
                f"upload: time_ratio={min(conch_times) / min(baseline_times):.2f} rss_growth_mib={conch_growth:.1f} "
                f"parts_ratio={parts_ratio:.2f} median_round_ratio={median_round_ratio:.2f} "
                f"without_completion_ratio={without_completion:.2f}"
            )
            if old_times:
                old_ratio = min(old_times) / min(baseline_times)
                line += f" old_path_ratio={old_ratio:.2f} old_path_rss_growth_mib={old_growth:.1f}"
            print(line)
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()

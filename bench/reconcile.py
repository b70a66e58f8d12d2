"""Benchmark: one reconcile tick over many Kubernetes deployments, timed, with the API requests it makes counted.

Set-up (not timed): the local test cluster (devtools/cluster: etcd, kube-apiserver, controller-manager and
scheduler built from Debian's source package, the fake GPU nodes, and extra CPU nodes so every pod has room: a
node takes 110 pods) with its test kubelet in fake-container mode
(pods are marked Ready without starting Triton), an S3 protocol server (moto) for the model repositories, and
Conch's services in this process on the embedded SQLite database in a scratch CONCH_VAR_DIR. A cluster `local` is
registered, one tiny model version is stored as built, and --baseline deployments (default 20), then up to --count
(default 200), are created with `runtime: kubernetes` and applied (each deployment's start task, run inline).

Then reconcile ticks (`deployments.services.reconcile_deployments`, what beat runs every few seconds) run until
every deployment is `ready`, and --ticks more (default 5) are timed: seconds per tick (median) and Kubernetes API
requests per tick (every request of Conch's API adapter is counted). The baseline and the full run are printed side
by side with their ratio: a tick whose API requests do not grow with the number of deployments has a ratio of 1.

Target (issue 6): <= 2 s per tick at 200 deployments, and API requests per tick independent of the count.
Ends with one machine-readable line:
  reconcile: deployments=<count> seconds_per_tick=<median> api_calls_per_tick=<median>
Run: .venv/bin/python bench/reconcile.py [--count 200] [--baseline 20] [--ticks 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup_django(var_dir: Path, s3_endpoint: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
    os.environ["CONCH_VAR_DIR"] = str(var_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ["CONCH_STORAGE_URL"] = "s3://bench/conch"
    os.environ["CONCH_S3_ENDPOINT_URL"] = s3_endpoint
    os.environ["CONCH_S3_ACCESS_KEY_ID"] = "bench"
    os.environ["CONCH_S3_SECRET_ACCESS_KEY"] = "bench-secret"
    os.environ["CONCH_S3_REGION"] = "us-east-1"
    os.environ["CONCH_INSTANCE_ID"] = "conchbench"
    # 200 deployments in one team: far past the default deployment quota.
    os.environ["CONCH_QUOTA_DEPLOYMENTS"] = "1000"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _api_calls() -> int:
    from deployments.runtimes.kubernetes import api as kube_api

    return sum(client.calls for client in kube_api._clients.values())


def _create(count: int, *, start_index: int, version, user) -> list[int]:
    from deployments.services import create_deployment, ensure_deployment_started
    from deployments.services.requests import DeploymentRequest, PlacementRequest

    ids = []
    for index in range(start_index, start_index + count):
        deployment = create_deployment(
            user=user,
            request=DeploymentRequest(
                team_slug="bench",
                name=f"d{index}",
                model_version_id=version.pk,
                placement=PlacementRequest(runtime="kubernetes", cluster="local", replicas=1, cpu="10m", memory="16Mi"),
            ),
        )
        ensure_deployment_started(deployment_id=deployment.pk)
        ids.append(deployment.pk)
    return ids


def _ticks_until_ready(ids: list[int], *, timeout_s: float) -> int:
    from deployments.models import Deployment
    from deployments.services import reconcile_deployments

    deadline = time.monotonic() + timeout_s
    ticks = 0
    while True:
        reconcile_deployments()
        ticks += 1
        ready = Deployment.objects.filter(pk__in=ids, status="ready").count()
        if ready == len(ids):
            return ticks
        if time.monotonic() > deadline:
            raise SystemExit(f"only {ready} of {len(ids)} deployments became ready in {timeout_s:.0f} s")
        time.sleep(0.5)


def _timed_ticks(ticks: int) -> tuple[float, float]:
    from deployments.services import reconcile_deployments

    seconds, calls = [], []
    for _ in range(ticks):
        before = _api_calls()
        started = time.perf_counter()
        reconcile_deployments()
        seconds.append(time.perf_counter() - started)
        calls.append(_api_calls() - before)
    return statistics.median(seconds), statistics.median(calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=5)
    arguments = parser.parse_args()

    from moto.server import ThreadedMotoServer

    from devtools.cluster import NODES, Cluster, FakeNode, ensure_binaries, free_port

    scratch = Path(tempfile.mkdtemp(prefix="conch-bench-reconcile-"))
    s3_port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    s3.start()
    # The test cluster's nodes, plus CPU nodes with room for every pod (a node takes 110 pods by default).
    room = [FakeNode(f"cpu-{index}", {}, None, pods=110) for index in range(2, 2 + arguments.count // 100 + 1)]
    cluster = Cluster(scratch / "cluster", bin_dir=ensure_binaries(), fake_containers=True, nodes=(*NODES, *room))
    started = time.monotonic()
    cluster.start()
    print(f"# cluster ready in {time.monotonic() - started:.1f} s (fake containers); scratch {scratch}", flush=True)
    try:
        _setup_django(scratch / "var", f"http://127.0.0.1:{s3_port}")
        import boto3

        boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{s3_port}",
            aws_access_key_id="bench",
            aws_secret_access_key="bench-secret",
            region_name="us-east-1",
        ).create_bucket(Bucket="bench")
        from django.contrib.auth import get_user_model

        from deployments.services.clusters import register_cluster
        from devtools.seed import add_constant, write_built_version
        from tenancy.models import Membership, Team

        user = get_user_model().objects.create_user("bench", password=None)
        team = Team.objects.create(slug="bench", name="bench")
        Membership.objects.create(user=user, team=team)
        register_cluster(name="local", namespace="conch", kubeconfig=cluster.kubeconfig_path.read_text())
        version = write_built_version(team, "adder", add_constant(scratch / "adder.onnx", 1.0))

        results = []
        created: list[int] = []
        for target in (arguments.baseline, arguments.count):
            began = time.monotonic()
            created += _create(target - len(created), start_index=len(created), version=version, user=user)
            applied = time.monotonic() - began
            ticks = _ticks_until_ready(created, timeout_s=300)
            seconds, calls = _timed_ticks(arguments.ticks)
            results.append((target, seconds, calls))
            print(
                f"# {target} deployments: applied in {applied:.1f} s, all ready after {ticks} ticks; "
                f"steady tick {seconds:.3f} s, {calls:.0f} API requests",
                flush=True,
            )
        (base_n, base_s, base_c), (n, s, c) = results
        print(f"{'deployments':>12} {'s/tick':>8} {'API req/tick':>13}")
        print(f"{base_n:>12} {base_s:>8.3f} {base_c:>13.0f}   (baseline)")
        print(f"{n:>12} {s:>8.3f} {c:>13.0f}")
        print(f"{'ratio':>12} {s / base_s:>8.2f} {c / base_c if base_c else float('nan'):>13.2f}")
        print(f"reconcile: deployments={n} seconds_per_tick={s:.3f} api_calls_per_tick={c:.0f}", flush=True)
    finally:
        cluster.stop()
        s3.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

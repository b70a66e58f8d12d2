"""`python -m devtools.cluster` (`make cluster`): the local Kubernetes test cluster in the foreground.

Prints `KUBECONFIG=<path>` once ready and stops everything on Ctrl-C, SIGTERM or SIGHUP, or when a control-plane
process exits (naming its log). Exit code 1 when the cluster cannot start (the reason on stderr).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from devtools.cluster.control_plane import DEFAULT_STATE_DIR, Cluster, ClusterError


def main(argv: list[str] | None = None) -> int:
    """Run the cluster in the foreground until a stop signal; print `KUBECONFIG=<path>` once ready."""
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--fake-containers", action="store_true", help="mark pods Ready without running Triton")
    arguments = parser.parse_args(argv)
    stopping = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)
    cluster = Cluster(arguments.state_dir, fake_containers=arguments.fake_containers)
    started = time.monotonic()
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            f"# cluster ready in {time.monotonic() - started:.1f} s; logs in {cluster.state_dir / 'logs'}", flush=True
        )
        print(f"KUBECONFIG={cluster.kubeconfig_path}", flush=True)
        while not stopping.wait(1.0):
            for component in cluster.exited_components():
                print(f"cluster: {component.name} exited; see {component.log_path}", file=sys.stderr)
                stopping.set()
    finally:
        print("# stopping", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

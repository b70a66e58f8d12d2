"""Command lines of Conch's own long-running processes (web, gateway, worker, beat), as the demo and the
benchmarks run them.

One definition, so every place that starts a worker consumes the same queues (`celery` and `periodic`, see
`conch.celery`) with the same options.
"""

from __future__ import annotations

from pathlib import Path

from conch.celery import DEFAULT_QUEUE, PERIODIC_QUEUE

__all__ = ["beat_command", "gateway_command", "web_command", "worker_command"]


def web_command(bin_dir: Path, port: int, workers: int | None = None) -> list[str]:
    """The console's web server (`conch.web`: uvicorn), listening on 127.0.0.1:`port` only, with `workers`
    processes (None: CONCH_WEB_WORKERS, 2 by default)."""
    command = [str(bin_dir / "python"), "-m", "conch.web", "--bind", f"127.0.0.1:{port}"]
    if workers is not None:
        command += ["--workers", str(workers)]
    return command


def gateway_command(bin_dir: Path) -> list[str]:
    """The inference gateway (`conch.gateway`: uvicorn), listening where CONCH_GATEWAY_BIND says."""
    return [str(bin_dir / "python"), "-m", "conch.gateway"]


def worker_command(bin_dir: Path, node: str, concurrency: int = 2) -> list[str]:
    """A Celery worker named `node` (`name@host`) with `concurrency` prefork pool processes, on both queues."""
    return [
        str(bin_dir / "celery"),
        "-A",
        "conch",
        "worker",
        "-Q",
        f"{DEFAULT_QUEUE},{PERIODIC_QUEUE}",
        "--loglevel",
        "INFO",
        "--concurrency",
        str(concurrency),
        "-n",
        node,
    ]


def beat_command(bin_dir: Path, schedule: Path) -> list[str]:
    """Celery beat keeping its schedule state in the file `schedule`."""
    return [str(bin_dir / "celery"), "-A", "conch", "beat", "--loglevel", "INFO", "--schedule", str(schedule)]

"""The demo's process supervisor: keeps web, gateway, worker and beat (and the demo's S3 server) running, restarts
what exits or gets stuck with a backoff, and stops them all. Development tooling (`manage.py run_demo`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from kombu.exceptions import KombuError

from conch.liveness import Liveness, beat_liveness, send_worker_heartbeat, worker_liveness

# A process that stayed up this long and then failed restarts without delay; quicker failures back off.
STABLE_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 30.0
# How long a process may take to stop on SIGTERM before its whole process group gets SIGKILL.
STOP_GRACE_SECONDS = 10.0
# Start-up time allowed on top of a liveness max age before a fresh worker or beat is judged (a loaded
# machine may take that long to import Django and Celery): a slow start must not cause a restart loop.
STARTUP_GRACE_SECONDS = 60.0


class VitalServiceExited(Exception):
    """A vital service (one whose restart would lose state, such as the demo's in-memory S3 server) exited."""


def exit_reason(code: int) -> str:
    """How a child process ended, from its return code: "exited with status N" or "was killed by SIGNAME"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@dataclass
class Service:
    """One supervised child process (web, worker or beat) and its restart state."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0  # time.monotonic() of the latest start
    quick_failures: int = 0  # failures in a row, each within STABLE_SECONDS of its start
    restart_at: float | None = None  # time.monotonic() a pending restart is due
    restarts: int = 0
    # A vital service is not restarted: its exit ends the demo (the S3 server would come back empty).
    vital: bool = False


class Supervisor:
    """Keeps the demo's web, worker and beat running; `tick()` it about once a second.

    A process that exits is restarted after a backoff (1, 2, 4 … 30 s; back to none once it stayed
    up STABLE_SECONDS). The worker is also sent a heartbeat task every CONCH_HEARTBEAT_INTERVAL_SECONDS
    and restarted when it ran none for CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS while a pool process was
    idle (it answers pings but takes no task: conch.liveness); beat is restarted when it published
    nothing for CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS. Each restart prints one line saying which and why.
    Tritons run in their own sessions: restarting the worker leaves them serving.
    """

    def __init__(self, *, env: dict[str, str], say, worker_node: str) -> None:
        self.env = env
        self.say = say
        self.worker_node = worker_node
        self.services: dict[str, Service] = {}
        self.heartbeat_interval = settings.CONCH_HEARTBEAT_INTERVAL_SECONDS
        self.worker_max_age = settings.CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS
        self.beat_max_age = settings.CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS
        self.next_heartbeat = 0.0
        self.heartbeat_failing = False

    def start(self, name: str, argv: list[str], log_path: Path, *, vital: bool = False) -> None:
        service = Service(name=name, argv=argv, log_path=log_path, vital=vital)
        self.services[name] = service
        self._spawn(service)

    def _spawn(self, service: Service) -> None:
        with service.log_path.open("ab") as log:
            # A session of its own: Ctrl-C in the terminal reaches the demo only, and a group kill
            # takes the process's own children (the web server's workers, Celery's pool) and nothing else.
            service.process = subprocess.Popen(
                service.argv,
                cwd=settings.BASE_DIR,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service.started_at = time.monotonic()
        service.restart_at = None
        verb = "restarted" if service.restarts else "started"
        self.say(f"{verb} {service.name} (pid {service.process.pid}, log {service.log_path})")

    def tick(self) -> None:
        """Restart what died or is stuck, start what is due, send the worker's heartbeat."""
        now = time.monotonic()
        for service in self.services.values():
            if service.restart_at is not None:
                if now >= service.restart_at:
                    self._spawn(service)
                continue
            code = service.process.poll()
            if code is not None:
                self._kill_group(service)  # its children may outlive it (a pool process, a web worker)
                if service.vital:
                    raise VitalServiceExited(
                        f"{service.name} (pid {service.process.pid}) {exit_reason(code)}; the demo cannot go on "
                        f"without it (log {service.log_path})"
                    )
                self._schedule_restart(service, exit_reason(code))
                continue
            stuck = self._stuck(service, now)
            if stuck is not None:
                self._stop(service)
                self._schedule_restart(service, stuck)
        worker = self.services.get("worker")
        if worker is not None and worker.restart_at is None and now >= self.next_heartbeat:
            self.next_heartbeat = now + self.heartbeat_interval
            self._send_heartbeat()

    def _stuck(self, service: Service, now: float) -> str | None:
        """Why a running service counts as stuck, or None; judged only after its max age plus a start-up grace."""
        liveness: Liveness | None = None
        uptime = now - service.started_at - STARTUP_GRACE_SECONDS
        if service.name == "worker" and uptime > self.worker_max_age:
            liveness = worker_liveness(node=self.worker_node, max_age_s=self.worker_max_age)
        elif service.name == "beat" and uptime > self.beat_max_age:
            liveness = beat_liveness(max_age_s=self.beat_max_age)
        if liveness is None or liveness.alive:
            return None
        return liveness.reason.removeprefix("beat ")

    def _send_heartbeat(self) -> None:
        try:
            send_worker_heartbeat(node=self.worker_node, expires_s=self.worker_max_age)
        except (KombuError, OSError) as exc:
            if not self.heartbeat_failing:
                self.say(f"cannot send the worker a heartbeat: {exc}")
            self.heartbeat_failing = True
        else:
            self.heartbeat_failing = False

    def _schedule_restart(self, service: Service, why: str) -> None:
        now = time.monotonic()
        if now - service.started_at >= STABLE_SECONDS:
            service.quick_failures = 0
        delay = min(MAX_BACKOFF_SECONDS, float(2**service.quick_failures))
        service.quick_failures += 1
        service.restarts += 1
        service.restart_at = now + delay
        self.say(f"{service.name} (pid {service.process.pid}) {why}; restarting it in {delay:.0f} s")

    def _stop(self, service: Service) -> None:
        """SIGTERM the process (a worker's warm shutdown puts its unacked messages back), then SIGKILL its group."""
        if service.process.poll() is None:
            service.process.terminate()
            try:
                service.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group(service)
        service.process.wait()

    @staticmethod
    def _kill_group(service: Service) -> None:
        try:
            os.killpg(service.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        """Stop every service: SIGTERM all (each stops its own children), SIGKILL groups still there after 15 s."""
        running = [s for s in self.services.values() if s.restart_at is None and s.process.poll() is None]
        for service in running:
            service.process.terminate()
        deadline = time.monotonic() + 15
        for service in running:
            try:
                service.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for service in self.services.values():
            self._kill_group(service)
            service.process.wait()

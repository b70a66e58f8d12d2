"""Liveness of Conch's Celery processes: is a worker still taking tasks, is beat still publishing?

A worker can look alive and answer `celery inspect ping` (its main process serves the control
channel) while its pool takes no task at all: seen on the embedded setup after both prefork children
were SIGKILLed, one of them while idle; the respawned children waited on a lock for good and the
queue grew. So a worker proves liveness the only sure way, by running a task: `conch.heartbeat` is
sent to the worker's own direct queue (`<node>.dq2`, Celery's `worker_direct`) and the pool process
that runs it writes `VAR_DIR/health/worker-<node>.json`. A worker whose every pool process is busy
with a task cannot run a heartbeat and is not stuck: each pool process writes what it is doing to
`VAR_DIR/health/pool-<node>/<pid>` (`task_prerun`/`task_postrun` signals), and a stale heartbeat
with all live pool processes busy still counts as alive.

Beat proves liveness by publishing: in the beat process every published task (the schedule has its
own `conch.heartbeat` entry, so at least one per `CONCH_HEARTBEAT_INTERVAL_SECONDS`) rewrites
`VAR_DIR/health/beat.json`.

The files are written and read on the same machine as the process they describe (the heartbeat is
addressed to one worker), so `manage.py worker_health` / `beat_health` work as container liveness
probes without a shared volume, and the demo's supervisor reads them directly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from celery import current_app, shared_task
from celery.signals import after_task_publish, beat_init, task_postrun, task_prerun, worker_init
from celery.utils.nodenames import worker_direct
from django.conf import settings

log = logging.getLogger(__name__)

HEARTBEAT_TASK = "conch.heartbeat"
_UNSAFE = re.compile(r"[^A-Za-z0-9@._-]")
_in_beat = False
# This process's worker node name (`-n`), set before the pool starts so its processes inherit it. Not the
# task request's `hostname`: Celery fills that with the plain host name on some pools.
_worker_node: str | None = None


@dataclass(frozen=True)
class Liveness:
    """Whether a process is alive, and a sentence saying why (for logs and probe output)."""

    alive: bool
    reason: str


def _health_dir() -> Path:
    return Path(settings.VAR_DIR) / "health"


def _node_file(node: str) -> Path:
    return _health_dir() / f"worker-{_UNSAFE.sub('_', node)}.json"


def _pool_dir(node: str) -> Path:
    return _health_dir() / f"pool-{_UNSAFE.sub('_', node)}"


def _write_json(path: Path, data: dict) -> None:
    # Write then rename, so a reader never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(data))
    os.replace(scratch, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _process_start(pid: int) -> int | None:
    """Start time of a live (not zombie) process in clock ticks since boot, from /proc; None if gone.

    Recorded next to a pid so a pid the kernel reused for another process is not taken for ours.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state is the first,
    # starttime the 20th (proc(5), field 22 overall).
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def send_worker_heartbeat(*, node: str, expires_s: float) -> None:
    """Queue one `conch.heartbeat` for worker `node` (e.g. `celery@host`) on its direct queue.

    It expires after `expires_s` seconds, so heartbeats sent to a stuck worker do not pile up.
    Raises kombu's OperationalError (a KombuError) when the broker cannot be reached.
    """
    current_app.send_task(
        HEARTBEAT_TASK,
        args=[node, time.time()],
        queue=worker_direct(node),
        expires=expires_s,
        retry=False,
    )


# Acked on receipt: a heartbeat lost with a crashed pool process is harmless, and one that comes back
# after a restart would only say the old worker was alive.
@shared_task(name=HEARTBEAT_TASK, ignore_result=True, acks_late=False)
def heartbeat(node: str | None = None, sent_at: float | None = None) -> None:
    """Record that worker `node` ran a task (the proof that it consumes); `sent_at` is Unix seconds.

    Beat's entry sends no node: whichever worker runs it records itself.
    """
    node = node or _worker_node or "unknown"
    _write_json(_node_file(node), {"node": node, "sent_at": sent_at, "done_at": time.time(), "pid": os.getpid()})


@worker_init.connect
def _on_worker_start(sender=None, **_: object) -> None:
    global _worker_node
    _worker_node = getattr(sender, "hostname", None)


def _record_pool_state(task: object, state: str) -> None:
    node = _worker_node
    if not node or getattr(getattr(task, "request", None), "is_eager", False):
        return
    pid = os.getpid()
    path = _pool_dir(node) / str(pid)
    try:
        _write_json(
            path,
            {"state": state, "task": getattr(task, "name", ""), "since": time.time(), "start": _process_start(pid)},
        )
    except OSError:
        # Liveness bookkeeping must never fail a task.
        log.warning("liveness.pool_state_unwritable", extra={"path": str(path)})


@task_prerun.connect
def _on_task_start(sender=None, task=None, **_: object) -> None:
    _record_pool_state(task, "busy")


@task_postrun.connect
def _on_task_end(sender=None, task=None, **_: object) -> None:
    _record_pool_state(task, "idle")


@beat_init.connect
def _on_beat_start(sender=None, **_: object) -> None:
    global _in_beat
    _in_beat = True
    record_beat_tick()


@after_task_publish.connect
def _on_publish(sender=None, **_: object) -> None:
    # Web and workers publish too; only the beat process's publishing says beat is alive.
    if _in_beat:
        try:
            record_beat_tick()
        except OSError:
            log.warning("liveness.beat_tick_unwritable")


def record_beat_tick() -> None:
    """Record that beat is publishing its schedule now."""
    _write_json(_health_dir() / "beat.json", {"published_at": time.time(), "pid": os.getpid()})


def _busy_pool(node: str) -> tuple[list[str], int]:
    """Tasks the live pool processes of `node` are running, and how many live ones are idle."""
    busy: list[str] = []
    idle = 0
    folder = _pool_dir(node)
    for path in folder.glob("[0-9]*") if folder.is_dir() else ():
        state = _read_json(path)
        if state is None:
            continue
        if state.get("start") is None or _process_start(int(path.name)) != state["start"]:
            # A pool process that exited (or was killed) left this behind.
            path.unlink(missing_ok=True)
            continue
        if state["state"] == "busy":
            busy.append(state.get("task") or "?")
        else:
            idle += 1
    return busy, idle


def worker_liveness(*, node: str, max_age_s: float, now: float | None = None) -> Liveness:
    """Tell whether worker `node` took a heartbeat within `max_age_s` seconds (or is busy on every process).

    Alive when its last `conch.heartbeat` ran at most `max_age_s` ago, or when every live pool
    process of the node is running a task (nothing free to run a heartbeat, which is not stuck).
    Someone must keep sending heartbeats (`send_worker_heartbeat`, the beat schedule) more often than
    `max_age_s`.
    """
    now = time.time() if now is None else now
    record = _read_json(_node_file(node))
    age = None if record is None else now - float(record["done_at"])
    if age is not None and age <= max_age_s:
        return Liveness(True, f"ran a heartbeat {age:.0f} s ago")
    busy, idle = _busy_pool(node)
    seen = "never ran a heartbeat" if age is None else f"ran no heartbeat for {age:.1f} s (limit {max_age_s:g} s)"
    if busy and not idle:
        return Liveness(True, f"{seen}, but every pool process is busy: {', '.join(sorted(busy))}")
    return Liveness(False, f"{seen} with no pool process busy: it is not taking tasks")


def beat_liveness(*, max_age_s: float, now: float | None = None) -> Liveness:
    """Tell whether beat published a task within `max_age_s` seconds."""
    now = time.time() if now is None else now
    record = _read_json(_health_dir() / "beat.json")
    if record is None:
        return Liveness(False, "beat never published a task")
    age = now - float(record["published_at"])
    if age <= max_age_s:
        return Liveness(True, f"beat published a task {age:.0f} s ago")
    return Liveness(False, f"beat published no task for {age:.1f} s (limit {max_age_s:g} s)")

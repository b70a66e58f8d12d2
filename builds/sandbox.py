"""Inspect untrusted model files in a child process with CPU-time and memory limits.

An uploaded file is untrusted input to large C++ parsers (protobuf, onnx, onnxruntime). Run in the worker, a file
that crashes one of them kills the worker process (and Celery redelivers the build to the next worker, forever), and
one built to exhaust them hangs the worker or eats the machine's memory. Here the parsing runs in a fresh Python
process (`subprocess`, not fork: nothing of the worker's state, sockets or secrets is inherited), limited with
`resource.setrlimit` (`RLIMIT_CPU`: CPU seconds; `RLIMIT_AS`: bytes of address space) once its modules are imported,
so the limits measure the file's parsing, not our imports. Its environment holds no variable of Conch's beyond what
Python needs. The parent also bounds the wall-clock time, for a child blocked without using CPU.

What comes back:
- the target's result (for `inspect_onnx_in_sandbox`: the `ModelSignature`);
- an `InspectionError` (or other `InvalidInput`) raised in the child: the same error, same detail and field;
- a crash (a signal), the CPU or wall-clock limit, or memory exhaustion: `InvalidInput` (field `file`) saying what
  happened and the limits, which the build records as its failure: the task ends normally, nothing is redelivered;
- any other exception in the child (a bug, a broken installation): `SandboxError`, an internal error.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import mmap
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from builds.inspection import InspectionError, ModelSignature, inspect_onnx
from conch.errors import InvalidInput

__all__ = ["SandboxError", "SandboxLimits", "cut_network", "inspect_onnx_in_sandbox", "run_in_sandbox"]

log = logging.getLogger(__name__)

# The project root, so the child imports the same `builds` package as the parent.
_PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Variables the child keeps from the parent's environment: locale, home and temp folder. Nothing else.
_INHERITED_VARIABLES = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ")
# Extra CPU seconds between the soft limit (SIGXCPU) and the hard one (SIGKILL), for a child that ignores SIGXCPU.
_CPU_HARD_MARGIN_S = 5
# Signs of a failed allocation in messages from onnx/onnxruntime/the loader, which some libraries turn into an
# ordinary error instead of MemoryError.
_MEMORY_SIGNS = ("bad_alloc", "bad allocation", "cannot allocate memory", "failed to map segment", "out of memory")
_STDERR_TAIL_BYTES = 4000


class SandboxError(RuntimeError):
    """The child failed in a way that says nothing about the file (an unexpected exception, a lost result)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    `cpu_seconds`: CPU time (all threads together) the target may use after the child's imports, whole seconds >= 1
    (`RLIMIT_CPU`). `memory_bytes`: the child's whole address space, imports included (`RLIMIT_AS`; Python with
    onnx and onnxruntime loaded takes about 0.2-0.5 GB of it). `wall_seconds`: wall-clock time of the whole run,
    imports included, after which the child is killed.
    """

    cpu_seconds: int
    memory_bytes: int
    wall_seconds: float

    @classmethod
    def from_settings(cls) -> SandboxLimits:
        """Limits from CONCH_INSPECT_CPU_SECONDS and CONCH_INSPECT_MEMORY_BYTES; wall time is 3x CPU + 30 s."""
        cpu = int(settings.CONCH_INSPECT_CPU_SECONDS)
        return cls(cpu_seconds=cpu, memory_bytes=int(settings.CONCH_INSPECT_MEMORY_BYTES), wall_seconds=3 * cpu + 30)

    def describe(self) -> str:
        """The limits in words, naming the settings that set them."""
        return (
            f"{self.cpu_seconds} s of CPU time (CONCH_INSPECT_CPU_SECONDS), {_size(self.memory_bytes)} of memory "
            f"(CONCH_INSPECT_MEMORY_BYTES) and {self.wall_seconds:g} s in all"
        )


def inspect_onnx_in_sandbox(path: Path, *, limits: SandboxLimits | None = None) -> ModelSignature:
    """Run `builds.inspection.inspect_onnx(path)` in a limited child process; return the same `ModelSignature`.

    `limits` defaults to `SandboxLimits.from_settings()`. Raises `InspectionError` exactly as `inspect_onnx` would,
    `InvalidInput` (field `file`) when the child crashed or ran past a limit, `SandboxError` for an internal failure.
    """
    value = run_in_sandbox(f"{__name__}:_inspect_to_dict", Path(path), limits=limits or SandboxLimits.from_settings())
    return ModelSignature.from_dict(value)


def _inspect_to_dict(path: Path) -> dict[str, Any]:
    return inspect_onnx(path).to_dict()


def run_in_sandbox(target: str, path: Path, *, limits: SandboxLimits) -> Any:
    """Call `target(path)` (`"package.module:function"`, returning JSON data) in a limited child; return its result.

    The function must be importable from the project root; its module is imported before the limits apply.
    Raises what `run_in_sandbox`'s module docstring lists: the child's `InvalidInput` (`InspectionError` kept),
    `InvalidInput` (field `file`) for a crash or a limit, `SandboxError` otherwise; `ValueError` for limits < 1.
    """
    if limits.cpu_seconds < 1 or limits.memory_bytes < 1 or limits.wall_seconds <= 0:
        raise ValueError(f"sandbox limits must be positive, got {limits}")
    with tempfile.TemporaryDirectory(prefix="conch-sandbox-") as work:
        result_path = Path(work) / "result.json"
        stderr_path = Path(work) / "stderr.txt"
        command = [
            sys.executable,
            "-c",
            f"{_CUT_NETWORK}; import {__name__} as sandbox; sandbox.child_main()",
            target,
            str(Path(path).resolve()),
            str(result_path),
            str(limits.cpu_seconds),
            str(limits.memory_bytes),
        ]
        with stderr_path.open("wb") as stderr:
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=_child_environment(),
                cwd=work,
                # Its own process group: a timeout kills whatever the parsers may have started too.
                start_new_session=True,
                close_fds=True,
            )
            status, cpu_used, timed_out = _wait(child, limits.wall_seconds)
        outcome = _read_outcome(result_path)
        stderr_tail = _tail(stderr_path)
    return _interpret(outcome, status, cpu_used, timed_out, limits, target=target, stderr_tail=stderr_tail)


def _child_environment() -> dict[str, str]:
    environment = {name: os.environ[name] for name in _INHERITED_VARIABLES if name in os.environ}
    environment["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), os.defpath))
    environment["PYTHONPATH"] = str(_PROJECT_ROOT)
    # Python's hash seed and bytecode cache play no part; keep the child from writing .pyc files into the tree.
    environment["PYTHONDONTWRITEBYTECODE"] = "1"
    return environment


def _wait(child: subprocess.Popen, wall_seconds: float) -> tuple[int | None, float, bool]:
    """Wait for `child` up to `wall_seconds`; return (wait status, CPU seconds it used, whether it was killed).

    The status is None when another part of the process reaped the child first.
    """
    deadline = time.monotonic() + wall_seconds
    pause = 0.01
    while True:
        try:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (a SIGCHLD handler): its status is lost
            return None, 0.0, False
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return status, usage.ru_utime + usage.ru_stime, False
        if time.monotonic() >= deadline:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            return status, usage.ru_utime + usage.ru_stime, True
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _read_outcome(result_path: Path) -> dict[str, Any] | None:
    try:
        outcome = json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return outcome if isinstance(outcome, dict) else None


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-_STDERR_TAIL_BYTES:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()


def _interpret(
    outcome: dict[str, Any] | None,
    status: int | None,
    cpu_used: float,
    timed_out: bool,
    limits: SandboxLimits,
    *,
    target: str,
    stderr_tail: str,
) -> Any:
    kind = outcome.get("status") if outcome else None
    if kind == "ok" and not timed_out:
        return outcome["value"]
    if kind == "invalid":
        detail, field = str(outcome.get("detail", "")), outcome.get("field") or "file"
        if _looks_like_memory(detail):
            raise _limit_error("it ran out of memory", limits)
        if outcome.get("error_class") == "InspectionError":
            raise InspectionError(detail, field=field)
        raise InvalidInput(detail, field=field)
    if kind == "memory":
        raise _limit_error("it ran out of memory", limits)
    if timed_out:
        raise _limit_error(f"it did not finish within {limits.wall_seconds:g} s and was stopped", limits)
    if status is None:
        raise SandboxError("The inspection process was reaped elsewhere; its result is lost. Rebuild the version.")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_used >= limits.cpu_seconds):
            raise _limit_error(f"it used more than {limits.cpu_seconds} s of CPU time and was stopped", limits)
        raise _limit_error(f"the parser crashed (signal {_signal_name(signum)})", limits)
    if kind == "error":
        detail = f"{outcome.get('type', 'Exception')}: {outcome.get('detail', '')}"
        if _looks_like_memory(detail):
            raise _limit_error("it ran out of memory", limits)
        log.warning("build.inspect.sandbox_error", extra={"target": target, "error": detail, "stderr": stderr_tail})
        raise SandboxError(f"The inspection process failed: {detail}")
    code = os.waitstatus_to_exitcode(status)
    log.warning("build.inspect.sandbox_lost", extra={"target": target, "exit_code": code, "stderr": stderr_tail})
    if _looks_like_memory(stderr_tail):
        raise _limit_error("it ran out of memory", limits)
    raise _limit_error(f"the parser stopped with exit status {code} before giving a result", limits)


def _limit_error(what: str, limits: SandboxLimits) -> InvalidInput:
    return InvalidInput(
        f"The model file could not be inspected: {what}. Uploaded files are inspected in a separate process limited "
        f"to {limits.describe()}. The file may be damaged or made to exhaust the ONNX parser; if it is a valid model "
        "that needs more, an administrator can raise these limits, then rebuild the version.",
        field="file",
    )


def _looks_like_memory(text: str) -> bool:
    lowered = text.lower()
    return any(sign in lowered for sign in _MEMORY_SIGNS)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _size(count: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= size:
            return f"{count / size:g} {unit}"
    return f"{count} bytes"


# --- the child ---------------------------------------------------------------------------------------------------


def child_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the child: `<target> <path> <result file> <cpu seconds> <memory bytes>`; never returns.

    Imports the target, applies the limits, calls it, and writes one JSON outcome to the result file:
    `{"status": "ok", "value": ...}`, `{"status": "invalid", "error_class", "detail", "field"}`,
    `{"status": "memory"}` or `{"status": "error", "type", "detail"}`. The file is opened and the memory outcome
    encoded before the limits apply, so a child that exhausted its memory can still report it.
    """
    target, path, result_path, cpu_seconds, memory_bytes = list(argv if argv is not None else sys.argv[1:])
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    memory_outcome = json.dumps({"status": "memory"}).encode()
    result = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    _apply_limits(int(cpu_seconds), int(memory_bytes))
    try:
        outcome = _call(function, Path(path))
        if outcome["status"] == "invalid" and not _has_headroom(Path(path)):
            outcome = {"status": "memory"}
        data = json.dumps(outcome).encode()
    except MemoryError:
        data = memory_outcome
    except Exception as exc:  # the target returned something that is not JSON data
        data = json.dumps({"status": "error", "type": type(exc).__name__, "detail": str(exc)[:2000]}).encode()
    os.write(result, data)
    os.close(result)
    # Skip interpreter teardown: the parsers' destructors have nothing to give back, and may crash after a failure.
    os._exit(0)


def _call(function: Any, path: Path) -> dict[str, Any]:
    """Call the target; turn what it raises into an outcome (MemoryError propagates: it is reported pre-encoded)."""
    try:
        return {"status": "ok", "value": function(path)}
    except InvalidInput as exc:
        return {
            "status": "invalid",
            "error_class": "InspectionError" if isinstance(exc, InspectionError) else "InvalidInput",
            "detail": exc.detail,
            "field": exc.field,
        }
    except MemoryError:
        raise
    except Exception as exc:
        return {"status": "error", "type": type(exc).__name__, "detail": str(exc)[:2000]}


def _has_headroom(path: Path) -> bool:
    """Whether the address space left could hold the parsers' copies of the file: 3x its size plus 64 MiB.

    Parsers do not always report a failed allocation as one: protobuf, for one, says the message does not parse.
    When a file was refused and the limit leaves less than what parsing it takes (the bytes read, the parsed copy,
    onnxruntime's copy), the refusal says nothing about the file, so it is reported as memory exhaustion.
    Reserving address space (an anonymous mapping, never touched) costs no memory.
    """
    try:
        needed = 3 * path.stat().st_size + 64 * 1024**2
        mmap.mmap(-1, needed).close()
    except (MemoryError, OSError, OverflowError, ValueError):
        return False
    return True


# unshare(2) flags (linux/sched.h): a new user namespace (unprivileged processes may make one where the kernel
# allows it) with a new network namespace, else the network namespace alone (needs CAP_SYS_ADMIN).
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
#: How the child tells itself whether its network was cut: set by its first statement (`_CUT_NETWORK`).
_NETWORK_STATE = "CONCH_SANDBOX_NETWORK"
# The child's first statement, before any import that could start a thread (unshare of a user namespace needs a
# single-threaded process): move into a network namespace of its own, which has no interface but a loopback that
# is down, so that nothing run in the child reaches any host, this one included.
_CUT_NETWORK = (
    "import ctypes, os; libc = ctypes.CDLL(None); "
    f"os.environ[{_NETWORK_STATE!r}] = 'cut' if libc.unshare({_CLONE_NEWUSER | _CLONE_NEWNET}) == 0 "
    f"or libc.unshare({_CLONE_NEWNET}) == 0 else 'open'"
)


def cut_network() -> None:
    """Sandbox child only: make sure the child has no network before code from a file runs (an unpickled model).

    Every sandbox child tries to cut its network first thing (`_CUT_NETWORK`; where it cannot, the parsers it runs
    need none anyway). Raises `InvalidInput` (field "file") when this child's could not be cut: a file that needs
    code run to load is then not loaded at all.
    """
    if os.environ.get(_NETWORK_STATE) == "cut":
        return
    raise InvalidInput(
        "This model can only be loaded by running code from its file, which Conch does only with the network cut "
        "off, and this worker cannot cut it off (unshare of a network namespace was refused). An operator can "
        "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or give the worker "
        "CAP_SYS_ADMIN; otherwise export the model to ONNX yourself and upload the .onnx file.",
        field="file",
    )


def _apply_limits(cpu_seconds: int, memory_bytes: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # RLIMIT_CPU counts from process start; give the target its own budget on top of what the imports used.
    soft_cpu = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_seconds
    _lower_limit(resource.RLIMIT_CPU, soft_cpu, soft_cpu + _CPU_HARD_MARGIN_S)
    # Hard limits too: code the file manages to run cannot raise them again.
    _lower_limit(resource.RLIMIT_AS, memory_bytes, memory_bytes)
    # No core dumps of a crashed parser (they would hold the file's contents and fill the disk).
    _lower_limit(resource.RLIMIT_CORE, 0, 0)


def _lower_limit(which: int, soft: int, hard: int) -> None:
    """Set a limit, never above the hard limit the child already has (lowering is all a process may do)."""
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))

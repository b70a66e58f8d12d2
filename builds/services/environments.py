"""Python models' execution environments in the object store, built once per resolution and reused.

An environment (`builds.environments`) is stored at `environments/<key>.tar.gz`, `key` being the SHA-256 of its
pinned wheels and its Triton (`environment_key`), with `environments/<key>.json` listing the pins. A build whose
requirements resolve to the same wheels for the same Triton reuses the stored archive; the repository gets a copy
of it beside the model's config.pbtxt, so that Triton (local, or a Kubernetes pod that fetches the repository)
finds it with the model and nothing is installed when a server starts.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from builds.environments import EnvironmentTarget, Pin, environment_key, install, pack, parse_requirements, resolve
from builds.packaging import upload_file
from conch.errors import NotFound
from models_registry.storage import ObjectStore

__all__ = ["ENVIRONMENTS_PREFIX", "StoredEnvironment", "ensure_environment", "environment_target"]

#: Where environments live in the object store (outside every repository prefix, so repository garbage collection
#: never touches them).
ENVIRONMENTS_PREFIX = "environments"


@dataclass(frozen=True)
class StoredEnvironment:
    """An environment in the object store.

    Attributes:
        key: its identity (`builds.environments.environment_key`, 64 hex digits).
        object_key: the packed archive's key in the store.
        size_bytes: the archive's size in bytes.
        pins: the packages it holds.
        reused: whether it was in the store already (built by an earlier build).
    """

    key: str
    object_key: str
    size_bytes: int
    pins: tuple[Pin, ...]
    reused: bool


def environment_target() -> EnvironmentTarget:
    """The Triton this installation builds environments for, from settings (CONCH_TRITON_PYTHON_VERSION,
    CONCH_TRITON_PYTHON_HOME, CONCH_TRITON_GLIBC, CONCH_TRITON_PYTHON_CONSTRAINTS, CONCH_ENVIRONMENT_FIND_LINKS,
    CONCH_ENVIRONMENT_TIMEOUT_SECONDS)."""
    return EnvironmentTarget(
        python_version=settings.CONCH_TRITON_PYTHON_VERSION,
        python_home=settings.CONCH_TRITON_PYTHON_HOME,
        glibc=settings.CONCH_TRITON_GLIBC,
        constraints=tuple(settings.CONCH_TRITON_PYTHON_CONSTRAINTS),
        find_links=tuple(settings.CONCH_ENVIRONMENT_FIND_LINKS),
        timeout_s=settings.CONCH_ENVIRONMENT_TIMEOUT_SECONDS,
    )


def ensure_environment(store: ObjectStore, requirements_text: str, say: Callable[[str], None]) -> StoredEnvironment:
    """The stored environment for a Python model's requirements.txt text: resolved now (`resolve`), then reused
    from the store when an environment of the same pins exists, else installed, packed and stored.

    Raises InvalidInput (field "requirements") for a line that is not a requirement or a package with no wheel for
    the target, PayloadTooLarge past CONCH_ENVIRONMENT_MAX_BYTES, Unavailable when the package index or the store
    cannot be reached (the build retries).
    """
    target = environment_target()
    requirements = parse_requirements(requirements_text)
    say(f"resolving {len(requirements)} requirement(s) for {target.describe()}, wheels only: {', '.join(requirements)}")
    started = time.monotonic()
    pins = resolve(requirements, target)
    say(f"resolved in {time.monotonic() - started:.1f} s: " + ", ".join(f"{pin.name}=={pin.version}" for pin in pins))
    key = environment_key(pins, target)
    object_key = f"{ENVIRONMENTS_PREFIX}/{key}.tar.gz"
    try:
        size = store.size(object_key)
    except NotFound:
        size = -1
    if size >= 0:
        say(f"reusing the environment {key[:12]} ({size} bytes), built before for the same pins")
        return StoredEnvironment(key=key, object_key=object_key, size_bytes=size, pins=pins, reused=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conch-env-") as work:
        folder, archive = Path(work) / "env", Path(work) / "env.tar.gz"
        installed = install(pins, target, folder, max_bytes=settings.CONCH_ENVIRONMENT_MAX_BYTES)
        size = pack(folder, archive)
        upload_file(store, archive, object_key)
    store.put_bytes(
        f"{ENVIRONMENTS_PREFIX}/{key}.json",
        json.dumps({"target": target.to_dict(), "pins": [pin.to_dict() for pin in pins]}, indent=1).encode(),
    )
    say(
        f"built the environment {key[:12]} in {time.monotonic() - started:.1f} s: {installed} bytes installed, "
        f"{size} bytes packed"
    )
    return StoredEnvironment(key=key, object_key=object_key, size_bytes=size, pins=pins, reused=False)

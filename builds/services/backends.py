"""Custom backends a team registers (`CustomBackend`): checked, stored, listed, deleted, and found for the models
whose configuration names them.

Registering takes an archive (zip or tar) of the backend's folder as Triton wants it in its backend directory
(Triton "Backends"; Python backend README "Python-based Backends"): either `model.py` (a Python-based backend:
Triton loads `<backend-dir>/<name>/model.py` when no `libtriton_<name>.so` is there), or `libtriton_<name>.so`
with the libraries it needs beside it. The archive is unpacked in the sandbox (`builds.archives`); a library is
read in the sandbox too (`builds.backend_library`, pyelftools: parsed, never loaded) against the Triton release this
installation runs; model.py is parsed with `ast`, never run. What passes is stored under
`backends/<team id>/<name>/<version>/` in the object store, recorded, and audited.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from builds.archives import unpack_archive_in_sandbox
from builds.backend_library import find_server_library, read_backend_api_version
from builds.formats.python_model import ENTRY_FILENAME, check_model_py
from builds.models import Build, CustomBackend
from builds.packaging import upload_file
from builds.sandbox import SandboxLimits, run_in_sandbox
from conch.errors import Conflict, InvalidInput, NotFound
from conch.limits import BodyLimit
from conch.upload_handlers import MULTIPART_SLACK_BYTES
from models_registry.storage import get_object_store
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.services import TokenGrant, get_team_for_user, require_role, teams_for_user
from tritonserving.server import locate_installation

__all__ = [
    "BACKEND_BODY",
    "BACKENDS_PREFIX",
    "RESERVED_BACKEND_NAMES",
    "backend_for_model",
    "delete_backend",
    "get_backend",
    "list_backends",
    "register_backend",
    "stage_backend",
]

#: A backend registration's body (the API's and the console's): the archive and the small form fields.
BACKEND_BODY = BodyLimit(
    setting="CONCH_MAX_BACKEND_BYTES",
    variable="CONCH_MAX_BACKEND_BYTES",
    field="file",
    extra_bytes=MULTIPART_SLACK_BYTES,
)
#: Where registered backends' files live in the object store.
BACKENDS_PREFIX = "backends"
#: Names Triton's own backends (and its ensemble scheduler) go by: a team's backend may not shadow one.
RESERVED_BACKEND_NAMES = frozenset(
    {
        "python",
        "onnxruntime",
        "pytorch",
        "tensorrt",
        "tensorflow",
        "openvino",
        "dali",
        "fil",
        "identity",
        "repeat",
        "square",
        "ensemble",
        "vllm",
        "tensorrtllm",
    }
)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_API_VERSION = re.compile(r"(\d{1,4})\.(\d{1,4})")


def _check_identity(name: str, version: str) -> None:
    if not _NAME.fullmatch(name or ""):
        raise InvalidInput(
            f"Backend name {name!r}: use 1-63 characters, lower-case letters, digits and '_', starting with a letter "
            "(Triton loads it from the folder of that name and the library libtriton_<name>.so).",
            field="name",
        )
    if name in RESERVED_BACKEND_NAMES:
        raise InvalidInput(
            f"Backend name {name!r} is one of Triton's own backends; pick another name (for example {name}_custom).",
            field="name",
        )
    if not _VERSION.fullmatch(version or ""):
        raise InvalidInput(
            f"Backend version {version!r}: use 1-64 letters, digits, '.', '_', '+' or '-' (for example 1.2.0).",
            field="version",
        )


def _parse_api_version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = _API_VERSION.fullmatch(text.strip())
    if match is None:
        raise InvalidInput(
            f"api_version {text!r} is not MAJOR.MINOR: give the TRITONBACKEND API version the backend was built "
            "against (TRITONBACKEND_API_VERSION_MAJOR.MINOR of its tritonbackend.h, for example 1.19), or leave it "
            "empty.",
            field="api_version",
        )
    return int(match.group(1)), int(match.group(2))


def _backend_root(folder: Path, files: Sequence[str]) -> tuple[Path, list[str]]:
    """The folder holding the backend (the archive's top, or its one top-level folder) and its files relative to
    it."""
    paths = [PurePosixPath(name) for name in files]
    tops = {path.parts[0] for path in paths}
    if len(tops) == 1 and all(len(path.parts) > 1 for path in paths):
        top = next(iter(tops))
        return folder / top, [PurePosixPath(*path.parts[1:]).as_posix() for path in paths]
    return folder, [path.as_posix() for path in paths]


def _check_library(root: Path, files: list[str], *, name: str, declared: tuple[int, int] | None) -> dict[str, Any]:
    installation = locate_installation()
    server_library = find_server_library(installation.libs_dir)
    server_api = read_backend_api_version(server_library, library_dirs=(installation.libs_dir,))
    with tempfile.TemporaryDirectory(prefix="conch-backend-check-") as work:
        job = Path(work) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "path": str(root / f"libtriton_{name}.so"),
                    "name": name,
                    "machine": settings.CONCH_TRITON_MACHINE,
                    "server_library": str(server_library),
                    "shipped": [PurePosixPath(f).name for f in files if f != f"libtriton_{name}.so"],
                    "declared": list(declared) if declared else None,
                    "server_api_version": list(server_api),
                }
            )
        )
        return run_in_sandbox("builds.backend_library:check_library_job", job, limits=SandboxLimits.from_settings())


def register_backend(
    *,
    user: User,
    team_slug: str,
    name: str,
    version: str,
    archive: Path,
    api_version: str | None = None,
    token: TokenGrant | None = None,
) -> CustomBackend:
    """Check and store a custom backend from the archive file `archive` (zip or tar) for the team `team_slug`.

    Needs the developer role and, with a token, the `models:write` scope. The archive holds (at its top, or in one
    top-level folder) either `model.py` defining `TritonPythonModel` (a Python-based backend) or
    `libtriton_<name>.so` and the libraries it needs (checked by `builds.backend_library` against the Triton
    release this installation runs and the nodes' architecture, CONCH_TRITON_MACHINE; `api_version`, "1.19", is
    the backend API version it was built against, optional).

    Raises InvalidInput naming the field (`name`, `version`, `api_version`, `file`: what the archive lacks or what
    the checks found), NotFound / Forbidden for the team, Conflict (field `version`) when the team has that name and
    version already, Unavailable when the store or the sandbox fails.
    """
    _check_identity(name, version)
    declared = _parse_api_version(api_version)
    team = get_team_for_user(user=user, slug=team_slug, token=token)
    require_role(
        user=user,
        team=team,
        role=Role.DEVELOPER,
        action="Registering a backend",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    if CustomBackend.objects.filter(team=team, name=name, version=version).exists():
        raise Conflict(
            f"Team '{team.slug}' has backend {name} version {version} already; register a new version.",
            field="version",
        )
    with tempfile.TemporaryDirectory(prefix="conch-backend-") as work:
        unpacked = unpack_archive_in_sandbox(archive, Path(work) / "unpacked")
        root, files = _backend_root(Path(work) / "unpacked", unpacked.files)
        library = f"libtriton_{name}.so"
        if library in files:
            kind = CustomBackend.KIND_LIBRARY
            report = _check_library(root, files, name=name, declared=declared)
        elif ENTRY_FILENAME in files:
            kind = CustomBackend.KIND_PYTHON
            try:
                methods = check_model_py((root / ENTRY_FILENAME).read_bytes())
            except InvalidInput as exc:  # its words are a Python model's; here it is a backend's model.py
                raise InvalidInput(
                    "Python-based backend: " + exc.detail.removeprefix("Python model: "), field="file"
                ) from None
            report = {"methods": list(methods)}
        else:
            others = sorted(f for f in files if PurePosixPath(f).name.startswith("libtriton_"))
            hint = f" It holds {others[0]}, which is a backend named {others[0][10:-3]!r}." if others else ""
            raise InvalidInput(
                f"The archive holds neither {library} nor model.py at its top.{hint} A backend named {name!r} is "
                f"a shared library {library} (with the libraries it needs beside it) or, for a Python-based backend, "
                "a model.py defining TritonPythonModel.",
                field="file",
            )
        prefix = f"{BACKENDS_PREFIX}/{team.pk}/{name}/{version}"
        store = get_object_store()
        size = 0
        for relative in files:
            upload_file(store, root / relative, f"{prefix}/{relative}")
            size += (root / relative).stat().st_size
    try:
        with transaction.atomic():
            backend = CustomBackend.objects.create(
                team=team,
                name=name,
                version=version,
                kind=kind,
                files_prefix=prefix,
                files=sorted(files),
                size_bytes=size,
                report=report,
                created_by=user,
            )
            record_audit(
                action=AuditAction.BACKEND_REGISTERED,
                team=team,
                target=backend,
                after={"name": name, "version": version, "kind": kind, "size_bytes": size},
            )
    except IntegrityError:
        raise Conflict(
            f"Team '{team.slug}' has backend {name} version {version} already; register a new version.",
            field="version",
        ) from None
    return backend


def list_backends(*, user: User, token: TokenGrant | None = None) -> QuerySet[CustomBackend]:
    """The backends of the teams `user` (and `token`) may see, newest first per name."""
    return CustomBackend.objects.filter(team__in=teams_for_user(user=user, token=token)).select_related("team")


def get_backend(*, user: User, backend_id: int, token: TokenGrant | None = None) -> CustomBackend:
    """One backend the caller may see. Raises NotFound (also for another team's)."""
    backend = list_backends(user=user, token=token).filter(pk=backend_id).first()
    if backend is None:
        raise NotFound(f"Backend {backend_id} not found.")
    return backend


def delete_backend(*, user: User, backend_id: int, token: TokenGrant | None = None) -> None:
    """Delete a backend and its files (the developer role, `models:write` with a token). Raises NotFound, Forbidden,
    Conflict (field `backend`) while a model version built with it exists, naming one."""
    backend = get_backend(user=user, backend_id=backend_id, token=token)
    require_role(
        user=user,
        team=backend.team,
        role=Role.DEVELOPER,
        action="Deleting a backend",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    used = Build.objects.filter(backend__id=backend.pk).select_related("version__model").first()
    if used is not None:
        raise Conflict(
            f"Backend {backend.name} {backend.version} serves version {used.version.number} of model "
            f"{used.version.model.name!r}; delete that version first (DELETE /api/v1/versions/{used.version_id}/).",
            field="backend",
        )
    get_object_store().delete_prefix(backend.files_prefix.rstrip("/") + "/")
    with transaction.atomic():
        record_audit(
            action=AuditAction.BACKEND_DELETED,
            team=backend.team,
            target=backend,
            before={"name": backend.name, "version": backend.version},
        )
        backend.delete()


def backend_for_model(*, team_id: int, name: str) -> CustomBackend | None:
    """The backend a new build of a model naming backend `name` uses: the team's most recently registered version
    of that name, or None when the team has none."""
    return CustomBackend.objects.filter(team_id=team_id, name=name).order_by("-created_at", "-pk").first()


def stage_backend(files_prefix: str, target: Path, *, label: str) -> None:
    """Download a backend's files (under `files_prefix` in the object store: `CustomBackend.files_prefix`, as a
    `Build.backend` record keeps it) into the folder `target`, keeping their relative paths; the folder appears
    whole or not at all (written beside it, then renamed). `label` names the backend in errors ("tnn 1.0").
    Raises NotFound when the files are gone, Unavailable."""
    store = get_object_store()
    prefix = files_prefix.rstrip("/") + "/"
    keys = store.list_keys(prefix)
    if not keys:
        raise NotFound(f"The files of backend {label} are gone from the object store; register it again.")
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    for key in keys:
        store.download_to(key, partial / key[len(prefix) :])
    if target.exists():
        shutil.rmtree(partial, ignore_errors=True)
        return
    partial.rename(target)

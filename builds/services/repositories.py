"""The other models of an uploaded Triton model repository: each becomes a model of the team, with a version of
its own built from its folder.

A build of a repository serves the model named as the Conch model it was uploaded to
(`builds.formats.triton_repository.pick_model`); every other model of the repository is registered here, in the
same team and by the same user: a Conch model named as its folder (made a valid name where it is not: "text_det"
-> "text-det"), created when the team has none of that name, and a new version whose file is a zip of the model's
folder (the same bytes for the same folder, so a build run again adds no second version: an identical file is
already a version). Each of them is built, checked and verified by its own build. A model that cannot be
registered (a backend Conch does not serve, a name, the team's quota, the user's role) is left out with the reason
in the build log; it never fails the build of the model the upload was for.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from builds.formats.triton_repository import CONFIG_FILENAME, RepositoryModel, check_served
from builds.services.submission import submit_upload
from conch.errors import ConchError, Unavailable
from models_registry import services as registry
from models_registry.naming import suggest_model_name
from models_registry.storage import get_object_store
from tritonserving.config import ModelConfig, config_to_pbtxt, serving_versions

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from models_registry.models import ModelVersion

__all__ = ["pack_model_folder", "register_model_versions", "register_repository_models"]

log = logging.getLogger(__name__)

#: The timestamp every member of a packed model folder carries, so that one folder always packs to the same bytes.
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_CHUNK_BYTES = 8 * 1024 * 1024


def pack_model_folder(model: RepositoryModel, target: Path, *, only_version: int | None = None) -> Path:
    """Write a zip of `model`'s folder to `target`, as `<model name>/<path>` members in sorted order with fixed
    timestamps and permissions (the same folder always gives the same bytes); returns `target`.

    A folder without config.pbtxt gets one naming the backend its files showed (`RepositoryModel.backend`), so that
    the zip is told as a Triton model repository again and auto-completed the same way. With `only_version`, the
    zip holds that version's folder and none of the other numbered ones, and its config.pbtxt (the folder's, with
    `version_policy { specific { versions: [only_version] } }`) serves exactly that version.
    """
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        text = ""
        if only_version is not None and model.has_config:
            config = ModelConfig()
            config.CopyFrom(model.config)
            text = "# written by Conch: the folder's config.pbtxt, serving one of its versions\n" + config_to_pbtxt(
                serving_versions(config, [only_version])
            )
        elif not model.has_config:
            text = f'# written by Conch: the folder had no config.pbtxt\nbackend: "{model.backend}"\n'
        if text:
            info = zipfile.ZipInfo(f"{model.name}/{CONFIG_FILENAME}", _FIXED_TIME)
            info.external_attr = 0o644 << 16
            bundle.writestr(info, text, compress_type=zipfile.ZIP_DEFLATED)
        for path in sorted(p for p in model.folder.rglob("*") if p.is_file()):
            relative = path.relative_to(model.folder)
            if text and relative.as_posix() == CONFIG_FILENAME:
                continue
            top = relative.parts[0] if len(relative.parts) > 1 else ""
            if only_version is not None and top.isdigit() and int(top) != only_version:
                continue
            info = zipfile.ZipInfo(f"{model.name}/{relative.as_posix()}", _FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with path.open("rb") as source, bundle.open(info, "w") as member:
                while chunk := source.read(_CHUNK_BYTES):
                    member.write(chunk)
    return target


def register_repository_models(
    *, version: ModelVersion, models: Sequence[RepositoryModel], served: RepositoryModel, say: Callable[[str], None]
) -> list[ModelVersion]:
    """Register every model of `models` but `served` as a model of `version`'s team with a new version built from
    its folder (the module's rule); return the versions made. Each one left out gets a build-log line saying why.

    Raises Unavailable when the object store or the database cannot be reached (the build then retries; what
    was registered stays, and the retry finds it by its file's SHA-256).
    """
    made: list[ModelVersion] = []
    others = [model for model in models if model is not served]
    if not others:
        return made
    user = version.created_by
    team = version.model.team
    if user is None:
        say(f"the repository's {len(others)} other model(s) are not registered: the uploader's account is gone")
        return made
    for model in others:
        name = suggest_model_name(model.name)
        if not name:
            say(f"model {model.name!r}: not registered: no valid model name can be made of its folder's name")
            continue
        try:
            check_served(model)
        except ConchError as refusal:
            say(f"model {model.name!r}: not registered: {refusal.detail.split(': ', 1)[1]}")
            continue
        try:
            made_version = _register(model, name=name, team_slug=team.slug, user=user, say=say)
        except Unavailable:
            raise
        except ConchError as refusal:
            say(f"model {model.name!r}: not registered as {name!r}: {refusal.detail}")
            continue
        if made_version is not None:
            made.append(made_version)
    return made


def register_model_versions(
    *, version: ModelVersion, model: RepositoryModel, served: int, say: Callable[[str], None]
) -> list[ModelVersion]:
    """Register every version `model`'s version policy serves but `served` (the one `version`'s build serves) as the
    next versions of `version`'s Conch model, in ascending order, each built from a zip of the model's folder
    holding that version alone (`pack_model_folder(only_version=...)`); return the versions made. A version whose
    zip is already a version of the model (a build run again) is not registered twice.

    Raises Unavailable when the object store or the database cannot be reached (the build then retries; what
    was registered stays, and the retry finds it by its file's SHA-256).
    """
    made: list[ModelVersion] = []
    others = [number for number in model.versions if number != served]
    user = version.created_by
    if not others:
        return made
    if user is None:
        say(
            f"versions {', '.join(map(str, others))} of {model.name!r} are not registered: the uploader's "
            "account is gone"
        )
        return made
    for number in others:
        try:
            made_version = _register(
                model,
                name=version.model.name,
                team_slug=version.model.team.slug,
                user=user,
                say=say,
                only_version=number,
            )
        except Unavailable:
            raise
        except ConchError as refusal:
            say(f"model {model.name!r} version {number}: not registered: {refusal.detail}")
            continue
        if made_version is not None:
            made.append(made_version)
    return made


def _register(
    model: RepositoryModel,
    *,
    name: str,
    team_slug: str,
    user: User,
    say: Callable[[str], None],
    only_version: int | None = None,
) -> ModelVersion | None:
    registered = registry.model_named(team_slug=team_slug, name=name)
    created = registered is None
    if registered is None:
        registered = registry.create_model(user=user, team_slug=team_slug, name=name)
    store = get_object_store()
    what = f"model {model.name!r}" if only_version is None else f"model {model.name!r} version {only_version}"
    with tempfile.TemporaryDirectory(prefix="conch-repository-") as tmp:
        packed = pack_model_folder(model, Path(tmp) / f"{name}.zip", only_version=only_version)
        digest = hashlib.sha256()
        with packed.open("rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                digest.update(chunk)
        existing = registry.find_duplicate_version(model=registered, sha256=digest.hexdigest())
        if existing is not None:
            say(f"{what}: already Conch model {name!r} version {existing.number} (the same folder); nothing registered")
            return None
        new_version = registry.reserve_version(model=registered, user=user)
        try:
            writer = store.open_writer(new_version.source_key)
            with packed.open("rb") as handle:
                while chunk := handle.read(_CHUNK_BYTES):
                    writer.write(chunk)
            stored = writer.commit()
            new_version = submit_upload(version=new_version, stored=stored, filename=f"{name}.zip", options={})
        except BaseException:
            registry.discard_upload(version=new_version)
            raise
    say(
        f"{what}: registered as Conch model {name!r}"
        + (" (new)" if created else "")
        + f", version {new_version.number} (id {new_version.pk}), its build queued"
    )
    log.info("build.repository.registered", extra={"model": name, "version_id": new_version.pk})
    return new_version

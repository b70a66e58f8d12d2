"""A deployment's own model repository: the Triton repository its servers read, whatever the runtime.

Layout (Triton "Model Repository"): `deployments/<id>/repository/<model>/config.pbtxt` and `<model>/<N>/...`, the
files of version N copied (server-side on S3) from the immutable build repository the deployment pins. Its
`config.pbtxt` is the deployment's effective configuration serving exactly the current version (`version_policy
{ specific { versions: [N] } }`), so a Triton that starts later (a new pod, a restarted server) loads the current
version by itself. A hot update (`deployments.services.updates`) adds the next version's files beside it.

These copies count in the team's storage quota (`Deployment.repository_bytes`, counted by
`deployments.services.quotas`): the bytes a copy will take are reserved before it is made (`repository_request_bytes`,
`version_files_bytes`), the bytes stored are measured once it is written (`record_repository_bytes`), and the count
goes back to 0 when the repository is deleted.
"""

from __future__ import annotations

import logging
import re

from builds import services as builds
from conch.errors import ConchError, NotFound
from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from models_registry.storage import ObjectStore, get_object_store
from tritonserving.config import ModelConfig, config_from_pbtxt, config_to_pbtxt, serving_versions

log = logging.getLogger(__name__)

#: Object-store folder under which every deployment's repository lives.
DEPLOYMENTS_ROOT = "deployments"
_DEPLOYMENT_FOLDER = re.compile(rf"^{DEPLOYMENTS_ROOT}/([0-9]+)/")


def deployment_repository_prefix(deployment_id: int) -> str:
    """Object-store prefix of deployment `deployment_id`'s own Triton repository."""
    return f"{DEPLOYMENTS_ROOT}/{deployment_id}/repository"


def served_config(deployment: Deployment) -> ModelConfig:
    """The deployment's effective configuration, serving exactly its current version."""
    return serving_versions(config_from_pbtxt(deployment.config_pbtxt), [deployment.model_version.number])


def _version_file_keys(store: ObjectStore, *, build_prefix: str, model_name: str, number: int) -> tuple[list[str], str]:
    """The keys a version needs from the build repository at `build_prefix`, and the prefix they are relative to
    (`<build_prefix>/<model>/`): its folder's files (`<number>/...`) and the files beside config.pbtxt (a Python
    model's execution environment, `python_env-<key>.tar.gz`, which config.pbtxt names)."""
    root = f"{build_prefix}/{model_name}/"
    keys = store.list_keys(f"{root}{number}/")
    beside = [key for key in store.list_keys(root) if "/" not in key[len(root) :] and not key.endswith("/config.pbtxt")]
    return keys + beside if keys else [], root


def version_files_bytes(store: ObjectStore, *, build_prefix: str, model_name: str, number: int) -> int:
    """Bytes of version `number`'s files (`<model>/<number>/...` and the files beside config.pbtxt) in the build
    repository at `build_prefix`: what `copy_version_files` copies. Raises Unavailable."""
    keys, _ = _version_file_keys(store, build_prefix=build_prefix, model_name=model_name, number=number)
    return sum(store.size(key) for key in keys)


def repository_request_bytes(*, build_prefix: str, model_name: str, number: int, config: ModelConfig) -> int:
    """Bytes a new deployment's repository will hold: version `number`'s files of the build at `build_prefix`,
    and `config` written as its `config.pbtxt` serving exactly that version. Raises Unavailable."""
    files = version_files_bytes(get_object_store(), build_prefix=build_prefix, model_name=model_name, number=number)
    return files + len(config_to_pbtxt(serving_versions(config, [number])).encode())


def record_repository_bytes(*, deployment_id: int) -> int:
    """Measure the bytes the deployment's repository holds now and record them (`Deployment.repository_bytes`);
    returns them. Without a quota check: they are written already (what was reserved, give or take a few bytes
    of configuration, or less once an older version's files went). Raises Unavailable."""
    store = get_object_store()
    stored = sum(store.size(key) for key in store.list_keys(f"{DEPLOYMENTS_ROOT}/{deployment_id}/"))
    Deployment.objects.filter(pk=deployment_id).update(repository_bytes=stored)
    return stored


def measure_unmeasured_repositories(*, limit: int = 50) -> int:
    """Record the bytes of deployment repositories written before Conch counted them in storage: an older database has
    `repository_bytes` 0 on deployments already serving. Each such deployment that serves (`ready` or
    `degraded`: its repository is written) is measured (`record_repository_bytes`), at most `limit` a call; returns
    how many were. A store that cannot be reached ends the call (the next one goes on). Run by the periodic
    repository garbage collection, so usage heals by itself after an upgrade."""
    measured = 0
    unmeasured = Deployment.objects.filter(
        repository_bytes=0, status__in=(DeploymentStatus.READY, DeploymentStatus.DEGRADED)
    ).values_list("pk", flat=True)[:limit]
    for deployment_id in unmeasured:
        try:
            record_repository_bytes(deployment_id=deployment_id)
        except ConchError as error:
            log.warning("repository.measure_failed", extra={"deployment_id": deployment_id, "error": error.detail})
            break
        measured += 1
    return measured


def copy_version_files(
    store: ObjectStore, *, build_prefix: str, model_name: str, number: int, deployment_id: int
) -> int:
    """Copy version `number`'s files (`<model>/<number>/...`, and the files beside config.pbtxt: a Python model's
    execution environment) of the build repository at `build_prefix` into the deployment's repository; returns how
    many were copied. Files already there are kept: both sides are written once per key (builds are immutable, an
    environment is named by its content's key), so a copy interrupted half-way is finished by the next call.

    Raises NotFound when the build has no files for that version, Unavailable.
    """
    keys, source = _version_file_keys(store, build_prefix=build_prefix, model_name=model_name, number=number)
    target = f"{deployment_repository_prefix(deployment_id)}/{model_name}/"
    if not keys:
        raise NotFound(f"The build repository {build_prefix!r} holds no files of version {number}.")
    copied = 0
    for key in keys:
        destination = target + key[len(source) :]
        if store.exists(destination):
            continue
        store.copy(key, destination)
        copied += 1
    return copied


def write_repository_config(store: ObjectStore, *, deployment_id: int, config: ModelConfig) -> None:
    """Write `config` as the `config.pbtxt` of the deployment's repository (model `config.name`)."""
    key = f"{deployment_repository_prefix(deployment_id)}/{config.name}/config.pbtxt"
    store.put_bytes(key, config_to_pbtxt(config).encode())


def files_beside_config(config: ModelConfig) -> set[str]:
    """The files beside config.pbtxt that `config` names: a Python model's execution environment
    (`EXECUTION_ENV_PATH` = `$$TRITON_MODEL_DIRECTORY/<file>`)."""
    named = config.parameters["EXECUTION_ENV_PATH"].string_value if "EXECUTION_ENV_PATH" in config.parameters else ""
    prefix = "$$TRITON_MODEL_DIRECTORY/"
    return {named[len(prefix) :]} if named.startswith(prefix) and "/" not in named[len(prefix) :] else set()


def remove_other_versions(
    store: ObjectStore,
    *,
    deployment_id: int,
    model_name: str,
    keep: set[int],
    keep_files: set[str] | None = None,
) -> int:
    """Delete the version folders of the deployment's repository other than `keep`; returns how many went. With
    `keep_files`, the files beside config.pbtxt other than those (an environment no version's configuration names
    any more) go too.

    Only for versions no server loads any more (Triton "Modifying the Model Repository": a version's files may
    change only while it is not loading or unloading).
    """
    model_prefix = f"{deployment_repository_prefix(deployment_id)}/{model_name}/"
    keys = store.list_keys(model_prefix)
    present = {key[len(model_prefix) :].split("/", 1)[0] for key in keys}
    removed = 0
    for folder in sorted(present):
        if folder.isdigit() and int(folder) not in keep:
            store.delete_prefix(f"{model_prefix}{folder}/")
            removed += 1
    if keep_files is not None:
        for key in keys:
            name = key[len(model_prefix) :]
            if "/" not in name and name != "config.pbtxt" and name not in keep_files:
                store.delete(key)
    return removed


def ensure_deployment_repository(*, deployment: Deployment) -> None:
    """Fill the deployment's repository with its current version and its `config.pbtxt`; idempotent.

    Reads the files of the build the deployment pins (`repository_prefix`), and records the bytes the repository
    then holds (`record_repository_bytes`). Raises NotFound, Unavailable.
    """
    store = get_object_store()
    version = deployment.model_version
    copy_version_files(
        store,
        build_prefix=deployment.repository_prefix or builds.served_repository_prefix(version),
        model_name=deployment.model_name,
        number=version.number,
        deployment_id=deployment.pk,
    )
    write_repository_config(store, deployment_id=deployment.pk, config=served_config(deployment))
    record_repository_bytes(deployment_id=deployment.pk)


def has_deployment_repository(deployment: Deployment) -> bool:
    """Whether the deployment's repository holds its `config.pbtxt` (deployments started before deployments had
    their own repository serve straight from their build's)."""
    key = f"{deployment_repository_prefix(deployment.pk)}/{deployment.model_name}/config.pbtxt"
    return get_object_store().exists(key)


def delete_deployment_repository(*, deployment_id: int) -> int:
    """Delete the deployment's repository; returns how many objects went. Its bytes stop counting in the team's
    storage once the objects are gone. Raises Unavailable."""
    deleted = get_object_store().delete_prefix(f"{DEPLOYMENTS_ROOT}/{deployment_id}/")
    Deployment.objects.filter(pk=deployment_id).update(repository_bytes=0)
    return deleted


def collect_deployment_repositories() -> int:
    """Delete the repositories of stopped (or deleted) deployments; returns how many repositories went."""
    store = get_object_store()
    found = {
        int(match.group(1))
        for key in store.list_keys(DEPLOYMENTS_ROOT + "/")
        if (match := _DEPLOYMENT_FOLDER.match(key))
    }
    active = set(
        Deployment.objects.filter(pk__in=found).exclude(status=DeploymentStatus.STOPPED).values_list("pk", flat=True)
    )
    for deployment_id in sorted(found - active):
        delete_deployment_repository(deployment_id=deployment_id)
        log.info("deployment.repository.collected", extra={"deployment_id": deployment_id})
    return len(found - active)

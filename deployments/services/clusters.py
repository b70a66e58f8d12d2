"""Kubernetes clusters deployments may run on: registration by an admin, credentials kept encrypted.

A cluster is registered from a kubeconfig file (Kubernetes "Organizing Cluster Access Using kubeconfig Files")
or as the cluster Conch itself runs in (its pod's service account). The kubeconfig is checked for the parts a
client needs (a context naming a cluster with a server and a user), encrypted with `conch.crypto` and never shown
back. Registering the same name again updates it (idempotent).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import yaml
from django.db import transaction

from conch.crypto import encrypt_text
from conch.errors import ConchError, InvalidInput, NotFound
from deployments.models import DEFAULT_TRITON_IMAGE, Cluster
from deployments.runtimes.kubernetes.api import cluster_api
from deployments.runtimes.kubernetes.directory import access_of
from deployments.runtimes.kubernetes.nodes import GpuOffer, gpu_offers
from tenancy.audit import record_audit
from tenancy.choices import AuditAction

log = logging.getLogger(__name__)

__all__ = [
    "VERIFIED_TRITON_RELEASE",
    "cluster_gpu_offers",
    "describe_cluster",
    "get_cluster",
    "image_mismatch",
    "list_clusters",
    "parse_kubeconfig",
    "register_cluster",
    "triton_release_of_image",
    "cluster_tensorrt_version",
    "tensorrt_image_of",
    "tensorrt_versions_match",
    "TENSORRT_OF_RELEASE",
]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def parse_kubeconfig(text: str, *, context: str = "") -> dict[str, Any]:
    """Check kubeconfig YAML `text` and return it as a dict; `context` must name one of its contexts.

    Needs: a `contexts` entry (`context` or, when empty, `current-context`) whose cluster has a `server` and whose
    user is listed under `users`. Raises InvalidInput (field `kubeconfig` or `context`) naming what is missing.
    """
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidInput(f"The kubeconfig is not valid YAML: {error}.", field="kubeconfig") from None
    if not isinstance(config, dict) or config.get("kind", "Config") != "Config":
        raise InvalidInput("The kubeconfig must be a YAML mapping of kind Config.", field="kubeconfig")

    def named(section: str) -> dict[str, dict]:
        entries = config.get(section) or []
        if not isinstance(entries, list):
            raise InvalidInput(f"The kubeconfig's {section} must be a list.", field="kubeconfig")
        return {entry["name"]: entry.get(section[:-1]) or {} for entry in entries if isinstance(entry, dict)}

    contexts, clusters, users = named("contexts"), named("clusters"), named("users")
    wanted = context or config.get("current-context") or ""
    if not wanted:
        raise InvalidInput(
            "The kubeconfig has no current-context; name one of its contexts with --context "
            f"({', '.join(sorted(contexts)) or 'it has none'}).",
            field="context",
        )
    if wanted not in contexts:
        raise InvalidInput(
            f"The kubeconfig has no context {wanted!r}; it has {', '.join(sorted(contexts)) or 'none'}.",
            field="context",
        )
    chosen = contexts[wanted]
    server = clusters.get(chosen.get("cluster", ""), {}).get("server")
    if not server:
        raise InvalidInput(
            f"Context {wanted!r} names cluster {chosen.get('cluster')!r}, which the kubeconfig does not list with a "
            "server URL.",
            field="kubeconfig",
        )
    if chosen.get("user") not in users:
        raise InvalidInput(
            f"Context {wanted!r} names user {chosen.get('user')!r}, which the kubeconfig does not list.",
            field="kubeconfig",
        )
    return config


@transaction.atomic
def register_cluster(
    *,
    name: str,
    namespace: str,
    kubeconfig: str | None = None,
    context: str = "",
    in_cluster: bool = False,
    triton_image: str = DEFAULT_TRITON_IMAGE,
    image_pull_secrets: Sequence[str] = (),
    s3_endpoint: str = "",
    s3_secret_name: str = "",
    pod_service_account: str = "",
    tensorrt_version: str = "",
) -> tuple[Cluster, bool]:
    """Register cluster `name`, or update it when it exists; returns (cluster, created).

    Exactly one of `kubeconfig` (YAML text) and `in_cluster` gives the credentials. `namespace` is where
    deployments' objects go (a DNS label). Raises InvalidInput naming the field: `name`, `namespace`,
    `kubeconfig`, `context`, `image_pull_secrets`, `s3_secret_name`, `pod_service_account` (pods read the
    store with that service account's identity and get no credentials from Conch), `tensorrt_version` (the
    TensorRT the image carries, "10.5.0.18"; empty: `TENSORRT_OF_RELEASE` by the image's tag).
    """
    if not _DNS_LABEL.fullmatch(name or "") or len(name) > 63:
        raise InvalidInput("A cluster name is a DNS label: lowercase letters, digits and '-'.", field="name")
    if not _DNS_LABEL.fullmatch(namespace or "") or len(namespace) > 63:
        raise InvalidInput(
            f"{namespace!r} is not a Kubernetes namespace name (a DNS label of at most 63 characters).",
            field="namespace",
        )
    if bool(kubeconfig) == bool(in_cluster):
        raise InvalidInput(
            "Give either a kubeconfig or in_cluster (Conch's own service account), not both or neither.",
            field="kubeconfig",
        )
    for field, values in (
        ("image_pull_secrets", list(image_pull_secrets)),
        ("s3_secret_name", [s3_secret_name]),
        ("pod_service_account", [pod_service_account]),
    ):
        for value in values:
            if value and not (_DNS_SUBDOMAIN.fullmatch(value) and len(value) <= 253):
                raise InvalidInput(f"{value!r} is not a Kubernetes object name.", field=field)
    if tensorrt_version and not _TENSORRT_VERSION.fullmatch(tensorrt_version):
        raise InvalidInput(
            f"{tensorrt_version!r} is not a TensorRT version: give major.minor.patch, optionally with the build "
            "(10.5.0.18), as the image's TensorRT reports it.",
            field="tensorrt_version",
        )
    encrypted = ""
    if kubeconfig:
        parse_kubeconfig(kubeconfig, context=context)
        encrypted = encrypt_text(kubeconfig)
    cluster, created = Cluster.objects.update_or_create(
        name=name,
        defaults={
            "namespace": namespace,
            "kubeconfig_encrypted": encrypted,
            "context": context,
            "in_cluster": in_cluster,
            "triton_image": triton_image,
            "image_pull_secrets": list(image_pull_secrets),
            "s3_endpoint": s3_endpoint,
            "s3_secret_name": s3_secret_name,
            "pod_service_account": pod_service_account,
            "tensorrt_version": tensorrt_version,
        },
    )
    record_audit(
        action=AuditAction.CLUSTER_REGISTERED,
        team=None,
        target=cluster,
        after={
            "created": created,
            "namespace": namespace,
            "in_cluster": in_cluster,
            "context": context,
            "triton_image": triton_image,
            "tensorrt_version": tensorrt_version,
        },
    )
    log.info("cluster.registered", extra={"cluster": name, "new_cluster": created})
    return cluster, created


def get_cluster(*, name: str) -> Cluster:
    """The registered cluster `name`. Raises NotFound (field `cluster`) listing the ones there are."""
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none is registered"
        raise NotFound(f"There is no cluster {name!r} ({known}).", field="cluster")
    return cluster


#: Triton release of the local binary that verifies every build (nvidia-pytriton 0.7.0 ships Triton 2.51, the
#: release of NGC container 24.10).
VERIFIED_TRITON_RELEASE = "2.51"
_NGC_TAG = re.compile(r":(\d\d)\.(\d\d)(-py3.*)?$")


def triton_release_of_image(image: str) -> str | None:
    """Triton release ("2.51") of an NGC `tritonserver:<YY.MM>-py3` image, or None for another tag.

    NVIDIA's release notes number them monthly: 24.10 is 2.51, one more per month (25.01 is 2.54).
    """
    match = _NGC_TAG.search(image)
    if not match:
        return None
    months = (int(match.group(1)) - 24) * 12 + int(match.group(2)) - 10
    return f"2.{51 + months}"


#: The TensorRT version in NGC's `tritonserver:<YY.MM>-py3` images, for the releases a source was found for: NVIDIA's
#: Triton release notes (20.10: "TensorRT 7.2.1"; 21.10: "TensorRT 8.0.3.4 for x64 Linux") and the image table of
#: Taiwan Computing Cloud's Triton images (22.02, 22.05, 22.08, 22.11, 24.05, 24.12). A cluster registered with
#: `tensorrt_version` overrides it; for another release the operator must give it.
TENSORRT_OF_RELEASE = {
    "20.10": "7.2.1",
    "21.10": "8.0.3.4",
    "22.02": "8.2.3",
    "22.05": "8.2.5.1",
    "22.08": "8.4.2.4",
    "22.11": "8.5.1",
    "24.05": "10.0.1.6",
    "24.12": "10.7.0.23",
}
_TENSORRT_VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}(\.\d{1,6})?")


def cluster_tensorrt_version(cluster: Cluster) -> str | None:
    """The TensorRT version the cluster's Triton image carries: as registered (`Cluster.tensorrt_version`), else
    from `TENSORRT_OF_RELEASE` by the image's NGC tag; None when neither tells."""
    if cluster.tensorrt_version:
        return str(cluster.tensorrt_version)
    match = _NGC_TAG.search(cluster.triton_image)
    return TENSORRT_OF_RELEASE.get(f"{match.group(1)}.{match.group(2)}") if match else None


def tensorrt_versions_match(built: str, carried: str) -> bool:
    """Whether a plan built with TensorRT `built` runs on TensorRT `carried` ("10.7.0" against "10.7.0.23"): the
    components both give must be equal, major.minor.patch at least (TensorRT "Engine Portability": in the standard
    runtime the versions must match)."""
    left, right = built.split("."), carried.split(".")
    shared = min(len(left), len(right))
    return shared >= 3 and left[:shared] == right[:shared]


_TRITON_IMAGE = re.compile(r"^(?P<registry>.*/)?tritonserver:(?P<release>\d\d\.\d\d)-py3$")


def tensorrt_image_of(triton_image: str) -> str | None:
    """The TensorRT image of the same NGC release as the Triton image `triton_image`, from the same registry:
    `nvcr.io/nvidia/tritonserver:24.10-py3` -> `nvcr.io/nvidia/tensorrt:24.10-py3`; None for an image that is not
    a plain `tritonserver:<YY.MM>-py3` (a `-trtllm-` or custom tag carries another TensorRT).

    NVIDIA's "Frameworks Support Matrix" lists one TensorRT version per monthly container release, shared by that
    release's TensorRT and Triton containers, so a plan the TensorRT image builds runs on the Triton of its release.
    """
    match = _TRITON_IMAGE.match(triton_image)
    if not match:
        return None
    return f"{match.group('registry') or ''}tensorrt:{match.group('release')}-py3"


def image_mismatch(image: str) -> str:
    """A sentence when the cluster's Triton image is not the release builds are verified with, else ""."""
    release = triton_release_of_image(image)
    if release == VERIFIED_TRITON_RELEASE:
        return ""
    said = f"Triton {release}" if release else "an unknown Triton release"
    return (
        f"The cluster runs {image} ({said}) but builds are verified with Triton {VERIFIED_TRITON_RELEASE} "
        "(nvcr.io/nvidia/tritonserver:24.10-py3): a model that passed verification may behave differently there."
    )


def cluster_gpu_offers(cluster: Cluster) -> list[GpuOffer]:
    """What the cluster's schedulable, Ready Nodes offer in GPUs (one API request). Raises Unavailable when the
    cluster does not answer."""
    return gpu_offers(cluster_api(access_of(cluster)).nodes())


def describe_cluster(cluster: Cluster) -> dict[str, Any]:
    """A registered cluster as users see it (no credentials): name, namespace, image, the Triton release check,
    and the GPUs its Nodes offer (`gpu_offers` null with `error` when the cluster does not answer)."""
    summary: dict[str, Any] = {
        "name": cluster.name,
        "namespace": cluster.namespace,
        "triton_image": cluster.triton_image,
        "triton_release": triton_release_of_image(cluster.triton_image),
        "tensorrt_version": cluster_tensorrt_version(cluster),
        "verified_triton_release": VERIFIED_TRITON_RELEASE,
        "image_mismatch": image_mismatch(cluster.triton_image),
        "gpu_offers": None,
        "error": "",
    }
    try:
        offers = cluster_gpu_offers(cluster)
    except ConchError as exc:
        summary["error"] = exc.detail
        return summary
    summary["gpu_offers"] = [
        {
            "product": offer.product,
            "resource": offer.resource,
            "mig_profile": offer.mig_profile,
            "most_on_one_node": offer.most_on_one_node,
            "total": offer.total,
            "nodes": offer.nodes,
        }
        for offer in offers
    ]
    return summary


def list_clusters() -> list[Cluster]:
    """Every registered cluster, by name."""
    return list(Cluster.objects.order_by("name"))

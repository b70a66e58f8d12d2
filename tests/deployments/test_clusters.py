"""Registering Kubernetes clusters: the command is idempotent, the kubeconfig is checked, stored encrypted and never
shown back, and bad registrations name what is wrong."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from conch.crypto import SecretUnreadable, decrypt_text, encrypt_text
from conch.errors import InvalidInput, NotFound
from deployments.models import Cluster
from deployments.runtimes.kubernetes.directory import access_of
from deployments.services.clusters import get_cluster, parse_kubeconfig, register_cluster

pytestmark = pytest.mark.django_db

TOKEN = "s3cr3t-token-4f1d9c"
KUBECONFIG = f"""
apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: lab-cluster
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
contexts:
- name: lab
  context: {{cluster: lab-cluster, user: admin}}
- name: other
  context: {{cluster: lab-cluster, user: admin}}
users:
- name: admin
  user: {{token: {TOKEN}}}
"""


def _register(tmp_path, *extra: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        call_command(
            "register_cluster", "lab", "--kubeconfig", str(path), "--namespace", "models", *extra, stdout=stream
        )
    return out.read_text()


def test_register_cluster_is_idempotent_and_keeps_the_kubeconfig_encrypted(tmp_path):
    # when the same cluster is registered twice, the second time with another namespace and context
    assert _register(tmp_path).strip() == "registered cluster lab (namespace models)"
    assert _register(tmp_path, "--context", "other", "--image-pull-secret", "ngc").startswith("updated cluster lab")
    # then there is one cluster, updated
    [cluster] = Cluster.objects.all()
    assert (cluster.name, cluster.namespace, cluster.context, cluster.image_pull_secrets) == (
        "lab",
        "models",
        "other",
        ["ngc"],
    )
    assert cluster.triton_image == "nvcr.io/nvidia/tritonserver:24.10-py3"
    # and the database never holds the credentials in clear, while Conch can read them back
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig_encrypted FROM deployments_cluster")
        [(stored,)] = cursor.fetchall()
    assert TOKEN not in stored and "6443" not in stored
    assert access_of(cluster).kubeconfig["users"][0]["user"]["token"] == TOKEN


def test_the_admin_never_shows_the_kubeconfig(tmp_path, admin_client):
    _register(tmp_path)
    page = admin_client.get(f"/admin/deployments/cluster/{Cluster.objects.get().pk}/change/").content.decode()
    assert "a kubeconfig, encrypted (never shown)" in page
    assert TOKEN not in page and Cluster.objects.get().kubeconfig_encrypted not in page


def test_the_admin_registers_a_cluster_from_a_pasted_kubeconfig(admin_client):
    response = admin_client.post(
        "/admin/deployments/cluster/add/",
        {
            "name": "pasted",
            "namespace": "models",
            "kubeconfig": KUBECONFIG,
            "context": "",
            "triton_image": "nvcr.io/nvidia/tritonserver:24.10-py3",
            "image_pull_secrets": "[]",
            "s3_endpoint": "",
            "s3_secret_name": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    cluster = get_cluster(name="pasted")
    assert TOKEN not in cluster.kubeconfig_encrypted
    assert access_of(cluster).kubeconfig["current-context"] == "lab"


@pytest.mark.parametrize(
    ("text", "context", "field", "message"),
    [
        ("clusters: [", "", "kubeconfig", "not valid YAML"),
        ("- a list", "", "kubeconfig", "must be a YAML mapping"),
        (KUBECONFIG, "nope", "context", "has no context 'nope'; it has lab, other"),
        (KUBECONFIG.replace("current-context: lab", ""), "", "context", "has no current-context"),
        (KUBECONFIG.replace("server: https://127.0.0.1:6443", "proxy-url: x"), "", "kubeconfig", "server URL"),
        (KUBECONFIG.replace("- name: admin", "- name: someone"), "", "kubeconfig", "user 'admin'"),
    ],
    ids=["yaml", "not-a-mapping", "unknown-context", "no-current-context", "no-server", "no-user"],
)
def test_a_kubeconfig_without_what_a_client_needs_is_refused_naming_it(text, context, field, message):
    with pytest.raises(InvalidInput) as caught:
        parse_kubeconfig(text, context=context)
    assert caught.value.field == field
    assert message in caught.value.detail


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"name": "Lab_1"}, "name"),
        ({"namespace": "Not A Namespace"}, "namespace"),
        ({"in_cluster": True}, "kubeconfig"),  # a kubeconfig and in-cluster at once
        ({"kubeconfig": None}, "kubeconfig"),  # neither
        ({"image_pull_secrets": ["no/slashes"]}, "image_pull_secrets"),
    ],
)
def test_bad_registrations_name_the_field_and_store_nothing(arguments, field):
    with pytest.raises(InvalidInput) as caught:
        register_cluster(**{"name": "lab", "namespace": "models", "kubeconfig": KUBECONFIG, **arguments})
    assert caught.value.field == field
    assert not Cluster.objects.exists()


def test_the_command_reports_a_bad_kubeconfig_without_a_traceback(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    with pytest.raises(CommandError, match=r"has no context 'nope'.*\(context\)"):
        call_command("register_cluster", "lab", "--kubeconfig", str(path), "--context", "nope", "--namespace", "m")
    with pytest.raises(CommandError, match="Cannot read the kubeconfig"):
        call_command("register_cluster", "lab", "--kubeconfig", str(tmp_path / "missing"), "--namespace", "m")


def test_an_in_cluster_registration_keeps_no_kubeconfig():
    cluster, created = register_cluster(name="self", namespace="conch", in_cluster=True)
    assert created and cluster.kubeconfig_encrypted == ""
    assert access_of(cluster).kubeconfig is None


def test_an_unknown_cluster_is_not_found_naming_the_field_and_the_known_ones():
    register_cluster(name="lab", namespace="models", kubeconfig=KUBECONFIG)
    with pytest.raises(NotFound) as caught:
        get_cluster(name="prod")
    assert caught.value.field == "cluster" and "(lab)" in caught.value.detail


def test_secrets_encrypted_with_a_retired_key_still_open_and_a_foreign_key_is_refused(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.CONCH_FIELD_ENCRYPTION_KEYS = [old]
    token = encrypt_text("kubeconfig")
    # rotation: the new key encrypts, the old one still decrypts
    settings.CONCH_FIELD_ENCRYPTION_KEYS = [new, old]
    assert decrypt_text(token) == "kubeconfig"
    assert decrypt_text(encrypt_text("again")) == "again"
    # without the old key the secret cannot be read, and the error says what to do
    settings.CONCH_FIELD_ENCRYPTION_KEYS = [new]
    with pytest.raises(SecretUnreadable, match="register the secret again"):
        decrypt_text(token)


def test_triton_release_of_ngc_images_and_the_mismatch_sentence():
    from deployments.services.clusters import image_mismatch, triton_release_of_image

    assert triton_release_of_image("nvcr.io/nvidia/tritonserver:24.10-py3") == "2.51"
    assert triton_release_of_image("nvcr.io/nvidia/tritonserver:25.01-py3") == "2.54"
    assert triton_release_of_image("nvcr.io/nvidia/tritonserver:23.10-py3") == "2.39"
    assert triton_release_of_image("example.com/triton:latest") is None
    assert image_mismatch("nvcr.io/nvidia/tritonserver:24.10-py3") == ""
    assert "Triton 2.54" in image_mismatch("nvcr.io/nvidia/tritonserver:25.01-py3")

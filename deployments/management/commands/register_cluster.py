"""`manage.py register_cluster NAME --kubeconfig PATH [--context C] --namespace NS`: register a Kubernetes cluster."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import CommandError

from conch.errors import ConchError
from deployments.models import DEFAULT_TRITON_IMAGE
from deployments.services.clusters import register_cluster
from tenancy.audit import AuditedCommand


class Command(AuditedCommand):
    help = "Register (or update) a Kubernetes cluster deployments can run on; the kubeconfig is stored encrypted."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Cluster name (a DNS label), chosen by deployments as 'cluster'.")
        credentials = parser.add_mutually_exclusive_group(required=True)
        credentials.add_argument("--kubeconfig", type=Path, help="Path of a kubeconfig file with the credentials.")
        credentials.add_argument(
            "--in-cluster", action="store_true", help="Use the service account of the pod Conch runs in."
        )
        parser.add_argument("--context", default="", help="Context of the kubeconfig (default: its current one).")
        parser.add_argument("--namespace", required=True, help="Namespace deployments' objects go to.")
        parser.add_argument("--image", default=DEFAULT_TRITON_IMAGE, help="Triton image of the pods.")
        parser.add_argument(
            "--tensorrt-version",
            default="",
            help="TensorRT version the image carries (10.5.0.18), for TensorRT plans; default: known NGC releases.",
        )
        parser.add_argument("--image-pull-secret", action="append", default=[], help="Image pull Secret (repeatable).")
        parser.add_argument("--s3-endpoint", default="", help="Object-store URL as pods reach it.")
        parser.add_argument("--s3-secret", default="", help="Existing Secret with the pods' S3 credentials.")
        parser.add_argument(
            "--service-account",
            default="",
            help="Service account the pods run as, whose identity the object store trusts (no S3 Secret then).",
        )

    def handle(self, *args, **options):
        kubeconfig = None
        if options["kubeconfig"] is not None:
            try:
                kubeconfig = options["kubeconfig"].read_text()
            except OSError as error:
                raise CommandError(f"Cannot read the kubeconfig {options['kubeconfig']}: {error}") from None
        try:
            cluster, created = register_cluster(
                name=options["name"],
                namespace=options["namespace"],
                kubeconfig=kubeconfig,
                context=options["context"],
                in_cluster=options["in_cluster"],
                triton_image=options["image"],
                tensorrt_version=options["tensorrt_version"],
                image_pull_secrets=options["image_pull_secret"],
                s3_endpoint=options["s3_endpoint"],
                s3_secret_name=options["s3_secret"],
                pod_service_account=options["service_account"],
            )
        except ConchError as error:
            raise CommandError(f"{error.detail} ({error.field})" if error.field else error.detail) from None
        verb = "registered" if created else "updated"
        self.stdout.write(f"{verb} cluster {cluster.name} (namespace {cluster.namespace})")

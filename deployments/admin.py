"""The admin console of deployments and clusters (staff only): an HTTP edge calling the deployments services."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from unfold.admin import ModelAdmin
from unfold.widgets import UnfoldAdminTextareaWidget

from conch.admin_base import ReadOnlyModelAdmin
from conch.crypto import encrypt_text
from conch.errors import ConchError, InvalidInput
from deployments.choices import DeploymentStatus
from deployments.models import Cluster, Deployment, GatewayUsage
from deployments.services.clusters import describe_cluster, image_mismatch, parse_kubeconfig
from deployments.services.records import request_stop


@admin.register(Deployment)
class DeploymentAdmin(ModelAdmin):
    """Deployments of every team, read-only: they are created and changed through the API and the console, whose
    services check roles and quotas (a save here would also write back a status the reconcile task may have
    changed meanwhile). "Stop selected deployments" stops them as the API's stop does (`request_stop`: desired
    state stopped, status stopping, a task ends the workload and frees its quota); it needs the permission to
    change deployments."""

    list_display = ["name", "team", "model_version", "runtime", "cluster", "status", "desired_state", "restart_count"]
    list_filter = ["status", "runtime", "team"]
    list_select_related = ["team", "model_version__model__team", "cluster"]
    search_fields = ["name", "team__slug"]
    readonly_fields = ["runtime_state", "repository_prefix", "heartbeat_at"]
    actions = ["stop_deployments"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Deployment | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Deployment | None = None) -> bool:
        return False  # a deployment is stopped (the action), never deleted here: its workload would be left running

    def has_stop_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("deployments.change_deployment")

    @admin.action(description="Stop selected deployments", permissions=["stop"])
    def stop_deployments(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        asked, already, refused = [], [], []
        for deployment in queryset.select_related("team").order_by("pk"):
            if deployment.status == DeploymentStatus.STOPPED:
                already.append(str(deployment))
                continue
            try:
                request_stop(user=request.user, deployment=deployment)
            except ConchError as error:
                refused.append(f"{deployment}: {error.detail}")
            else:
                asked.append(str(deployment))
        if asked:
            self.message_user(request, f"Stopping {len(asked)} deployment(s): {', '.join(asked)}.", messages.SUCCESS)
        if already:
            self.message_user(request, f"Already stopped: {', '.join(already)}.", messages.INFO)
        if refused:
            self.message_user(request, f"Not stopped: {'; '.join(refused)}.", messages.ERROR)


class ClusterForm(forms.ModelForm):
    """A cluster with a write-only kubeconfig: pasted here, checked, stored encrypted, never shown back."""

    kubeconfig = forms.CharField(
        widget=UnfoldAdminTextareaWidget(attrs={"rows": 8}),
        required=False,
        help_text="Paste a kubeconfig to set or replace the credentials (it is never shown again).",
    )

    class Meta:
        model = Cluster
        exclude = ["kubeconfig_encrypted"]

    def clean(self):
        cleaned = super().clean()
        kubeconfig = cleaned.get("kubeconfig")
        has_stored = bool(self.instance.pk and self.instance.kubeconfig_encrypted)
        if cleaned.get("in_cluster") and kubeconfig:
            raise forms.ValidationError("Give either a kubeconfig or in-cluster credentials, not both.")
        if not cleaned.get("in_cluster") and not kubeconfig and not has_stored:
            raise forms.ValidationError("Paste a kubeconfig, or tick in-cluster.")
        if kubeconfig:
            try:
                parse_kubeconfig(kubeconfig, context=cleaned.get("context") or "")
            except InvalidInput as error:
                raise forms.ValidationError(error.detail) from None
        return cleaned


@admin.register(Cluster)
class ClusterAdmin(ModelAdmin):
    """Clusters with their credentials write-only (also `manage.py register_cluster`)."""

    form = ClusterForm
    list_display = ["name", "namespace", "in_cluster", "triton_image", "updated_at"]
    readonly_fields = ["credentials", "offers", "triton_release", "created_at", "updated_at"]

    @admin.display(description="Stored credentials")
    def credentials(self, cluster: Cluster) -> str:
        if cluster.in_cluster:
            return "the service account of the pod Conch runs in"
        return "a kubeconfig, encrypted (never shown)" if cluster.kubeconfig_encrypted else "none"

    @admin.display(description="GPUs offered (from the cluster's Nodes)")
    def offers(self, cluster: Cluster) -> str:
        if not cluster.pk:
            return "-"
        seen = describe_cluster(cluster)
        if seen["gpu_offers"] is None:
            return f"cannot ask the cluster: {seen['error']}"
        return (
            "; ".join(
                f"{o['product'] or 'unlabelled'}: {o['resource']}, up to {o['most_on_one_node']} on a node "
                f"({o['total']} on {o['nodes']} nodes)"
                for o in seen["gpu_offers"]
            )
            or "no GPUs on any schedulable node"
        )

    @admin.display(description="Triton release")
    def triton_release(self, cluster: Cluster) -> str:
        return image_mismatch(cluster.triton_image) or "the release builds are verified with"

    def save_model(self, request, obj: Cluster, form: ClusterForm, change: bool) -> None:
        kubeconfig = form.cleaned_data.get("kubeconfig")
        if kubeconfig:
            obj.kubeconfig_encrypted = encrypt_text(kubeconfig)
        if obj.in_cluster:
            obj.kubeconfig_encrypted = ""
        super().save_model(request, obj, form, change)


@admin.register(GatewayUsage)
class GatewayUsageAdmin(ReadOnlyModelAdmin):
    """Inference gateway use per token, deployment and day (UTC), as the gateway counted it: read-only."""

    list_display = ["day", "team", "token", "deployment", "requests", "inferences", "errors", "bytes_in", "bytes_out"]
    list_filter = ["team", "day"]
    list_select_related = ["team", "token", "deployment"]
    search_fields = ["token__prefix", "deployment__name", "team__slug"]
    date_hierarchy = "day"
    actions = None

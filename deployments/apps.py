from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        from deployments.models import Cluster, Deployment
        from deployments.services.quotas import register_quota_counters
        from deployments.services.version_users import register_version_users
        from tenancy.audit import audit_admin_deletions

        register_quota_counters()
        register_version_users()
        audit_admin_deletions(Deployment, Cluster)

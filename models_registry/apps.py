from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        from models_registry.models import ModelVersion, RegisteredModel, Upload
        from models_registry.resumable import count_team_upload_reservations, count_teams_upload_reservations
        from models_registry.services import register_quota_counters
        from tenancy.audit import audit_admin_deletions
        from tenancy.quotas import register_usage_counter

        register_quota_counters()
        # Open resumable uploads hold their promised size in the storage quota.
        register_usage_counter(
            "storage_bytes", count_team_upload_reservations, for_teams=count_teams_upload_reservations
        )
        audit_admin_deletions(RegisteredModel, ModelVersion, Upload)

from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        from models_registry.models import ModelVersion, RegisteredModel
        from models_registry.services import register_quota_counters
        from tenancy.audit import audit_admin_deletions

        register_quota_counters()
        audit_admin_deletions(RegisteredModel, ModelVersion)

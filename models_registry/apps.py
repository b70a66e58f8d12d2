from django.apps import AppConfig


class ModelsRegistryConfig(AppConfig):
    name = "models_registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        from models_registry.services import register_quota_counters

        register_quota_counters()

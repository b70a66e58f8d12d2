from django.apps import AppConfig


class BuildsConfig(AppConfig):
    name = "builds"
    verbose_name = "Builds"

    def ready(self) -> None:
        from builds.services.storage import register_quota_counters

        register_quota_counters()

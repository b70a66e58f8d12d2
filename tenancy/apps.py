from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Teams and access"

    def ready(self) -> None:
        from tenancy.audit import connect_signals

        connect_signals()

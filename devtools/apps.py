from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    name = "devtools"
    verbose_name = "Development tooling"

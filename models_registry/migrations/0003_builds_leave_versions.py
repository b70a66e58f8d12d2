"""A version's build fields leave it: the builds app's `Build` rows hold them (builds 0002 copied them there)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("models_registry", "0002_move_upload_to_uploads"),
        ("builds", "0002_builds_own_their_state"),
    ]

    operations = [
        migrations.RemoveField(model_name="modelversion", name=name)
        for name in (
            "build_attempt",
            "build_options",
            "built_at",
            "config_pbtxt",
            "error",
            "error_field",
            "lost_attempts",
            "repository_prefix",
        )
    ]

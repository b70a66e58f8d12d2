"""Builds own their state: one `Build` row per attempt (moved from the version's build fields), and the steps of
each attempt hang off it. Every version that was queued for a build gets its current attempt (and, when an earlier
attempt is the one it serves, that one too); its steps move to the current attempt."""

import re

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

#: The version's status -> the status of its current attempt.
_STATUS = {"queued": "queued", "building": "building", "built": "succeeded", "failed": "failed"}
_ATTEMPT = re.compile(r"/attempt-([0-9]+)/?$")


def move_build_state(apps, schema_editor):
    ModelVersion = apps.get_model("models_registry", "ModelVersion")
    Build = apps.get_model("builds", "Build")
    BuildStep = apps.get_model("builds", "BuildStep")
    for version in ModelVersion.objects.filter(build_attempt__gt=0).iterator():
        status = _STATUS.get(version.status, "failed" if version.status == "deleting" else "queued")
        changed = version.built_at or version.heartbeat_at or version.created_at
        served = _ATTEMPT.search(version.repository_prefix or "")
        served_attempt = int(served.group(1)) if served else None
        if served_attempt is not None and served_attempt != version.build_attempt:
            Build.objects.create(
                version=version,
                attempt=served_attempt,
                status="succeeded",
                options=version.build_options or {},
                heartbeat_at=changed,
                queued_at=version.created_at,
                finished_at=changed,
                repository_prefix=version.repository_prefix,
            )
        current = Build.objects.create(
            version=version,
            attempt=version.build_attempt,
            status=status,
            options=version.build_options or {},
            lost_attempts=version.lost_attempts,
            heartbeat_at=version.heartbeat_at,
            queued_at=version.heartbeat_at or version.created_at,
            finished_at=changed if status in ("succeeded", "failed") else None,
            repository_prefix=version.repository_prefix if served_attempt == version.build_attempt else "",
            config_pbtxt=version.config_pbtxt,
            error=version.error,
            error_field=version.error_field,
        )
        BuildStep.objects.filter(version_id=version.pk).update(build=current)
    BuildStep.objects.filter(build__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("builds", "0001_initial"),
        ("models_registry", "0002_move_upload_to_uploads"),
    ]

    operations = [
        migrations.CreateModel(
            name="Build",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("attempt", models.PositiveIntegerField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("building", "Building"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("lost", "Lost"),
                            ("superseded", "Superseded"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                ("options", models.JSONField(blank=True, default=dict)),
                ("worker", models.CharField(blank=True, max_length=200)),
                ("lost_attempts", models.PositiveSmallIntegerField(default=0)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("queued_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("repository_prefix", models.CharField(blank=True, max_length=500)),
                ("config_pbtxt", models.TextField(blank=True)),
                ("error", models.TextField(blank=True)),
                ("error_field", models.CharField(blank=True, max_length=100)),
                ("source_format", models.CharField(blank=True, max_length=32)),
                ("conversion", models.JSONField(blank=True, null=True)),
                (
                    "version",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="builds",
                        to="models_registry.modelversion",
                    ),
                ),
            ],
            options={
                "ordering": ["version_id", "attempt"],
                "indexes": [models.Index(fields=["status", "heartbeat_at"], name="build_status_heartbeat")],
                "constraints": [
                    models.UniqueConstraint(fields=("version", "attempt"), name="build_unique_version_attempt")
                ],
            },
        ),
        migrations.AddField(
            model_name="buildstep",
            name="build",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name="steps", to="builds.build"
            ),
        ),
        migrations.RunPython(move_build_state, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="buildstep", name="buildstep_unique_version_name"),
        migrations.RemoveField(model_name="buildstep", name="version"),
        migrations.AlterField(
            model_name="buildstep",
            name="build",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="steps", to="builds.build"
            ),
        ),
        migrations.AlterModelOptions(name="buildstep", options={"ordering": ["build_id", "position"]}),
        migrations.AddConstraint(
            model_name="buildstep",
            constraint=models.UniqueConstraint(fields=("build", "name"), name="buildstep_unique_build_name"),
        ),
    ]

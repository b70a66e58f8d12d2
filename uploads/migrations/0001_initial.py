"""The resumable upload, moved here from the model registry: the table (renamed `uploads_upload` by
`models_registry.0002_move_upload_to_uploads`) and its rows are kept, so this only takes the model into this app's
state. Its content type moves with it (the admin's log and permissions keep pointing at it)."""

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def move_content_type(apps, schema_editor):
    """Give the old `models_registry.upload` content type to this app, unless this app already has one."""
    content_types = apps.get_model("contenttypes", "ContentType")
    if not content_types.objects.filter(app_label="uploads", model="upload").exists():
        content_types.objects.filter(app_label="models_registry", model="upload").update(app_label="uploads")


def return_content_type(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    if not content_types.objects.filter(app_label="models_registry", model="upload").exists():
        content_types.objects.filter(app_label="uploads", model="upload").update(app_label="models_registry")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("models_registry", "0002_move_upload_to_uploads"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Upload",
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('filename', models.CharField(max_length=255)),
                        ('size_bytes', models.BigIntegerField()),
                        ('sha256', models.CharField(max_length=64)),
                        ('head_sha256', models.CharField(blank=True, max_length=64)),
                        ('part_size_bytes', models.BigIntegerField()),
                        ('part_count', models.PositiveIntegerField()),
                        ('status', models.CharField(choices=[('uploading', 'Uploading'), ('completing', 'Completing'), ('completed', 'Completed'), ('aborted', 'Aborted'), ('failed', 'Failed')], default='uploading', max_length=16)),
                        ('transport', models.CharField(choices=[('s3', 'Straight to the S3 bucket'), ('conch', 'Through Conch (folder storage)')], max_length=8)),
                        ('object_key', models.CharField(max_length=500)),
                        ('store_upload_id', models.CharField(blank=True, max_length=1024)),
                        ('build_options', models.JSONField(blank=True, default=dict)),
                        ('allow_duplicate', models.BooleanField(default=False)),
                        ('part_checksum_algorithm', models.CharField(blank=True, choices=[('CRC32', 'CRC32 per part')], default='', max_length=16)),
                        ('expires_at', models.DateTimeField()),
                        ('heartbeat_at', models.DateTimeField(blank=True, null=True)),
                        ('check_started_at', models.DateTimeField(blank=True, null=True)),
                        ('error', models.TextField(blank=True)),
                        ('error_field', models.CharField(blank=True, max_length=100)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL)),
                        ('model', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='uploads', to='models_registry.registeredmodel')),
                        ('version', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='upload', to='models_registry.modelversion')),
                    ],
                    options={
                        "ordering": ["model_id", "created_at"],
                        "indexes": [models.Index(fields=["status", "expires_at"], name="upload_status_expires")],
                    },
                ),
            ],
        ),
        migrations.RunPython(move_content_type, return_content_type),
    ]

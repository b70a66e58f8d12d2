"""Runtime-specific columns of Deployment move into `runtime_state`; deployments pin their repository prefix."""

from django.db import migrations, models

LOCAL_COLUMNS = ("server_id", "pid", "process_create_time", "http_port", "grpc_port", "metrics_port", "log_path")


def forwards(apps, schema_editor):
    """Carry each deployment's local process record into runtime_state and pin its version's prefix."""
    Deployment = apps.get_model("deployments", "Deployment")
    for deployment in Deployment.objects.select_related("model_version"):
        state = {name: getattr(deployment, name) for name in LOCAL_COLUMNS}
        state["create_time"] = state.pop("process_create_time")
        deployment.runtime_state = state if deployment.pid else {"log_path": deployment.log_path}
        deployment.repository_prefix = deployment.model_version.repository_prefix
        deployment.save(update_fields=["runtime_state", "repository_prefix"])


def backwards(apps, schema_editor):
    Deployment = apps.get_model("deployments", "Deployment")
    for deployment in Deployment.objects.all():
        state = deployment.runtime_state or {}
        deployment.server_id = state.get("server_id") or ""
        deployment.pid = state.get("pid")
        deployment.process_create_time = state.get("create_time")
        deployment.http_port = state.get("http_port")
        deployment.grpc_port = state.get("grpc_port")
        deployment.metrics_port = state.get("metrics_port")
        deployment.log_path = state.get("log_path") or ""
        deployment.save()


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="deployment",
            name="permanent_failure",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="deployment",
            name="repository_prefix",
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.AddField(
            model_name="deployment",
            name="runtime_state",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(forwards, backwards),
        *[migrations.RemoveField(model_name="deployment", name=name) for name in (*LOCAL_COLUMNS, "host")],
    ]

"""The resumable upload moves to its own app (`uploads`): its table is renamed `uploads_upload` with every row kept,
and the model leaves this app's state (`uploads.0001_initial` takes it up)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("models_registry", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.AlterModelTable(name="Upload", table="uploads_upload")],
            state_operations=[migrations.DeleteModel(name="Upload")],
        ),
    ]

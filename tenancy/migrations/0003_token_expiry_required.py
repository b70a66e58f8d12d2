"""Every token has an expiry (0002 gave the existing ones theirs)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0002_roles_and_scoped_tokens"),
    ]

    operations = [
        migrations.AlterField(model_name="apitoken", name="expires_at", field=models.DateTimeField()),
    ]

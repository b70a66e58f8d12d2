"""Roles viewer/developer/admin (a `member` becomes a developer); tokens bound to a team, with scopes and expiry.

Existing tokens keep working: each gets every scope, an expiry `CONCH_TOKEN_DEFAULT_DAYS` from now, and its
user's team when the user is in exactly one (otherwise no team: it acts in all of the user's teams).
`expires_at` becomes required in the next migration (PostgreSQL alters no table with row changes pending in the
same transaction).
"""

from datetime import timedelta

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

ALL_SCOPES = ["read", "models:write", "deployments:write", "infer"]


def forwards(apps, schema_editor):
    Membership = apps.get_model("tenancy", "Membership")
    ApiToken = apps.get_model("tenancy", "ApiToken")
    Membership.objects.filter(role="member").update(role="developer")
    expires_at = timezone.now() + timedelta(days=settings.CONCH_TOKEN_DEFAULT_DAYS)
    for token in ApiToken.objects.all():
        team_ids = list(Membership.objects.filter(user_id=token.user_id).values_list("team_id", flat=True)[:2])
        token.team_id = team_ids[0] if len(team_ids) == 1 else None
        token.scopes = ALL_SCOPES
        token.expires_at = expires_at
        token.save(update_fields=["team", "scopes", "expires_at"])


def backwards(apps, schema_editor):
    Membership = apps.get_model("tenancy", "Membership")
    Membership.objects.filter(role__in=["viewer", "developer"]).update(role="member")


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[("viewer", "Viewer"), ("developer", "Developer"), ("admin", "Admin")],
                default="developer",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="team",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="api_tokens",
                to="tenancy.team",
            ),
        ),
        migrations.AddField(model_name="apitoken", name="scopes", field=models.JSONField(default=list)),
        migrations.AddField(model_name="apitoken", name="deployments", field=models.JSONField(blank=True, default=list)),
        migrations.AddField(model_name="apitoken", name="expires_at", field=models.DateTimeField(null=True)),
        migrations.RunPython(forwards, backwards),
    ]

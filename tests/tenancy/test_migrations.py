"""The roles-and-tokens migration keeps existing members and tokens working."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("tenancy", "0001_initial")]
AFTER = [("tenancy", "0003_token_expiry_required")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_members_become_developers_and_old_tokens_get_their_team_every_scope_and_an_expiry():
    # given the schema before roles, with a member, an admin, and a token of each
    old = _migrate(BEFORE)
    try:
        user_model = old.get_model("auth", "User")
        team = old.get_model("tenancy", "Team").objects.create(slug="acme", name="Acme")
        other = old.get_model("tenancy", "Team").objects.create(slug="globex", name="Globex")
        member = user_model.objects.create(username="m")
        admin = user_model.objects.create(username="a")
        membership = old.get_model("tenancy", "Membership")
        membership.objects.create(team=team, user=member, role="member")
        membership.objects.create(team=team, user=admin, role="admin")
        membership.objects.create(team=other, user=admin, role="member")
        token = old.get_model("tenancy", "ApiToken")
        for user in (member, admin):
            digest = hashlib.sha256(user.username.encode()).hexdigest()
            token.objects.create(user=user, prefix=f"conch_{user.username}", key_hash=digest)
        # when
        new = _migrate(AFTER)
        # then
        memberships = new.get_model("tenancy", "Membership").objects.filter(team__slug="acme")
        roles = dict(memberships.values_list("user__username", "role"))
        assert roles == {"m": "developer", "a": "admin"}
        rows = new.get_model("tenancy", "ApiToken").objects.select_related("user", "team")
        tokens = {t.user.username: t for t in rows}
        assert tokens["m"].team.slug == "acme" and tokens["a"].team is None  # a is in two teams
        assert tokens["m"].scopes == ["read", "models:write", "deployments:write", "infer"]
        assert abs(tokens["m"].expires_at - (timezone.now() + timedelta(days=90))) < timedelta(minutes=5)
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

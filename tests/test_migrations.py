"""The schema is one initial migration per app (squashed before any release), and it matches the models."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("app", ["tenancy", "models_registry", "builds", "deployments"])
def test_each_app_has_one_initial_migration(app):
    migrations = sorted(path.name for path in (ROOT / app / "migrations").glob("0*.py"))
    assert migrations == ["0001_initial.py"]


def test_the_migrations_describe_the_models(db):
    # `makemigrations --check` exits (SystemExit 1) when a model changed without a migration
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)

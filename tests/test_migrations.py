"""The schema is one initial migration per app (squashed before any release), plus the moves made since, and it
matches the models; a move keeps the rows."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

ROOT = Path(__file__).resolve().parent.parent
#: Each app's migrations: the squashed initial one, then the moves of models between apps.
MIGRATIONS = {
    "tenancy": ["0001_initial.py"],
    "models_registry": ["0001_initial.py", "0002_move_upload_to_uploads.py"],
    "builds": ["0001_initial.py"],
    "uploads": ["0001_initial.py"],
    "deployments": ["0001_initial.py"],
}


@pytest.mark.parametrize("app", sorted(MIGRATIONS))
def test_each_app_has_its_initial_migration_and_the_moves(app):
    migrations = sorted(path.name for path in (ROOT / app / "migrations").glob("0*.py"))
    assert migrations == MIGRATIONS[app]


def test_the_migrations_describe_the_models(db):
    # `makemigrations --check` exits (SystemExit 1) when a model changed without a migration
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_an_upload_keeps_its_row_when_it_moves_to_the_uploads_app():
    # given the schema before the move, with an open upload in the model registry's table
    executor = MigrationExecutor(connection)
    executor.migrate([("models_registry", "0001_initial"), ("uploads", None)])
    try:
        _move_an_upload(executor)
    finally:  # the schema back at the end for the tests that follow, whatever happened
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _move_an_upload(executor: MigrationExecutor) -> None:
    old = executor.loader.project_state([("models_registry", "0001_initial")]).apps
    team = old.get_model("tenancy", "Team").objects.create(name="Movers", slug="movers")
    model = old.get_model("models_registry", "RegisteredModel").objects.create(team=team, name="moved")
    upload_id = uuid.uuid4()
    old.get_model("models_registry", "Upload").objects.create(
        id=upload_id,
        model=model,
        filename="model.onnx",
        size_bytes=20 * 1024 * 1024,
        sha256="a" * 64,
        part_size_bytes=16 * 1024 * 1024,
        part_count=2,
        status="uploading",
        transport="conch",
        object_key=f"models/{model.pk}/uploads/{upload_id}/model.onnx",
        store_upload_id="staging-1",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    # when the migrations run to the end
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    # then the same row is the uploads app's, under its new table, and the old table is gone
    from uploads.models import Upload

    moved = Upload.objects.get(pk=upload_id)
    assert (moved.model_id, moved.filename, moved.part_count, moved.status) == (model.pk, "model.onnx", 2, "uploading")
    assert Upload._meta.db_table == "uploads_upload"
    assert "models_registry_upload" not in connection.introspection.table_names()

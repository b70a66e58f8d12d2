"""The schema is one initial migration per app (squashed before any release), plus the changes made since (moves
of models between apps, new fields), and it matches the models; a move keeps the rows."""

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
#: Each app's migrations: the squashed initial one, then the changes since (moves between apps, new fields).
MIGRATIONS = {
    "tenancy": ["0001_initial.py"],
    "models_registry": ["0001_initial.py", "0002_move_upload_to_uploads.py", "0003_builds_leave_versions.py"],
    "builds": ["0001_initial.py", "0002_builds_own_their_state.py", "0003_python_models_backends_and_pipelines.py"],
    "uploads": ["0001_initial.py"],
    "deployments": ["0001_initial.py", "0002_cluster_tensorrt_version.py", "0003_tensorrt_plans.py"],
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


@pytest.mark.django_db(transaction=True)
def test_a_versions_build_fields_become_its_build_attempts_when_builds_move_out():
    # given the schema before builds had their own records, with a version rebuilt once and failing, whose first
    # attempt's repository it still serves, and its step rows
    executor = MigrationExecutor(connection)
    executor.migrate([("models_registry", "0002_move_upload_to_uploads"), ("builds", "0001_initial")])
    try:
        _move_builds(executor)
    finally:  # the schema back at the end for the tests that follow, whatever happened
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _move_builds(executor: MigrationExecutor) -> None:
    old = executor.loader.project_state(
        [("models_registry", "0002_move_upload_to_uploads"), ("builds", "0001_initial")]
    )
    apps = old.apps
    team = apps.get_model("tenancy", "Team").objects.create(name="Builders", slug="builders")
    model = apps.get_model("models_registry", "RegisteredModel").objects.create(team=team, name="adder")
    served = f"models/{model.pk}/versions/1/repository/attempt-1"
    version = apps.get_model("models_registry", "ModelVersion").objects.create(
        model=model,
        number=1,
        status="failed",
        build_attempt=2,
        build_options={"max_batch_size": 4},
        config_pbtxt='name: "adder"',
        repository_prefix=served,
        error="verify failed",
        error_field="max_batch_size",
        lost_attempts=1,
        heartbeat_at=timezone.now(),
    )
    apps.get_model("builds", "BuildStep").objects.create(
        version=version, name="inspect", position=0, status="succeeded"
    )
    # when the migrations run to the end
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    # then the version has both attempts: the failed current one with its error, options, configuration and steps,
    # and the earlier one that succeeded and still serves
    from builds.models import Build, BuildStep

    attempts = {build.attempt: build for build in Build.objects.filter(version_id=version.pk)}
    assert sorted(attempts) == [1, 2]
    current, first = attempts[2], attempts[1]
    assert (current.status, current.error, current.error_field) == ("failed", "verify failed", "max_batch_size")
    assert (current.options, current.config_pbtxt, current.lost_attempts) == ({"max_batch_size": 4}, 'name: "adder"', 1)
    assert (first.status, first.repository_prefix) == ("succeeded", served)
    assert list(BuildStep.objects.filter(build=current).values_list("name", flat=True)) == ["inspect"]
    # and the version keeps what it is, without the build fields
    columns = {
        column.name
        for column in connection.introspection.get_table_description(
            connection.cursor(), "models_registry_modelversion"
        )
    }
    assert "build_attempt" not in columns and "config_pbtxt" not in columns and "source_sha256" in columns

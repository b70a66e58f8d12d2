"""A version's builds are records of their own: every attempt is kept, paged through the API and listed in the
console, and only the version's team sees them."""

from __future__ import annotations

import pytest

from builds.model_config import BuildOptions
from builds.models import Build
from builds.services import current_build, served_repository_prefix
from models_registry.models import ModelVersion
from tests import real_models
from tests.build_records import fail_current_build
from tests.deployments.conftest import write_built_version

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def rebuilt(alice, django_capture_on_commit_callbacks) -> ModelVersion:
    """A version built once (attempt 1 succeeded), then rebuilt with max_batch_size 4 (attempt 2, failed)."""
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    with django_capture_on_commit_callbacks(execute=False):
        response = alice.client.post(f"/api/v1/versions/{version.pk}/rebuild", {"max_batch_size": 4}, format="json")
    assert response.status_code == 202, response.content
    fail_current_build(version, "verify failed on sample 2", error_field="max_batch_size")
    return version


def test_the_history_lists_every_attempt_newest_first_with_its_own_options_and_outcome(alice, rebuilt):
    # when
    response = alice.client.get(f"/api/v1/versions/{rebuilt.pk}/builds/")
    # then
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 2
    second, first = body["results"]
    assert (second["attempt"], second["status"], second["error_field"]) == (2, "failed", "max_batch_size")
    assert second["options"]["max_batch_size"] == 4 and second["repository_prefix"] == ""
    assert (first["attempt"], first["status"], first["error"]) == (1, "succeeded", "")
    assert first["options"]["max_batch_size"] == 8
    assert first["repository_prefix"].endswith("/repository/attempt-1")
    assert 'name: "classifier"' in first["config_pbtxt"]
    assert set(first) >= {"worker", "lost_attempts", "queued_at", "started_at", "finished_at", "steps", "version"}


def test_the_version_shows_its_current_attempt_and_still_serves_the_last_success(alice, rebuilt):
    # when
    body = alice.client.get(f"/api/v1/versions/{rebuilt.pk}/").json()
    # then the failure is the current attempt's, and the served repository is attempt 1's
    assert (body["status"], body["error_field"], body["build"]["attempt"]) == ("failed", "max_batch_size", 2)
    assert body["build"]["status"] == "failed" and body["built_at"] is None
    assert body["build_options"]["max_batch_size"] == 4
    assert body["repository_prefix"] == served_repository_prefix(rebuilt)
    assert body["repository_prefix"].endswith("/repository/attempt-1")


def test_the_history_is_paged(alice, rebuilt):
    # when
    page = alice.client.get(f"/api/v1/versions/{rebuilt.pk}/builds/?limit=1&offset=1").json()
    # then
    assert page["count"] == 2 and [row["attempt"] for row in page["results"]] == [1]
    assert page["previous"] is not None and page["next"] is None


def test_another_teams_version_history_is_not_found(bob, rebuilt):
    # when
    response = bob.client.get(f"/api/v1/versions/{rebuilt.pk}/builds/")
    # then: the same answer as for a version that does not exist
    assert response.status_code == 404
    assert bob.client.get("/api/v1/versions/999999/builds/").status_code == 404


def test_a_bad_page_size_is_refused_naming_the_parameter(alice, rebuilt):
    response = alice.client.get(f"/api/v1/versions/{rebuilt.pk}/builds/?limit=abc")
    assert response.status_code == 400
    assert response.json()["field"] == "limit"


def test_the_model_page_lists_each_versions_builds(alice, rebuilt):
    # given alice signed in to the console
    alice.client.force_login(alice.user)
    # when she opens the model
    page = alice.client.get(f"/models/{rebuilt.model_id}/").content.decode()
    # then the version's Builds table has both attempts, newest first, with the failure's error
    table = page[page.index('data-testid="builds-1"') :]
    table = table[: table.index("</table>")]
    assert table.index("<td>2</td>") < table.index("<td>1</td>")
    assert "status-failed" in table and "status-succeeded" in table
    assert "verify failed on sample 2" in table


def test_a_deleted_version_takes_its_builds_with_it(alice, rebuilt):
    # given
    ids = list(Build.objects.filter(version=rebuilt).values_list("pk", flat=True))
    assert len(ids) == 2 and current_build(rebuilt).attempt == 2
    # when
    assert alice.client.delete(f"/api/v1/versions/{rebuilt.pk}/").status_code == 204
    # then
    assert not Build.objects.filter(pk__in=ids).exists()

"""Reviewing a build: options checked by the build's own rules (every field at fault named), a rebuild with new
options, the signature as rows with the batch axis marked, the reason for batching, and the config diff."""

from __future__ import annotations

import pytest

from builds.choices import StepName, StepStatus
from builds.model_config import BuildOptions
from builds.models import Build, BuildStep
from builds.services import current_build, current_options
from builds.services.review import batching_reason, check_build_options, config_diff, signature_rows
from models_registry.models import ModelVersion
from models_registry.services import visible_versions
from tests import real_models
from tests.deployments.conftest import write_built_version

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def classifier(alice) -> ModelVersion:
    return write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))


def test_every_option_at_fault_is_named_with_what_to_do(classifier):
    # when
    check = check_build_options(
        version=classifier,
        fields={"max_batch_size": "lots", "instance_count": "99", "preferred_batch_size": "2, 2"},
    )
    # then
    assert not check.ok
    errors = {error["field"]: error["detail"] for error in check.errors}
    assert list(errors) == ["max_batch_size", "preferred_batch_size", "instance_count"]  # the form's order
    assert "whole number such as 8" in errors["max_batch_size"]
    assert errors["instance_count"] == "instance_count must be between 1 and 16 (model instances per group); got 99."
    assert "more than once" in errors["preferred_batch_size"]
    assert check.config_pbtxt == ""


def test_dynamic_batching_off_means_max_batch_size_0_and_refuses_a_queue_delay(classifier):
    # when
    check = check_build_options(
        version=classifier, fields={"dynamic_batching": "off", "max_queue_delay_microseconds": "500"}
    )
    # then
    assert check.errors == [
        {
            "field": "max_queue_delay_microseconds",
            "detail": "max_queue_delay_microseconds only applies when Triton batches requests, but max_batch_size is "
            "0, so a queue delay would have no effect. Leave max_queue_delay_microseconds empty.",
        }
    ]


def test_good_options_give_the_configuration_the_build_would_write(classifier):
    # when
    check = check_build_options(
        version=classifier,
        fields={"max_batch_size": "16", "preferred_batch_size": "8, 4", "max_queue_delay_microseconds": "300"},
    )
    # then
    assert check.ok
    assert check.options == BuildOptions(
        max_batch_size=16, max_queue_delay_microseconds=300, preferred_batch_size=(4, 8), instance_count=None
    )
    assert "max_batch_size: 16" in check.config_pbtxt
    assert "preferred_batch_size: 4" in check.config_pbtxt
    assert "max_queue_delay_microseconds: 300" in check.config_pbtxt


def test_check_options_endpoint_answers_the_errors_and_hides_other_teams(alice, bob, classifier):
    # when
    response = alice.client.post(
        f"/api/v1/versions/{classifier.pk}/check-options", {"max_batch_size": 2000}, format="json"
    )
    other = bob.client.post(f"/api/v1/versions/{classifier.pk}/check-options", {}, format="json")
    # then
    assert response.status_code == 200
    assert response.json()["errors"] == [
        {
            "field": "max_batch_size",
            "detail": "max_batch_size must be between 0 and 1024 (0 turns Triton batching off); got 2000.",
        }
    ]
    assert other.status_code == 404


def test_rebuild_with_options_checks_them_first_and_then_replaces_them(
    alice, classifier, django_capture_on_commit_callbacks
):
    # given a built version with stored sample values
    options = {**BuildOptions(max_batch_size=8).to_dict(), "samples": {"values": {"x": 0.5}}}
    Build.objects.filter(version=classifier).update(options=options)
    url = f"/api/v1/versions/{classifier.pk}/rebuild"
    # when a bad option is sent
    refused = alice.client.post(url, {"max_batch_size": "8", "preferred_batch_size": "16"}, format="json")
    # then nothing changes
    assert refused.status_code == 400
    assert refused.json()["field"] == "preferred_batch_size"
    # and two options wrong on their own are both told
    both = alice.client.post(url, {"max_batch_size": "lots", "instance_count": "99"}, format="json")
    assert both.status_code == 400
    assert [error["field"] for error in both.json()["errors"]] == ["max_batch_size", "instance_count"]
    classifier.refresh_from_db()
    assert (classifier.status, current_build(classifier).attempt) == ("built", 1)
    # when good options are sent
    with django_capture_on_commit_callbacks() as queued:
        accepted = alice.client.post(url, {"max_batch_size": "4", "instance_count": "2"}, format="json")
    # then the build is queued with them, the samples kept
    assert accepted.status_code == 202, accepted.content
    classifier.refresh_from_db()
    assert classifier.status == "queued"
    assert current_options(classifier) == {
        "max_batch_size": 4,
        "max_queue_delay_microseconds": None,
        "preferred_batch_size": None,
        "instance_count": 2,
        "samples": {"values": {"x": 0.5}},
    }
    assert len(queued) == 1


def test_signature_rows_mark_the_batch_axis(classifier):
    # when
    rows = signature_rows(classifier)
    # then
    assert [(row.role, row.name, row.datatype, row.shape, row.batch_axis) for row in rows] == [
        ("input", "x", "FP32", "[batch*, 3, 224, 224]", True),
        ("output", "fetch_name_0", "FP32", "[batch*, 4]", True),
    ]


def test_signature_rows_without_batching_show_the_full_shape(alice):
    # given
    version = write_built_version(alice.team, "flat", real_models.classifier(), BuildOptions(max_batch_size=0))
    # when
    rows = signature_rows(version)
    # then
    assert [(row.shape, row.batch_axis) for row in rows] == [
        ("[DynamicDimension.0, 3, 224, 224]", False),
        ("[DynamicDimension.0, 4]", False),
    ]


def test_batching_reason_is_the_latest_word_of_the_build_log(classifier):
    # given the configure step planned batching and verify then turned it off
    build = current_build(classifier)
    BuildStep.objects.create(
        build=build,
        name=StepName.CONFIGURE,
        position=1,
        status=StepStatus.SUCCEEDED,
        log=["10:00:00 max_batch_size=8 dynamic_batching=on", "10:00:00 batching: axis 0 is the same dynamic axis"],
    )
    BuildStep.objects.create(
        build=build,
        name=StepName.VERIFY,
        position=3,
        status=StepStatus.SUCCEEDED,
        log=["10:00:01 sample 1 input x", "10:00:02 batching off: output 'y' of sample 2 differs"],
    )
    # when / then
    assert batching_reason(classifier) == "batching off: output 'y' of sample 2 differs"


def test_config_diff_against_the_previous_built_version(alice, classifier):
    # given version 2 built with a smaller batch
    second = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=4))
    # when
    diff = config_diff(second, visible_versions(user=alice.user))
    first = config_diff(classifier, visible_versions(user=alice.user))
    # then
    assert diff.previous_number == 1 and diff.changed
    assert diff.diff.startswith("--- version 1/config.pbtxt\n+++ version 2/config.pbtxt\n")
    assert "-max_batch_size: 8\n" in diff.diff
    assert "+max_batch_size: 4\n" in diff.diff
    assert first == type(first)(previous_number=None, diff="", changed=False)


def test_review_endpoint(alice, classifier):
    # when
    body = alice.client.get(f"/api/v1/versions/{classifier.pk}/review").json()
    # then
    assert body["signature"][0]["shape"] == "[batch*, 3, 224, 224]"
    assert body["config_pbtxt"] == current_build(classifier).config_pbtxt
    assert body["previous_version_number"] is None and body["config_diff"] == ""

"""The team page (tokens, members) and the model page in a browser."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from builds.model_config import BuildOptions
from builds.services import latest_config_pbtxt
from conch.errors import Unauthenticated
from deployments.models import Deployment
from tenancy.models import ApiToken
from tenancy.services import authenticate_token
from tests import real_models
from tests.build_records import fail_current_build
from tests.deployments.conftest import write_built_version
from tests.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_a_refused_token_keeps_what_was_entered_and_shows_the_status(page, alice):
    # given alice on her team's page
    page.goto(f"/teams/{alice.team.slug}/")
    # when she asks for a token that expires after too many days
    page.get_by_label("Name").fill("nightly")
    page.get_by_label("infer", exact=False).check()
    page.get_by_label("Expires after").fill("5000")
    page.get_by_test_id("token-create").click()
    # then the refusal shows the sentence with its status, and the form keeps her name, scope and days
    expect(page.get_by_test_id("page-error")).to_contain_text("expires_in_days must be a whole number")
    expect(page.get_by_test_id("page-error-status")).to_have_text("(400 Bad Request)")
    expect(page.get_by_label("Name")).to_have_value("nightly")
    expect(page.get_by_label("infer", exact=False)).to_be_checked()
    expect(page.get_by_label("Expires after")).to_have_value("5000")
    assert not ApiToken.objects.filter(name="nightly").exists()


def test_a_token_created_on_the_team_page_is_shown_once_and_revoked_there(page, alice, screenshot):
    # given alice on her team's page
    page.goto(f"/teams/{alice.team.slug}/")
    # when she creates a token for inference only
    page.get_by_label("Name").fill("ci-pipeline")
    page.get_by_label("infer", exact=False).check()
    page.get_by_test_id("token-create").click()
    # then its secret is shown, and it works
    secret = page.get_by_test_id("new-token-secret").inner_text()
    assert secret.startswith("conch_")
    user, grant = authenticate_token(raw=secret)
    assert user == alice.user and grant.scopes == {"infer"}
    screenshot(page, "console-team-new-token")
    # and only once: reloading the page shows the token's prefix, not its secret
    page.reload()
    assert page.get_by_test_id("new-token").count() == 0
    assert secret not in page.content()
    row = page.locator(f"tr[data-token='{grant.prefix}']")
    expect(row).to_contain_text("ci-pipeline")
    # when she presses Revoke, a confirmation names the token, and it still works
    row.get_by_role("button", name="Revoke token ci-pipeline").click()
    expect(page.get_by_test_id("confirm-question")).to_have_text(
        f"Revoke token “ci-pipeline” ({grant.prefix}…) of alice in team acme, scopes infer?"
    )
    assert not ApiToken.objects.get(pk=grant.id).is_revoked
    # when she confirms
    page.get_by_test_id("confirm-submit").click()
    # then it is gone from the list and refused
    expect(page.locator(".messages")).to_contain_text("Token revoked.")
    assert page.locator(f"tr[data-token='{grant.prefix}']").count() == 0
    assert ApiToken.objects.get(pk=grant.id).is_revoked
    with pytest.raises(Unauthenticated):
        authenticate_token(raw=secret)


def test_a_team_admin_changes_a_members_role(console_browser, alice):
    # given alice made admin, and bob a developer of her team
    alice.user.memberships.filter(team=alice.team).update(role="admin")
    bob = UserFactory(username="bobby")
    MembershipFactory(user=bob, team=alice.team, role="developer")
    page = console_browser.page_for(alice.user)
    page.goto(f"/teams/{alice.team.slug}/")
    # when she makes bob a viewer
    page.get_by_label("Role of bobby", exact=True).select_option("viewer")
    page.get_by_role("button", name="Save the role of bobby").click()
    # then it is saved
    expect(page.locator(".messages")).to_contain_text("bobby's role changed.")
    assert bob.memberships.get(team=alice.team).role == "viewer"
    # and a developer sees no member list to edit
    other = console_browser.page_for(bob)
    other.goto(f"/teams/{alice.team.slug}/")
    assert other.get_by_label("Role of bobby", exact=True).count() == 0


def test_the_model_page_shows_the_signature_and_refuses_deleting_a_used_version(page, alice, screenshot):
    # given a built version of the classifier that a deployment uses
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    Deployment.objects.create(
        team=alice.team, name="web", model_version=version, status="ready", config_pbtxt=latest_config_pbtxt(version)
    )
    # when alice opens the model
    page.goto(f"/models/{version.model_id}/")
    # then the signature table marks the batch axis, and the config is there
    inputs = page.locator("table.signature", has_text="Inputs")
    expect(inputs).to_contain_text("FP32")
    expect(inputs.locator("tbody tr").first).to_contain_text("[batch, 3, 224, 224]")
    expect(page.locator("details", has_text="config.pbtxt")).to_contain_text("max_batch_size: 8")
    screenshot(page, "console-model")
    # when she tries to delete the version
    page.get_by_role("button", name="Delete version 1").click()
    # then a confirmation names the version, and once confirmed the refusal names the deployment using it
    expect(page.get_by_test_id("confirm-question")).to_contain_text("Delete version 1 of model “classifier”")
    page.get_by_test_id("confirm-submit").click()
    expect(page.get_by_test_id("page-error")).to_contain_text("'web'")
    version.refresh_from_db()
    assert version.status == "built"


def test_a_failed_versions_long_error_wraps_and_is_readable_whole(page, alice):
    # given a version whose build failed with a long sentence
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    sentence = "The uploaded file is not an ONNX model: " + "an ONNX file begins with a protobuf header, " * 6
    fail_current_build(version, sentence + "but this file begins with the bytes of a ZIP archive.")
    # when alice opens the model
    page.goto(f"/models/{version.model_id}/")
    box = page.get_by_test_id("version-error")
    # then the whole sentence is inside the box, wrapped over lines, nothing clipped or scrolled away
    expect(box).to_contain_text("begins with the bytes of a ZIP archive.")
    assert box.evaluate("(el) => el.scrollWidth <= el.clientWidth")
    assert box.evaluate("(el) => el.getBoundingClientRect().height") > 40

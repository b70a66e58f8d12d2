"""The console's layout in a browser: the overview after sign-in, the nav, the team switcher, the keyboard."""

from __future__ import annotations

import pytest

from tests.factories import MembershipFactory, TeamFactory

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_signing_in_leads_to_the_overview_with_the_wizard_link(console_browser, alice, screenshot):
    # given alice, signed out, with a password
    alice.user.set_password("pw-for-tests-1")
    alice.user.save()
    page = console_browser.page_for()
    # when she signs in through the form
    page.goto("/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("pw-for-tests-1")
    page.get_by_role("button", name="Log in").click()
    # then the overview of her team is shown, with the wizard's link
    page.wait_for_url(f"{console_browser.url}/")
    link = page.get_by_test_id("start-wizard")
    assert link.get_attribute("href") == "/wizard/"
    assert page.locator("h1").inner_text() == alice.team.name
    screenshot(page, "console-overview-empty")


def test_the_team_switcher_changes_the_team_shown(page, alice):
    # given alice in a second team
    other = TeamFactory(slug="initech", name="Initech")
    MembershipFactory(user=alice.user, team=other, role="viewer")
    page.goto("/")
    assert page.locator("h1").inner_text() == alice.team.name
    # when she picks the other team with the keyboard-reachable switcher
    page.get_by_label("Team").select_option("initech")
    page.get_by_role("button", name="Switch").click()
    # then the overview shows it
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == "Initech"


def test_the_wizard_link_and_the_nav_are_reached_with_the_keyboard(page):
    page.goto("/")
    reached = []
    for _ in range(12):
        page.keyboard.press("Tab")
        reached.append(
            page.evaluate("() => document.activeElement.dataset.testid || document.activeElement.textContent")
        )
    assert "Skip to content" in reached[0]
    for name in ("Overview", "Models", "Deployments", "Team", "start-wizard"):
        assert name in reached, (name, reached)
    # Enter on the focused wizard link follows it
    page.get_by_test_id("start-wizard").focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/wizard/")

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


def test_the_admins_team_list_shows_its_members_column_whole_at_1400_px(console_browser, alice, screenshot):
    # given a platform admin, and teams with long names (as a company names them) and members
    from tests.factories import UserFactory

    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    team = TeamFactory(slug="computer-vision-research-emea", name="Computer Vision Research (EMEA, Munich)")
    MembershipFactory(user=admin, team=team, role="admin")
    page = console_browser.page_for(admin, viewport={"width": 1400, "height": 900})
    # when the admin's team list is open at 1400 px
    page.goto("/admin/tenancy/team/")
    screenshot(page, "admin-team-list-1400")
    # then every Members cell (and its header) lies inside the window and inside every box that clips it: nothing
    # cut off, nothing to scroll sideways to; and so do the columns before it
    assert page.evaluate(_CELLS_OUTSIDE, "Members") == []
    for title in ("Slug", "Name", "GPUs", "Storage", "Deployments", "Models", "Local instances"):
        assert page.evaluate(_CELLS_OUTSIDE, title) == [], title


#: The header cell titled `title` and its column's cells that are not whole inside the window and inside every
#: ancestor that clips its overflow: [[text, cell's right, visible right], ...].
_CELLS_OUTSIDE = """(title) => {
  const headers = Array.from(document.querySelectorAll("thead th"));
  const index = headers.findIndex((th) => th.textContent.trim().startsWith(title));
  if (index < 0) return [["no column", title]];
  const cells = [headers[index], ...Array.from(document.querySelectorAll("tbody tr"), (tr) => tr.children[index])];
  const outside = [];
  for (const cell of cells) {
    const box = cell.getBoundingClientRect();
    let right = document.documentElement.clientWidth, left = 0;
    for (let up = cell.parentElement; up; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== "visible") {
        const clip = up.getBoundingClientRect();
        right = Math.min(right, clip.right);
        left = Math.max(left, clip.left);
      }
    }
    if (box.right > right + 0.5 || box.left < left - 0.5) outside.push([cell.textContent.trim(), box.right, right]);
  }
  return outside;
}"""


def test_no_template_holds_a_comment_django_would_print():
    """Django's `{# #}` comments end on their line: one spanning lines is printed into the page as it is."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "templates"
    spanning = [
        f"{path.relative_to(root)}:{text[: found.start()].count(chr(10)) + 1}"
        for path in sorted(root.rglob("*.html"))
        for text in [path.read_text()]
        for found in re.finditer(r"\{#.*?#\}", text, re.DOTALL)
        if "\n" in found.group(0)
    ]
    assert spanning == [], "use {% comment %} for these: " + ", ".join(spanning)

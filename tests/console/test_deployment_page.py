"""The deployment page in a browser: live charts of a real local deployment, role-checked actions, the keyboard."""

from __future__ import annotations

import re

import numpy as np
import pytest
from playwright.sync_api import expect

from builds.model_config import BuildOptions
from builds.services import latest_config_pbtxt
from deployments.models import Deployment
from deployments.observe import scrape_ready_deployments
from tests import real_models
from tests.deployments.conftest import write_built_version
from tests.flows import deploy_ready
from tests.tiny_models import add_constant

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def _chart_points(page, testid: str) -> int:
    return int(page.get_by_test_id(testid).get_attribute("data-points"))


def test_charts_show_points_after_inferences_on_a_real_deployment(
    page, alice, eager_tasks, django_capture_on_commit_callbacks, screenshot
):
    # given the demo classifier deployed on a real local Triton
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, version.pk)
    # and inferences between two scrapes
    x = np.random.default_rng(3).standard_normal((2, 3, 224, 224), dtype=np.float32)
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    assert scrape_ready_deployments() == 1
    assert scrape_ready_deployments() == 1
    # (before them, with samples but no request, the page's averages are dashes, not 0)
    page.goto(f"/deployments/{deployment['id']}/")
    page.locator("#summary").filter(has_text="Requests: 0").wait_for()
    idle = page.locator("#summary").inner_text()
    assert "Average latency: —" in idle and "Batch size: —" in idle, idle
    for _ in range(3):
        response = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
        assert response.status_code == 200, response.content
    assert scrape_ready_deployments() == 1
    # when alice opens the deployment's page
    page.goto(f"/deployments/{deployment['id']}/")
    # then its status is shown, and the throughput and latency charts draw points (uPlot canvases)
    assert page.get_by_test_id("deployment-status").inner_text() == "ready"
    page.wait_for_function(
        "['chart-throughput', 'chart-latency'].every("
        "id => Number(document.querySelector(`[data-testid=${id}]`).dataset.points) > 0)"
    )
    assert _chart_points(page, "chart-throughput") > 0
    assert _chart_points(page, "chart-latency") > 0
    assert page.locator("[data-testid=chart-throughput] canvas").count() == 1
    summary = page.locator("#summary")
    summary.filter(has_text="Requests: 3").wait_for()
    assert summary.inner_text().startswith("Over the time range (or since the deployment was created):")
    assert "Average throughput: " in summary.inner_text()
    assert re.search(r"Average latency: \d+\.\d\d ms", summary.inner_text()), summary.inner_text()
    # and a wider range reads the same samples again
    page.get_by_label("Time range").select_option("3600")
    page.wait_for_function("Number(document.querySelector('[data-testid=chart-throughput]').dataset.points) > 0")
    # and the snippets name the gateway URL of this deployment
    assert f"/serve/{alice.team.slug}/web/v2/models/classifier/infer" in page.locator("#snippet-curl").inner_text()
    assert 'httpclient.InferInput("x", [1, 3, 224, 224], "FP32")' in page.locator("#snippet-python").inner_text()
    screenshot(page, "console-deployment-charts")
    # and the overview draws the deployment's throughput sparkline from the same samples
    page.goto("/")
    page.wait_for_function(
        f"Number(document.querySelector('[data-sparkline=\"{deployment['id']}\"]').dataset.points) > 0"
    )
    assert page.locator(f"#spark-value-{deployment['id']}").inner_text().endswith("inf/s")
    screenshot(page, "console-overview")


@pytest.fixture
def two_versions(alice, tmp_path):
    """Versions 1 and 2 of model `adder` (built rows, no Triton) and a ready local deployment of version 1."""
    versions = [
        write_built_version(alice.team, "adder", add_constant(tmp_path / f"v{n}.onnx", float(n)), BuildOptions())
        for n in (1, 2)
    ]
    deployment = Deployment.objects.create(
        team=alice.team,
        name="adder",
        model_version=versions[0],
        status="ready",
        config_pbtxt=latest_config_pbtxt(versions[0]),
    )
    return versions, deployment


def test_a_viewer_does_not_see_the_deployment_controls(console_browser, alice, two_versions, screenshot):
    from tests.factories import MembershipFactory, UserFactory

    _, deployment = two_versions
    viewer = UserFactory(username="vera")
    MembershipFactory(user=viewer, team=alice.team, role="viewer")
    # when a viewer and a developer of the team open the page
    seen = console_browser.page_for(viewer)
    seen.goto(f"/deployments/{deployment.pk}/")
    developer = console_browser.page_for(alice.user)
    developer.goto(f"/deployments/{deployment.pk}/")
    # then only the developer has the actions
    assert seen.get_by_test_id("deployment-status").inner_text() == "ready"
    assert seen.get_by_test_id("deployment-actions").count() == 0
    assert seen.get_by_role("button", name="Stop deployment").count() == 0
    assert developer.get_by_test_id("deployment-actions").is_visible()
    assert developer.get_by_role("button", name="Stop deployment").is_visible()
    screenshot(seen, "console-deployment-viewer")


def test_a_developer_stops_a_deployment_from_its_page(page, two_versions, screenshot):
    _, deployment = two_versions
    page.goto(f"/deployments/{deployment.pk}/")
    # when she presses Stop, a confirmation names the deployment, and nothing is stopped yet
    page.get_by_role("button", name="Stop deployment").click()
    expect(page.get_by_test_id("confirm-question")).to_have_text(
        f"Stop deployment “{deployment.name}” of team acme (model {deployment.model_version.model.name} version "
        f"{deployment.model_version.number}, on this machine, now ready)?"
    )
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"
    screenshot(page, "console-deployment-stop-confirm")
    # and Cancel goes back to the page with the deployment still running
    page.get_by_test_id("confirm-cancel").click()
    page.wait_for_url(f"**/deployments/{deployment.pk}/")
    assert page.get_by_test_id("deployment-status").inner_text() == "ready"
    # when she presses Stop again and confirms, it stops
    page.get_by_role("button", name="Stop deployment").click()
    page.get_by_role("button", name=f"Stop deployment {deployment.name}").click()
    expect(page.locator(".messages")).to_contain_text("Stop requested.")
    deployment.refresh_from_db()
    assert deployment.desired_state == "stopped"
    assert page.get_by_test_id("deployment-status").inner_text() in ("stopping", "stopped")
    # and a stopped deployment offers no actions any more
    assert page.get_by_test_id("deployment-actions").count() == 0


def test_the_deployment_page_works_from_the_keyboard(page, two_versions):
    _, deployment = two_versions
    page.goto(f"/deployments/{deployment.pk}/")
    # every form control has a label (its own <label>, or aria-label)
    unlabelled = page.evaluate(
        """() => Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea, button'))
            .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                          && !el.textContent.trim())
            .map(el => el.outerHTML)"""
    )
    assert unlabelled == []
    # and Tab reaches the main controls in order
    reached = []
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.append(
            page.evaluate(
                """() => { const el = document.activeElement;
                    return (el.labels && el.labels.length ? el.labels[0].textContent : '')
                           || el.getAttribute('aria-label') || el.textContent.trim(); }"""
            )
        )
    for name in ("Skip to content", "Serve version", "Switch version", "Stop deployment…", "Time range"):
        assert name in reached, (name, reached)
    # the version switch is usable without a mouse: focus the select, choose, press Enter on the button
    page.get_by_label("Serve version").focus()
    page.keyboard.press("ArrowDown")
    page.get_by_role("button", name="Switch version").focus()
    page.keyboard.press("Enter")
    # then the hot update's service answers: this deployment row was made without its own model repository, so
    # it refuses (409), and the page says why
    expect(page.get_by_test_id("page-error")).to_contain_text("stop it and deploy the version again")


def test_the_status_timeline_updates_without_a_reload(page, alice, two_versions):
    from deployments.services import request_stop

    _, deployment = two_versions
    page.goto(f"/deployments/{deployment.pk}/")
    expect(page.get_by_test_id("deployment-timeline")).not_to_contain_text("deployment.stop_requested")
    # when the deployment is stopped elsewhere (the API, another tab)
    request_stop(user=alice.user, deployment=deployment)
    # then htmx's poll of the fragment shows the event on the open page
    expect(page.get_by_test_id("deployment-timeline")).to_contain_text("deployment.stop_requested", timeout=15_000)


def test_switching_version_from_the_page_hot_updates_a_real_deployment(
    page, alice, tmp_path, eager_tasks, django_capture_on_commit_callbacks
):
    from tests.deployments.conftest import write_adder_versions

    # given version 1 of `adder` (y = x + 1) serving on a real local Triton, and a built version 2 (y = x + 2)
    v1, v2 = write_adder_versions(alice.team, tmp_path)
    deployment = deploy_ready(alice, django_capture_on_commit_callbacks, v1.pk, name="adder")
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 0.0, 0.0, 0.0]}]}

    def answer() -> float:
        response = alice.client.post(f"/api/v1/deployments/{deployment['id']}/infer", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()["outputs"][0]["data"][0]

    assert answer() == 1.0
    # when alice picks version 2 on the page and switches (the update task runs inline: eager Celery)
    page.goto(f"/deployments/{deployment['id']}/")
    page.get_by_label("Serve version").select_option(str(v2.pk))
    page.get_by_role("button", name="Switch version").click()
    # then the page reports the update, and the same deployment answers with version 2
    expect(page.locator(".messages")).to_contain_text("Version switch queued")
    expect(page.get_by_text("Version update: succeeded")).to_be_visible()
    assert answer() == 2.0
    row = Deployment.objects.get(pk=deployment["id"])
    assert (row.model_version_id, row.update_status) == (v2.pk, "succeeded")


def test_the_overview_rate_is_over_its_15_minutes_and_a_stopped_deployment_shows_none(page, alice, two_versions):
    from datetime import timedelta

    from django.utils import timezone

    from deployments.models import MetricSample
    from deployments.observe import FIELDS

    versions, deployment = two_versions
    # given a deployment created an hour ago, and one inference ten minutes ago, between two samples 3.7 s apart
    # (0.27 inf/s over those 3.7 s)
    now = timezone.now()
    Deployment.objects.filter(pk=deployment.pk).update(created_at=now - timedelta(hours=1))
    for seconds_ago, count in ((600.0, 0.0), (596.3, 1.0)):
        fields = {f: 0.0 for f in FIELDS}
        fields.update(success_count=count, inference_count=count, request_duration_us=40000 * count)
        MetricSample.objects.create(
            deployment=deployment,
            scraped_at=now - timedelta(seconds=seconds_ago),
            model_name="adder",
            model_version="1",
            **fields,
        )
    # and a stopped deployment of the same version
    stopped = Deployment.objects.create(
        team=alice.team,
        name="old",
        model_version=versions[0],
        status="stopped",
        config_pbtxt=latest_config_pbtxt(versions[0]),
    )
    # when the overview is open
    page.goto("/")
    value = page.locator(f"#spark-value-{deployment.pk}")
    expect(value).not_to_have_text("")
    # then the rate is the one inference over 900 s, and the stopped deployment has no rate and no sparkline
    assert value.inner_text() == "0.001 inf/s"
    assert page.locator(f"#spark-value-{stopped.pk}").inner_text() == "— (stopped)"
    assert page.locator(f'[data-sparkline="{stopped.pk}"]').count() == 0


def test_an_open_page_drops_the_error_once_the_deployment_is_ready_again(page, alice, two_versions):
    _, deployment = two_versions
    # given the page open while the deployment has failed
    Deployment.objects.filter(pk=deployment.pk).update(
        status="failed", error="Triton was stopped by signal SIGKILL (9).", restart_count=3
    )
    page.goto(f"/deployments/{deployment.pk}/")
    expect(page.locator("#error")).to_have_text("Triton was stopped by signal SIGKILL (9).")
    # when it is ready again after its fourth restart (as `ensure_deployment_started` leaves it)
    Deployment.objects.filter(pk=deployment.pk).update(status="ready", error="", status_message="", restart_count=4)
    # then the page's live refresh shows it ready with no error, and the count of restarts
    expect(page.get_by_test_id("deployment-status")).to_have_text("ready", timeout=15_000)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#restart-count")).to_have_text("4")


#: Counts the pixels of a series' stroke colour (r, g, b within 40) in a 3-pixel column of a chart's plot area at time
#: `t` (seconds): [chart test id, t, [r, g, b]] -> pixels.
_STROKE_PIXELS_AT = """([id, t, rgb]) => {
  const u = document.querySelector(`[data-testid=${id}]`).uplot;
  const x = Math.round(u.valToPos(t, "x", true));
  const pixels = u.ctx.getImageData(x - 1, Math.round(u.bbox.top), 3, Math.round(u.bbox.height)).data;
  let n = 0;
  for (let i = 0; i < pixels.length; i += 4) {
    const near = [0, 1, 2].every((c) => Math.abs(pixels[i + c] - rgb[c]) < 40);
    if (near && pixels[i + 3] > 128) n += 1;
  }
  return n;
}"""


def test_a_chart_breaks_its_line_over_a_gap_in_the_samples_a_restart_left(page, two_versions):
    from datetime import timedelta

    from django.utils import timezone

    from deployments.models import MetricSample
    from deployments.observe import FIELDS

    _, deployment = two_versions
    # given samples every 5 s with 2 inferences/s (1 request/s, drawn below them), none for 100 s while Triton
    # restarted, then counters from zero
    now = timezone.now()
    Deployment.objects.filter(pk=deployment.pk).update(created_at=now - timedelta(hours=1))
    first_load, second_load = now - timedelta(seconds=400), now - timedelta(seconds=100)
    for seconds_ago in [*range(290, 195, -5), *range(95, 0, -5)]:
        at = now - timedelta(seconds=seconds_ago)
        since = first_load if seconds_ago > 150 else second_load
        count = (at - since).total_seconds()
        fields = {f: 0.0 for f in FIELDS}
        fields.update(success_count=count, inference_count=2 * count, execution_count=count)
        MetricSample.objects.create(
            deployment=deployment, scraped_at=at, counters_since=since, model_name="adder", model_version="1", **fields
        )
    # when the deployment page shows the last 5 minutes
    page.goto(f"/deployments/{deployment.pk}/")
    page.wait_for_function("Number(document.querySelector('[data-testid=chart-throughput]').dataset.points) > 0")
    blue = [0x1F, 0x6F, 0xB2]  # the inferences/s line
    measured, gap = (now - timedelta(seconds=250)).timestamp(), (now - timedelta(seconds=150)).timestamp()
    page.wait_for_function(f"({_STROKE_PIXELS_AT})(['chart-throughput', {measured}, {blue}]) > 0")
    # then the line is drawn where there were samples, and nothing is drawn across the gap
    assert page.evaluate(_STROKE_PIXELS_AT, ["chart-throughput", measured, blue]) > 0
    assert page.evaluate(_STROKE_PIXELS_AT, ["chart-throughput", gap, blue]) == 0

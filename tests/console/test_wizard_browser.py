"""The upload-and-deploy wizard in Chromium: the demo classifier from its build to a test inference whose top class
equals onnxruntime's on the same image, inline option checks, and the quota refusal before submit. Each step's
screenshot goes to var/screenshots/wizard-*.png.

Celery tasks run inline (eager) in the live server's thread as their transactions commit: a build runs within the
request that queued it, and a deployment's Triton starts within the deploy request.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from django.template.defaultfilters import filesizeformat
from PIL import Image
from playwright.sync_api import expect

from builds.services import current_error
from deployments.models import Deployment
from models_registry.models import ModelVersion
from tenancy.quotas import set_quota
from tests import real_models

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

#: The part size the server plans in these tests: the page sends the parts the server's plan says (it has no part size
#: of its own), and files of a few tens of MiB should make several parts.
PLANNED_PART_BYTES = 8 * 1024 * 1024


@pytest.fixture(autouse=True)
def _parts_of_8_mib(monkeypatch):
    from uploads.services import parts

    monkeypatch.setattr(parts, "DEFAULT_PART_SIZE_BYTES", PLANNED_PART_BYTES)


#: ImageNet's mean and std, as typed into the test form (the server does the preprocessing with them).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
#: Starting a Triton and building take seconds; the browser waits that long for those pages.
SLOW_MS = 180_000


def write_image(path: Path, seed: int = 11) -> Path:
    """A 300x200 PNG of smooth colour gradients with noise (a real photo is not needed: both sides see the same)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:200, 0:300]
    pixels = np.stack([x * 255 / 300, y * 255 / 200, (x + y) * 255 / 500], axis=-1)
    pixels = np.clip(pixels + rng.normal(0, 20, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")
    return path


def drop_file(page, selector: str, path: Path) -> None:
    """Drop `path` on `selector` as a user dragging it from their desktop does (a drop event with a DataTransfer
    holding the file), not through the file input."""
    transfer = page.evaluate_handle(
        """([b64, name]) => {
            const text = atob(b64);
            const bytes = new Uint8Array(text.length);
            for (let i = 0; i < text.length; i += 1) bytes[i] = text.charCodeAt(i);
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name));
            return transfer;
        }""",
        [base64.b64encode(path.read_bytes()).decode(), path.name],
    )
    page.dispatch_event(selector, "dragenter", {"dataTransfer": transfer})
    page.dispatch_event(selector, "drop", {"dataTransfer": transfer})


def onnx_like(seed: int, size: int) -> bytes:
    """`size` random bytes that begin as an ONNX file does (ir_version 7), so the upload's start takes them: the
    tests here are about moving bytes; the build that follows fails on them (no graph), after checking the sha256."""
    return b"\x08\x07" + np.random.default_rng(seed).integers(0, 256, size - 2, dtype=np.uint8).tobytes()


def crc32_base64(part: bytes) -> str:
    """A part's CRC32 as the uploads API and S3's x-amz-checksum-crc32 take it: base64 of the 4 big-endian bytes."""
    return base64.b64encode(zlib.crc32(part).to_bytes(4, "big")).decode()


def model_and_file(alice, path: Path, data: bytes, *, name: str) -> tuple[dict, Path]:
    """Write `data` to `path` and register model `name` in alice's team; returns (the model as the API gave it,
    path)."""
    path.write_bytes(data)
    model = alice.client.post("/api/v1/models/", {"name": name, "team": "acme"}, format="json").json()
    return model, path


def stored_version(*, model_id: int, data: bytes) -> ModelVersion:
    """The model's one version, checked to be `data` as stored: its sha256, checked by its build."""
    version = ModelVersion.objects.get(model_id=model_id)
    assert (version.source_sha256, version.source_checked) == (hashlib.sha256(data).hexdigest(), True)
    return version


def watch_progress(page):
    """Keep every text the upload's progress line shows from now on; returns a handle to that list."""
    return page.evaluate_handle(
        """() => {
            const seen = [];
            const line = document.querySelector('[data-testid=upload-progress]');
            new MutationObserver(() => seen.push(line.textContent)).observe(line, {childList: true, subtree: true});
            return seen;
        }"""
    )


def onnxruntime_top_class(image: Path) -> int:
    """The classifier's top class by onnxruntime, on the image preprocessed here by hand as the form says."""
    rgb = Image.open(image).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
    x = (np.asarray(rgb, dtype=np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)
    x = x.transpose(2, 0, 1)[np.newaxis].astype(np.float32)
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])
    [scores] = session.run(None, {"x": x})
    return int(np.argmax(scores[0]))


def upload_through_the_api(caller, capture, name: str = "orientation") -> ModelVersion:
    """Register `name` and upload the classifier with the API's single-request upload, its build run inline."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    model = caller.client.post("/api/v1/models/", {"name": name, "team": caller.team.slug}, format="json").json()
    with capture(execute=True):
        response = caller.client.post(
            f"/api/v1/models/{model['id']}/versions/",
            {"file": SimpleUploadedFile("model.onnx", real_models.classifier().read_bytes())},
        )
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    assert version.status == "built", current_error(version)
    return version


def deploy_and_test(page, screenshot, version: ModelVersion, image: Path) -> None:
    """Steps 3 to 6 from the build page of `version`: options checked inline, deploy locally, ready, test image."""
    page.goto(f"/wizard/versions/{version.pk}/build/")
    status = page.get_by_test_id("build-status")
    assert status.get_attribute("data-status") == "built"
    assert "verify" in status.inner_text()
    assert "[batch*, 3, 224, 224]" in page.get_by_test_id("signature").inner_text()
    assert "max_batch_size: 8" in page.get_by_test_id("config-pbtxt").inner_text()
    # a bad option is named by the server's own rules as it is typed, and goes away once fixed
    page.get_by_label("Largest batch (max_batch_size)").fill("2000")
    error = page.locator('#options-check [data-field="max_batch_size"]')
    error.wait_for()
    assert "between 0 and 1024" in error.inner_text()
    page.get_by_label("Largest batch (max_batch_size)").fill("8")
    page.locator("#options-check .ok").wait_for()
    screenshot(page, "wizard-3-build")
    page.get_by_test_id("wizard-next").click()

    # 4. deploy on this machine
    page.wait_for_url("**/deploy/")
    page.get_by_test_id("deploy-runtime").select_option("local")
    page.get_by_test_id("deploy-fit").wait_for()
    screenshot(page, "wizard-4-deploy")
    with page.expect_navigation(timeout=SLOW_MS):
        page.get_by_test_id("deploy-submit").click()

    # 5. live status until ready
    status = page.get_by_test_id("deployment-status")
    page.wait_for_function(
        "document.querySelector('[data-testid=deployment-status]').dataset.status === 'ready'", timeout=SLOW_MS
    )
    assert status.inner_text() == "ready"
    screenshot(page, "wizard-5-status")
    page.get_by_test_id("wizard-next").click()

    # 6. a test inference with an image, preprocessed by the server as the form says
    page.wait_for_url("**/test/")
    page.get_by_test_id("infer-input").set_input_files(str(image))
    page.get_by_label("Mean (R, G, B)").fill(", ".join(str(v) for v in MEAN))
    page.get_by_label("Std (R, G, B)").fill(", ".join(str(v) for v in STD))
    page.get_by_test_id("infer-submit").click()
    first = page.get_by_test_id("infer-output").locator("table.top-k tbody tr").first
    first.wait_for(timeout=60_000)
    screenshot(page, "wizard-6-test")
    assert int(first.get_attribute("data-class")) == onnxruntime_top_class(image)


def test_wizard_from_a_built_version_to_a_test_inference_equal_to_onnxruntime(
    console_browser, alice, eager_tasks, django_capture_on_commit_callbacks, screenshot, tmp_path
):
    # given the demo classifier uploaded and built through the API
    version = upload_through_the_api(alice, django_capture_on_commit_callbacks)
    page = console_browser.page_for(alice.user)
    # when alice goes through steps 3 to 6, then the test inference's top class is onnxruntime's
    deploy_and_test(page, screenshot, version, write_image(tmp_path / "image.png"))
    assert Deployment.objects.get(team=alice.team).status == "ready"


def test_the_quota_refusal_is_shown_before_submit(console_browser, alice, screenshot):
    # given a team whose deployments quota is used up, and a built version
    from tests.deployments.conftest import write_built_version

    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"instances": 2})
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    page.get_by_test_id("deploy-fit").wait_for()
    assert page.get_by_test_id("deploy-submit").is_enabled()
    # when she asks for more model instances than the team has left
    page.get_by_label("Model instances").fill("3")
    # then the page refuses before submit, with the create's own message, and the button is disabled
    refusal = page.get_by_test_id("deploy-refusal")
    refusal.wait_for()
    assert refusal.inner_text() == (
        "Model instance quota exceeded: team 'acme' uses 0 of 2 model instances; this deployment needs 3"
    )
    assert page.get_by_test_id("deploy-submit").is_disabled()
    screenshot(page, "wizard-4-deploy-refused")
    # when the number is brought back within the quota, the page says it fits again
    page.get_by_label("Model instances").fill("2")
    page.get_by_test_id("deploy-fit").wait_for()
    assert page.get_by_test_id("deploy-submit").is_enabled()
    assert not Deployment.objects.exists()


def test_every_refusal_shows_at_once_next_to_its_field(console_browser, alice, screenshot, settings):
    # given a team without room for another deployment and with room for 2 model instances, on a machine without
    # GPUs, and a built version
    from tests.deployments.conftest import write_built_version

    settings.CONCH_LOCAL_GPUS = "0"
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"deployments": 0, "instances": 2})
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    page.get_by_test_id("deploy-refusal").wait_for()
    # when she types a bad name and asks for 3 instances
    page.get_by_label("Deployment name").fill("Bad Name")
    page.get_by_label("Model instances").fill("3")
    # then the three refusals show at once, each next to its field where it has one, and Deploy is disabled
    expect(page.get_by_test_id("deploy-refusal")).to_have_count(3)
    expect(page.get_by_test_id("deploy-error-name")).to_contain_text("a deployment name must be 1 to 63 characters")
    expect(page.get_by_test_id("deploy-error-instance_count")).to_have_text(
        "Model instance quota exceeded: team 'acme' uses 0 of 2 model instances; this deployment needs 3"
    )
    expect(page.get_by_test_id("deploy-refusals")).to_contain_text(
        "Deployment quota exceeded: team 'acme' uses 0 of 0 deployments; this deployment needs 1"
    )
    assert page.get_by_test_id("deploy-submit").is_disabled()
    screenshot(page, "wizard-4-deploy-all-refusals")
    # when she fixes the name, its refusal goes and the other two stay
    page.get_by_label("Deployment name").fill("classifier")
    expect(page.get_by_test_id("deploy-refusal")).to_have_count(2)
    expect(page.get_by_test_id("deploy-error-name")).to_be_hidden()
    expect(page.get_by_test_id("deploy-error-instance_count")).to_be_visible()


def test_the_instance_kind_is_chosen_next_to_the_instance_count(console_browser, alice, screenshot, settings):
    # given a machine without GPUs and a built version
    from tests.deployments.conftest import write_built_version

    settings.CONCH_LOCAL_GPUS = "0"
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    page.get_by_test_id("deploy-fit").wait_for()
    # then GPU instances cannot be chosen here, and the page says why
    kind = page.get_by_test_id("deploy-instance-kind")
    expect(kind.locator("option[value=KIND_GPU]")).to_be_disabled()
    expect(page.get_by_test_id("deploy-instance-kind-help")).to_contain_text(
        "KIND_GPU is unavailable: this machine is set up without GPUs (CONCH_LOCAL_GPUS=0)."
    )
    # when she chooses 2 CPU instances, it fits, and the deployment runs them on the CPU
    page.get_by_label("Model instances").fill("2")
    kind.select_option("KIND_CPU")
    stored = filesizeformat(version.source_size_bytes)  # its own copy of the model file (and a few bytes of config)
    expect(page.get_by_test_id("deploy-fit")).to_have_text(
        f"It fits: this deployment takes 1 deployment, 2 instances, {stored} of storage."
    )
    screenshot(page, "wizard-4-deploy-instance-kind")
    with page.expect_navigation(url="**/status/"):
        page.get_by_test_id("deploy-submit").click()
    deployment = Deployment.objects.get(team=alice.team)
    assert "count: 2" in deployment.config_pbtxt and "kind: KIND_CPU" in deployment.config_pbtxt


def test_a_viewer_cannot_see_the_deploy_button(console_browser, alice):
    from tests.conftest import make_caller
    from tests.deployments.conftest import write_built_version

    version = write_built_version(alice.team, "classifier", real_models.classifier())
    viewer = make_caller("victor", "acme", role="viewer")
    page = console_browser.page_for(viewer.user)
    page.goto(f"/wizard/versions/{version.pk}/deploy/")
    assert page.get_by_test_id("deploy-submit").count() == 0
    assert "deploying needs the developer role" in page.content()


def test_the_whole_wizard_from_file_drop_to_a_test_inference(console_browser, alice, eager_tasks, screenshot, tmp_path):
    # given alice on the wizard's first page
    page = console_browser.page_for(alice.user)
    page.goto("/")
    page.get_by_test_id("start-wizard").click()
    page.wait_for_url("**/wizard/")
    # 1. she registers a model
    page.get_by_label("Name").fill("orientation")
    screenshot(page, "wizard-1-model")
    page.get_by_test_id("wizard-next").click()
    page.wait_for_url("**/upload/")
    # 2. she drops the demo classifier on the page: checksum, parts, completion, then the build page
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        drop_file(page, "#dropzone", real_models.classifier())
        page.get_by_test_id("upload-progress").filter(has_text="parts").wait_for()
        screenshot(page, "wizard-2-upload")
    version = ModelVersion.objects.get(model__team=alice.team, model__name="orientation")
    classifier_sha256 = hashlib.sha256(real_models.classifier().read_bytes()).hexdigest()
    # (checked by the build, which ran inline: eager tasks)
    assert (version.source_sha256, version.source_checked) == (classifier_sha256, True)
    # 3 to 6
    deploy_and_test(page, screenshot, version, write_image(tmp_path / "image.png"))


def test_an_upload_interrupted_mid_part_resumes_after_a_reload(
    console_browser, alice, eager_tasks, screenshot, tmp_path
):
    # given a 20 MiB file (three parts of the server's 8 MiB) and a connection that drops part 2 every time
    data = onnx_like(5, 20 * 1024 * 1024)
    path = tmp_path / "big.onnx"
    path.write_bytes(data)
    page = console_browser.page_for(alice.user)
    model = alice.client.post("/api/v1/models/", {"name": "big", "team": "acme"}, format="json").json()
    sent: list[str] = []
    dropped: list[str] = []

    def drop_part_2(route):
        dropped.append(route.request.url)
        route.abort("connectionreset")

    page.on("request", lambda request: sent.append(request.url) if request.method == "PUT" else None)
    page.route("**/parts/2", drop_part_2)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    shown = watch_progress(page)
    # when the upload runs into the dropped connection
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    page.get_by_test_id("upload-resume").wait_for(state="visible")
    page.wait_for_function("!document.querySelector('[data-testid=upload-resume]').disabled", timeout=60_000)
    page.get_by_test_id("upload-progress").filter(has_text="2 of 3 parts").wait_for(timeout=60_000)
    assert dropped and "Connection lost (the connection dropped" in page.locator("#upload-error").inner_text()
    # (while parts were moving, the progress said how fast and how long still)
    assert any(re.search(r"parts, [0-9.]+ (bytes|KiB|MiB|GiB)/s, .+ left$", text) for text in shown.json_value())
    screenshot(page, "wizard-2-upload-interrupted")
    # and the page is reloaded (the connection back), it says that the upload is still open, how much of it is
    # stored, and how to go on
    page.unroute("**/parts/2")
    sent.clear()
    page.reload()
    open_upload = page.get_by_test_id("open-upload")
    expect(open_upload).to_contain_text("big.onnx: 12 MiB of 20 MiB stored (2 of 3 parts), expires ")
    expect(page.get_by_test_id("open-uploads")).to_contain_text("Drop or choose the same file again")
    screenshot(page, "wizard-2-upload-open-after-reload")
    # and the same file is chosen again
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then only the missing part was sent again, and the stored file has the file's sha256
    assert [url.rsplit("/", 1)[1] for url in sent] == ["2"]
    version = ModelVersion.objects.get(model_id=model["id"])
    assert version.source_size_bytes == len(data)
    assert (version.source_sha256, version.source_checked) == (hashlib.sha256(data).hexdigest(), True)


def test_an_upload_resumes_from_the_server_when_the_browser_forgot_it(
    console_browser, alice, eager_tasks, screenshot, tmp_path
):
    from uploads.models import Upload

    # given an upload of a 20 MiB file (three parts) stopped by a connection that drops part 2 (parts 1 and 3 stored)
    page, data, model_id = _interrupted_upload(console_browser, alice, tmp_path, "forgotten")
    path = tmp_path / "forgotten.onnx"
    # and the browser's record of it gone (storage cleared), the connection back
    page.unroute("**/parts/2")
    page.evaluate("localStorage.clear()")
    page.reload()
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url) if request.method == "PUT" else None)
    # when the same file is chosen again
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page found the open upload on the server (by name, size and first bytes) and sent only part 2,
    # and the stored file has the file's sha256
    assert [url.rsplit("/", 1)[1] for url in sent] == ["2"]
    assert Upload.objects.filter(model_id=model_id).count() == 1
    stored_version(model_id=model_id, data=data)


def test_another_file_of_the_same_name_and_size_does_not_resume_the_open_upload(
    console_browser, alice, eager_tasks, tmp_path
):
    from uploads.models import Upload

    # given an open upload of a 20 MiB file that the browser forgot (storage cleared), the connection back
    page, first, model_id = _interrupted_upload(console_browser, alice, tmp_path, "replaced")
    page.unroute("**/parts/2")
    page.evaluate("localStorage.clear()")
    page.reload()
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url) if request.method == "PUT" else None)
    # when another file of the same name and size (other first bytes) is chosen
    other = onnx_like(29, 20 * 1024 * 1024)
    path = tmp_path / "replaced.onnx"
    path.write_bytes(other)
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then it went whole into a new upload, the open one left as it was (promising the first file's sha256, which
    # the page sent once it had hashed it), and the stored file has the other file's sha256
    assert sorted(url.rsplit("/", 1)[1] for url in sent) == ["1", "2", "3"]
    uploads = dict(Upload.objects.filter(model_id=model_id).values_list("status", "sha256"))
    assert uploads == {"uploading": hashlib.sha256(first).hexdigest(), "completed": hashlib.sha256(other).hexdigest()}
    stored_version(model_id=model_id, data=other)


def test_an_open_upload_whose_client_promised_part_checksums_is_resumed_with_them(
    console_browser, alice, eager_tasks, tmp_path
):
    from uploads.models import Upload

    # given an open upload of this very file (name, size, first bytes) started by a client that promised each
    # part's CRC32 (as `conch upload` does), with part 1 of its 3 already stored
    data = onnx_like(11, 20 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "crc.onnx", data, name="crc")
    started = alice.client.post(
        f"/api/v1/models/{model['id']}/uploads/",
        {
            "filename": "crc.onnx",
            "size_bytes": len(data),
            "head": base64.b64encode(data[:512]).decode(),
            "part_size_bytes": PLANNED_PART_BYTES,
            "part_checksum_algorithm": "CRC32",
        },
        format="json",
    )
    assert started.status_code == 201, started.content
    upload_url = f"/api/v1/models/{model['id']}/uploads/{started.json()['id']}/"
    first = data[:PLANNED_PART_BYTES]
    signed = alice.client.post(
        f"{upload_url}parts/", {"numbers": [1], "checksums": {"1": crc32_base64(first)}}, format="json"
    )
    assert signed.status_code == 200, signed.content
    stored = alice.client.generic(
        "PUT",
        f"{upload_url}parts/1",
        first,
        content_type="application/octet-stream",
        **{"HTTP_X_AMZ_CHECKSUM_CRC32": crc32_base64(first)},
    )
    assert stored.status_code < 300, stored.content
    page = console_browser.page_for(alice.user)
    puts: dict[str, str] = {}
    page.on(
        "request",
        lambda request: (
            puts.__setitem__(request.url.rsplit("/", 1)[1], request.headers.get("x-amz-checksum-crc32"))
            if request.method == "PUT"
            else None
        ),
    )
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # when the file is chosen in the wizard
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page went on with that upload: only parts 2 and 3 were sent, each with its own CRC32
    parts = {"2": data[8 * 2**20 : 16 * 2**20], "3": data[16 * 2**20 :]}
    assert puts == {n: crc32_base64(part) for n, part in parts.items()}
    statuses = list(Upload.objects.filter(model_id=model["id"]).values_list("status", "part_checksum_algorithm"))
    assert statuses == [("completed", "CRC32")]
    stored_version(model_id=model["id"], data=data)


def test_a_part_damaged_on_the_way_is_refused_by_its_crc32_and_sent_again(
    console_browser, alice, eager_tasks, tmp_path
):
    from uploads.models import Upload

    # given a 10 MiB file (two parts) and a connection that flips a byte of part 2 the first time it goes
    data = onnx_like(23, 10 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "damaged.onnx", data, name="damaged")
    page = console_browser.page_for(alice.user)
    damaged: list[int] = []
    answers: list[int] = []

    def damage_once(route):
        body = route.request.post_data_buffer
        if damaged:
            route.continue_()
            return
        damaged.append(len(body))
        route.continue_(post_data=body[:100] + bytes([body[100] ^ 0xFF]) + body[101:])

    page.route("**/parts/2", damage_once)
    page.on("response", lambda response: answers.append(response.status) if response.url.endswith("/parts/2") else None)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # when the file is chosen
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the damaged copy was refused (its CRC32 did not match) and kept nowhere, the part was sent again by
    # itself, and the stored file has the file's sha256
    assert damaged == [len(data) - PLANNED_PART_BYTES]
    assert answers[0] == 400 and answers[-1] < 300, answers
    assert Upload.objects.get(model_id=model["id"]).part_checksum_algorithm == "CRC32"
    stored_version(model_id=model["id"], data=data)


def _interrupted_upload(console_browser, alice, tmp_path, name: str):
    """A page whose upload of a 20 MiB file loses part 2 to a connection that drops it every time (the others
    stored), the page waiting to retry it; returns (page, file bytes, model id). page.unroute("**/parts/2") mends
    the connection."""
    data = onnx_like(9, 20 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / f"{name}.onnx", data, name=name)
    page = console_browser.page_for(alice.user)
    dropped: list[str] = []

    def drop_part_2(route):
        dropped.append(route.request.url)
        route.abort("connectionreset")

    page.route("**/parts/2", drop_part_2)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    page.get_by_test_id("upload-progress").filter(has_text="2 of 3 parts").wait_for(timeout=60_000)
    # "2 of 3 parts" may show before part 2's failure reaches the page (parts 1 and 3 in first): Resume follows it
    expect(page.get_by_test_id("upload-resume")).to_be_enabled()
    return page, data, model["id"]


def test_resume_goes_on_without_a_reload(console_browser, alice, eager_tasks, tmp_path):
    # given an upload waiting to retry a part the connection dropped, and the connection back
    page, data, model_id = _interrupted_upload(console_browser, alice, tmp_path, "resumed")
    page.unroute("**/parts/2")
    # when Resume is pressed (not waiting for the retry)
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-resume").click()
    # then the upload completes with the file's sha256
    stored_version(model_id=model_id, data=data)


def test_cancel_aborts_the_upload(console_browser, alice, eager_tasks, tmp_path):
    from uploads.models import Upload

    # given an upload waiting to retry a part the connection dropped
    page, _, model_id = _interrupted_upload(console_browser, alice, tmp_path, "cancelled")
    # when Cancel is pressed
    page.get_by_role("button", name="Cancel").click()
    page.get_by_test_id("upload-progress").filter(has_text="Cancelled").wait_for()
    # then the upload is aborted, no version made, and the page forgot it
    assert list(Upload.objects.filter(model_id=model_id).values_list("status", flat=True)) == ["aborted"]
    assert not ModelVersion.objects.filter(model_id=model_id).exists()
    assert page.evaluate("Object.keys(localStorage).filter((k) => k.startsWith('conch.upload:'))") == []


def test_with_s3_storage_the_parts_go_straight_to_the_bucket(
    console_browser, alice, eager_tasks, settings, s3_server, s3_bucket, s3_client, live_server, tmp_path
):
    # given S3 storage on the test S3 server, its bucket letting the console's origin PUT parts (docs/uploads.md)
    endpoint, bucket = s3_bucket
    settings.CONCH_STORAGE_URL = f"s3://{bucket}/conch"
    settings.CONCH_S3_ENDPOINT_URL = endpoint
    settings.CONCH_S3_ACCESS_KEY_ID = s3_server.access_key
    settings.CONCH_S3_SECRET_ACCESS_KEY = s3_server.secret_key
    rule = {"AllowedOrigins": [live_server.url], "AllowedMethods": ["PUT"], "AllowedHeaders": ["*"]}
    s3_client.put_bucket_cors(
        Bucket=bucket, CORSConfiguration={"CORSRules": [{**rule, "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 60}]}
    )
    data = onnx_like(3, 10 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "s3.onnx", data, name="stored")
    page = console_browser.page_for(alice.user)
    puts: list[str] = []
    checksums: list[str | None] = []

    def record(request):
        if request.method == "PUT":
            puts.append(request.url)
            checksums.append(request.headers.get("x-amz-checksum-crc32"))

    page.on("request", record)
    # when the file is uploaded through the wizard
    page.goto(f"/wizard/models/{model['id']}/upload/")
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then both parts went to the bucket, not to Conch, each with its CRC32 signed into its URL, and the stored
    # file has the file's sha256
    assert len(puts) == 2 and all(url.startswith(f"{endpoint}/{bucket}/") for url in puts), puts
    assert all("x-amz-checksum-crc32" in url.lower() for url in puts), puts
    parts = [data[:PLANNED_PART_BYTES], data[PLANNED_PART_BYTES:]]
    assert sorted(checksums) == sorted(crc32_base64(part) for part in parts)
    stored_version(model_id=model["id"], data=data)


def test_the_page_sends_the_parts_the_server_plans(console_browser, alice, eager_tasks, monkeypatch, tmp_path):
    import json

    from uploads.services import parts

    # given a server that plans parts of 5 MiB, and a 12 MiB file
    monkeypatch.setattr(parts, "DEFAULT_PART_SIZE_BYTES", 5 * 1024 * 1024)
    data = onnx_like(31, 12 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "planned.onnx", data, name="planned")
    page = console_browser.page_for(alice.user)
    starts: list[dict] = []
    parts: dict[str, int] = {}

    def record_part(route):
        if route.request.method == "PUT":
            parts[route.request.url.rsplit("/", 1)[1]] = len(route.request.post_data_buffer)
        route.continue_()

    page.on(
        "request",
        lambda request: (
            starts.append(json.loads(request.post_data))
            if request.method == "POST" and request.url.endswith("/uploads/")
            else None
        ),
    )
    page.route("**/parts/*", record_part)
    # when the file is uploaded through the wizard
    page.goto(f"/wizard/models/{model['id']}/upload/")
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page asked for no part size of its own and sent the server's three parts of 5, 5 and 2 MiB
    assert starts and all("part_size_bytes" not in start for start in starts), starts
    assert parts == {"1": 5 * 2**20, "2": 5 * 2**20, "3": 2 * 2**20}
    stored_version(model_id=model["id"], data=data)


def test_a_file_over_the_size_limit_is_refused_before_it_is_hashed(console_browser, alice, settings, tmp_path):
    # given a server that takes model files of at most 2 KiB, and a 4 KiB file
    settings.CONCH_MAX_UPLOAD_BYTES = 2048
    model, path = model_and_file(alice, tmp_path / "large.onnx", b"\x08\x07" + b"\x01" * 4094, name="large")
    page = console_browser.page_for(alice.user)
    calls: list[str] = []
    page.on("request", lambda request: calls.append(request.url) if "/uploads/" in request.url else None)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    shown = watch_progress(page)
    # when the file is chosen
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page says it is too big, naming the server's limit, without hashing it or calling the API
    error = page.locator("#upload-error")
    error.filter(has_text="larger than the").wait_for()
    assert error.inner_text().startswith("large.onnx is 4.0 KiB (4096 bytes), larger than the 2 KiB (2048 bytes)")
    assert not any("checksum" in text for text in shown.json_value())
    assert calls == []


def test_the_servers_refusal_is_not_prefixed_with_a_field_it_already_names(console_browser, alice, settings, tmp_path):
    # given the upload page loaded while the limit was large, then the server's limit lowered
    model, path = model_and_file(alice, tmp_path / "large.onnx", b"\x08\x07" + b"\x01" * 4094, name="large")
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    settings.CONCH_MAX_UPLOAD_BYTES = 2048
    # when the file is chosen, the server answers 413 naming size_bytes
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    error = page.locator("#upload-error")
    error.filter(has_text="is larger than").wait_for()
    # then its sentence is shown once, not "size_bytes: size_bytes …"
    assert error.inner_text().startswith("size_bytes 4096 is larger than the 2 KiB")
    # and the progress line says the file was not uploaded (not "No file chosen." beside the file's name)
    assert page.get_by_test_id("upload-progress").inner_text() == "Not uploaded."


def test_a_browser_without_byte_streams_hashes_the_file_by_slices(console_browser, alice, eager_tasks, tmp_path):
    # given a browser whose files' streams are not byte streams (no reader that fills a buffer of ours), and a
    # 5 MiB file: three of the page's 2 MiB slices, the last one short
    data = onnx_like(7, 5 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "sliced.onnx", data, name="sliced")
    page = console_browser.page_for(alice.user)
    page.add_init_script("Blob.prototype.stream = function () { return new ReadableStream(); };")
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # when the file is chosen
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page read it in slices (that stream gives no bytes) and the stored file has the file's sha256
    stored_version(model_id=model["id"], data=data)


def record_changes(page, selector: str, expression: str) -> list:
    """Keep in a list here every value of `expression` (on the element `el` of `selector`) each time the element
    changes, from now on, through the page's navigation away (values pass to Python as they come)."""
    seen: list = []
    name = f"record{len(page.context.pages)}_{abs(hash(selector + expression))}"
    page.expose_function(name, lambda value: seen.append(value))
    page.evaluate(
        f"""() => {{
            const el = document.querySelector({selector!r});
            new MutationObserver(() => window.{name}({expression}))
                .observe(el, {{childList: true, subtree: true, attributes: true}});
        }}"""
    )
    return seen


def throttle_uploads(page, bytes_per_s: int):
    """Chromium's network throttling (DevTools) on `page`'s requests' bodies, so an upload takes seconds here;
    returns a function that turns Chromium's offline mode on (True) or off (False, and the throttling with it)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": bytes_per_s},
    )

    def set_offline(offline: bool) -> None:
        # Playwright's offline mode, and the same on this DevTools session: its throttling would mask the former
        page.context.set_offline(offline)
        conditions = {"offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
        cdp.send("Network.emulateNetworkConditions", conditions)

    return set_offline


def test_an_upload_goes_on_by_itself_after_the_browser_was_offline_for_seconds(
    console_browser, alice, eager_tasks, tmp_path
):
    # given a 20 MiB file (three parts) going at 4 MiB/s
    data = onnx_like(13, 20 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "offline.onnx", data, name="offline")
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    set_offline = throttle_uploads(page, 4 * 1024 * 1024)
    stored = record_changes(page, "[data-testid=upload-progress]", "Number(el.dataset.sentBytes || 0)")
    said = record_changes(page, "#upload-error", "el.textContent")
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    page.get_by_test_id("upload-progress").filter(has_text="sending").wait_for(timeout=60_000)
    # when the browser goes offline for 3 s mid-upload, then back
    set_offline(True)
    page.locator("#upload-error").filter(has_text="Connection lost").wait_for(timeout=10_000)
    page.wait_for_timeout(3_000)
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        set_offline(False)
    # then the page said it retries (no bare "Failed to fetch"), and finished by itself: the stored file has the
    # file's sha256, and the progress shown never went back
    assert any(re.search(r"^Connection lost \(.+\); retrying in \d+ s \(Resume now\)$", text) for text in said), said
    assert not any(text.startswith("Failed to fetch") for text in said), said
    stored_version(model_id=model["id"], data=data)
    assert stored == sorted(stored), stored


def test_a_part_answered_503_is_sent_again_by_itself(console_browser, alice, eager_tasks, tmp_path):
    # given a 10 MiB file (two parts) and a server that answers part 2 with 503 the first time
    data = onnx_like(17, 10 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "busy.onnx", data, name="busy")
    page = console_browser.page_for(alice.user)
    refused: list[str] = []

    def busy_once(route):
        if refused:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.fulfill(status=503, content_type="application/json", body='{"detail": "The store is busy."}')

    page.route("**/parts/2", busy_once)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # when the file is chosen
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then part 2 was sent again without a press of Resume, and the stored file has the file's sha256
    assert len(refused) == 1
    stored_version(model_id=model["id"], data=data)


def test_a_part_whose_bytes_stop_moving_is_aborted_and_sent_again(
    console_browser, alice, eager_tasks, settings, tmp_path
):
    # given a page that gives a part 2 s without progress (CONCH_UPLOAD_STALL_SECONDS, its data-stall-seconds), a
    # 10 MiB file (two parts) and a link that holds part 2 the first time: the request open, no byte moving
    settings.CONCH_UPLOAD_STALL_SECONDS = 2
    data = onnx_like(19, 10 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "stalled.onnx", data, name="stalled")
    page = console_browser.page_for(alice.user)
    held: list = []

    def hold_once(route):
        if held:
            route.continue_()
        else:
            held.append(route)  # never continued: the part's bytes stop here

    page.route("**/parts/2", hold_once)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    assert page.get_attribute("#upload", "data-stall-seconds") == "2"
    said = record_changes(page, "#upload-error", "el.textContent")
    # when the file is chosen
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page said that part 2 stood still and retried it by itself, and the stored file has the file's sha256
    assert len(held) == 1
    assert any(
        re.search(r"^Connection lost \(part 2 moved no bytes for 2 s\); retrying in \d+ s", text) for text in said
    ), said
    stored_version(model_id=model["id"], data=data)


def test_a_slow_part_that_moves_is_never_aborted(console_browser, alice, eager_tasks, settings, tmp_path):
    # given a page that gives a part 2 s without progress, and a 10 MiB file (two parts) sent at 1 MiB/s: each part
    # takes several times the stall time, its bytes moving all along
    settings.CONCH_UPLOAD_STALL_SECONDS = 2
    data = onnx_like(23, 10 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "slow.onnx", data, name="slow")
    page = console_browser.page_for(alice.user)
    puts: list[str] = []
    page.on("request", lambda request: puts.append(request.url) if request.method == "PUT" else None)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    throttle_uploads(page, 1024 * 1024)
    said = record_changes(page, "#upload-error", "el.textContent")
    # when the file is chosen
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then no part was aborted or sent twice, and the stored file has the file's sha256
    assert [text for text in said if text] == [] and len(puts) == 2, (said, puts)
    stored_version(model_id=model["id"], data=data)


def test_a_part_refused_with_a_4xx_that_names_the_problem_stops_with_it(console_browser, alice, eager_tasks, tmp_path):
    # given a server that refuses part 2, naming why
    model, path = model_and_file(alice, tmp_path / "refused.onnx", onnx_like(19, 10 * 1024 * 1024), name="refused")
    page = console_browser.page_for(alice.user)
    tries: list[str] = []

    def refuse(route):
        tries.append(route.request.url)
        body = '{"detail": "The upload expired; start it again.", "field": "upload"}'
        route.fulfill(status=404, content_type="application/json", body=body)

    page.route("**/parts/2", refuse)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # when the file is chosen
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page stops with the server's sentence, waits for Resume, and does not try again by itself
    error = page.locator("#upload-error")
    error.filter(has_text="expired").wait_for(timeout=60_000)
    assert error.inner_text() == "The upload stopped (The upload expired; start it again.). Press Resume to go on."
    page.wait_for_timeout(3_000)
    assert len(tries) == 1
    assert page.get_by_test_id("upload-resume").is_enabled()
    assert "Stopped: " in page.get_by_test_id("upload-progress").inner_text()


def test_pause_lets_the_parts_in_flight_finish_and_the_progress_never_goes_back(
    console_browser, alice, eager_tasks, tmp_path
):
    from uploads import services as uploads
    from uploads.models import Upload

    # given a 40 MiB file (five parts of 8 MiB, three at a time) going at 4 MiB/s
    data = onnx_like(23, 40 * 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "paused.onnx", data, name="paused")
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    throttle_uploads(page, 4 * 1024 * 1024)
    stored = record_changes(page, "[data-testid=upload-progress]", "Number(el.dataset.sentBytes || 0)")
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    line = page.get_by_test_id("upload-progress")
    line.filter(has_text="sending").wait_for(timeout=60_000)
    # when Pause is pressed while the first three parts are on their way
    page.get_by_role("button", name="Pause").click()
    # then those parts finish and are kept, no other part starts, and the line says so
    line.filter(has_text="Paused: 24.0 MiB of 40.0 MiB stored (60.0 %), 3 of 5 parts").wait_for(timeout=60_000)
    page.wait_for_timeout(1_000)
    upload = Upload.objects.get(model_id=model["id"])
    assert [part.number for part in uploads.stored_parts(upload=upload)] == [1, 2, 3]
    assert stored == sorted(stored) and stored[-1] == 24 * 1024 * 1024, stored
    # and Resume sends the other two: the stored file has the file's sha256
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-resume").click()
    stored_version(model_id=model["id"], data=data)


@pytest.mark.parametrize(
    ("name", "content", "label", "detail"),
    [
        (
            "notes.docx",
            b"my notes about the model\n" * 100,
            "File name",
            "'notes.docx' is not a model file Conch builds",
        ),
        ("notmodel.onnx", b"my notes about the model\n" * 100, "File contents", "This is not an ONNX model: it looks"),
    ],
)
def test_a_file_conch_cannot_build_is_refused_by_the_server_before_it_is_hashed_or_sent(
    console_browser, alice, tmp_path, name, content, label, detail
):
    from uploads.models import Upload

    # given a file that is not an ONNX model, by its name or by its first bytes
    path = tmp_path / name
    path.write_bytes(content)
    model = alice.client.post("/api/v1/models/", {"name": "notes", "team": "acme"}, format="json").json()
    page = console_browser.page_for(alice.user)
    puts: list[str] = []
    page.on("request", lambda request: puts.append(request.url) if request.method == "PUT" else None)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    shown = watch_progress(page)
    # when it is chosen
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the server's refusal is shown after the field's human label (not the API's `head`), and the file was
    # neither hashed nor sent
    error = page.locator("#upload-error")
    error.filter(has_text=detail).wait_for()
    text = error.inner_text()
    assert text.startswith(f"{label}: {detail}"), text
    assert not any("checksum" in seen for seen in shown.json_value())
    assert puts == []
    assert not Upload.objects.filter(model_id=model["id"]).exists()


def test_the_upload_step_says_which_format_the_server_told_and_what_the_build_does_with_it(
    console_browser, alice, tmp_path
):
    from devtools.tree_models import lightgbm_model

    # given a LightGBM model in its text format, and the upload page
    path = lightgbm_model(tmp_path / "churn.txt", "binary")
    model = alice.client.post("/api/v1/models/", {"name": "churn", "team": "acme"}, format="json").json()
    page = console_browser.page_for(alice.user)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    # then the file chooser offers every format's endings
    accept = page.get_by_test_id("upload-file-input").get_attribute("accept")
    assert accept.split(",") == [
        ".onnx",
        ".txt",
        ".model",
        ".lgb",
        ".json",
        ".ubj",
        ".keras",
        ".h5",
        ".hdf5",
        ".pb",
        ".tflite",
        ".pt",
        ".pth",
        ".jit",
        ".pt2",
        ".plan",
        ".engine",
        ".trt",
        ".zip",
        ".tar",
        ".tar.gz",
        ".tgz",
        ".tar.bz2",
        ".tar.xz",
    ]
    # when the file is chosen
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    # then the page names the format the server told and says it will be converted and compared
    told = page.locator("#upload-file-name").filter(has_text="LightGBM")
    told.wait_for()
    assert told.inner_text() == (
        f"churn.txt, {path.stat().st_size / 1024:.1f} KiB: LightGBM model (text), converted to ONNX with onnxmltools "
        "and compared with its framework's outputs"
    )


def _version_through_the_api(caller, model_id: int, name: str, data: bytes) -> ModelVersion:
    """`data` uploaded as a version of model `model_id` with the single-request upload (its build runs inline and
    fails: the bytes are no model)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = caller.client.post(f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile(name, data)})
    assert response.status_code == 201, response.content
    return ModelVersion.objects.get(pk=response.json()["id"])


def _duplicate_page(console_browser, alice, tmp_path):
    """The upload page after choosing a 1 MiB file that already is version 1 of the model; returns (page, the
    version, the URLs of the parts the page PUT)."""
    data = onnx_like(4, 1024 * 1024)
    model, path = model_and_file(alice, tmp_path / "again.onnx", data, name="again")
    version = _version_through_the_api(alice, model["id"], path.name, data)
    page = console_browser.page_for(alice.user)
    puts: list[str] = []
    page.on("request", lambda request: puts.append(request.url) if request.method == "PUT" else None)
    page.goto(f"/wizard/models/{model['id']}/upload/")
    page.get_by_test_id("upload-file-input").set_input_files(str(path))
    page.get_by_test_id("upload-duplicate").wait_for()
    return page, version, puts


def test_a_file_that_already_is_a_version_is_said_so_before_it_is_sent_and_can_be_uploaded_anyway(
    console_browser, alice, eager_tasks, screenshot, tmp_path
):
    from uploads.models import Upload

    # when a file that already is version 1 is chosen
    page, version, puts = _duplicate_page(console_browser, alice, tmp_path)
    # then the page says so, before a part is sent, linking to that version
    version.refresh_from_db()
    expect(page.get_by_test_id("upload-duplicate")).to_contain_text(
        f"This file is already version 1 of this model ({version.status})."
    )
    # with what to do with it, by its status
    todo = {"built": "Deploy that version", "failed": "see why its build failed and rebuild it with other options"}
    expect(page.get_by_test_id("upload-duplicate")).to_contain_text(
        todo.get(version.status, "Wait for that version's build")
    )
    # (a built one's deploy step, another's build page)
    link = page.get_by_test_id("upload-duplicate-link")
    if version.status == "built":
        assert link.inner_text() == "Deploy version 1"
        assert link.get_attribute("href") == f"/wizard/versions/{version.pk}/deploy/"
    else:
        assert link.inner_text() == "Open version 1"
        assert link.get_attribute("href") == f"/wizard/versions/{version.pk}/build/"
    assert page.get_by_test_id("upload-progress").evaluate("() => document.getElementById('upload-bar').value") == 0
    assert page.locator("#upload-error").is_hidden()
    assert puts == []
    # and the upload the page had started for it is aborted (it reserved the file's size of the team's storage)
    uploads = Upload.objects.filter(model_id=version.model_id)
    assert list(uploads.values_list("status", flat=True)) == ["aborted"]
    screenshot(page, "wizard-2-upload-duplicate")
    # when "Upload as a new version" is pressed
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-as-new").click()
    # then the file is sent (in a new upload) and becomes version 2
    assert sorted(uploads.values_list("status", flat=True)) == ["aborted", "completed"]
    made = ModelVersion.objects.get(model_id=version.model_id, number=2)
    assert made.source_sha256 == version.source_sha256
    assert page.url.endswith(f"/wizard/versions/{made.pk}/build/")


def test_cancel_after_a_duplicate_refusal_aborts_the_upload(console_browser, alice, tmp_path):
    from uploads.models import Upload

    page, version, _ = _duplicate_page(console_browser, alice, tmp_path)
    page.get_by_test_id("upload-duplicate-cancel").click()
    page.get_by_test_id("upload-progress").filter(has_text="Cancelled").wait_for()
    assert page.get_by_test_id("upload-duplicate").is_hidden()
    assert list(Upload.objects.filter(model_id=version.model_id).values_list("status", flat=True)) == ["aborted"]
    assert list(ModelVersion.objects.filter(model_id=version.model_id).values_list("number", flat=True)) == [1]


def test_a_file_that_became_a_version_while_it_was_sent_is_refused_at_the_completion(
    console_browser, alice, eager_tasks, tmp_path
):
    # given an upload waiting to retry a part, and the same file uploaded meanwhile as version 1 by another client
    page, data, model_id = _interrupted_upload(console_browser, alice, tmp_path, "raced")
    version = _version_through_the_api(alice, model_id, "raced.onnx", data)
    # when the connection is back and the page's retry sends the last part
    page.unroute("**/parts/2")
    # then the completion is refused as a duplicate, naming version 1
    expect(page.get_by_test_id("upload-duplicate")).to_contain_text(
        "This file is already version 1 of this model", timeout=60_000
    )
    # and "Upload as a new version" completes it as version 2, from the parts already stored
    with page.expect_navigation(url="**/build/", timeout=SLOW_MS):
        page.get_by_test_id("upload-as-new").click()
    made = ModelVersion.objects.get(model_id=model_id, number=2)
    assert made.source_sha256 == version.source_sha256 == hashlib.sha256(data).hexdigest()

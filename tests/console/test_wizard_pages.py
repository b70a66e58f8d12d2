"""The wizard's pages and partials through Django's test client (the browser tests drive the same pages)."""

from __future__ import annotations

import hashlib

import pytest
from django.template.defaultfilters import filesizeformat
from django.test import Client

from builds.model_config import BuildOptions
from builds.models import Build
from builds.services import current_build, current_options, latest_config_pbtxt
from builds.services.review import current_option_values
from deployments.models import Deployment
from models_registry.models import RegisteredModel
from tenancy.quotas import set_quota
from tests import real_models
from tests.build_records import fail_current_build
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from uploads.models import Upload

pytestmark = [pytest.mark.django_db]


def _client(caller) -> Client:
    client = Client()
    client.force_login(caller.user)
    return client


def test_step_1_registers_a_model_and_goes_to_its_upload(alice):
    # when
    response = _client(alice).post("/wizard/", {"name": "orientation"})
    # then
    model = RegisteredModel.objects.get(team=alice.team, name="orientation")
    assert response.status_code == 302
    assert response["Location"] == f"/wizard/models/{model.pk}/upload/"


def test_step_1_shows_a_bad_name_under_the_field(alice):
    response = _client(alice).post("/wizard/", {"name": "Not A Label"})
    assert response.status_code == 400
    assert b'id="model-name-error"' in response.content
    assert not RegisteredModel.objects.exists()


def test_the_upload_page_carries_the_hooks_and_the_uploads_url(alice):
    model = RegisteredModel.objects.create(team=alice.team, name="orientation")
    page = _client(alice).get(f"/wizard/models/{model.pk}/upload/").content.decode()
    assert 'data-testid="upload-file-input"' in page
    assert 'data-testid="upload-progress"' in page and 'data-testid="upload-resume"' in page
    assert f'data-uploads-url="/api/v1/models/{model.pk}/uploads/"' in page
    assert "vendor/hash-wasm/sha256.umd.min.js" in page


def test_the_upload_page_offers_pickle_endings_only_to_a_team_allowed_pickles(alice):
    # given a model of a team no platform admin allowed pickles for
    model = RegisteredModel.objects.create(team=alice.team, name="churn")
    url = f"/wizard/models/{model.pk}/upload/"
    # then its file chooser leaves out the pickle endings
    assert (
        'accept=".onnx,.txt,.model,.lgb,.json,.ubj,.keras,.h5,.hdf5,.pb,.tflite,.pt,.pth,.jit,.pt2,.plan,.engine,.trt,.zip,.tar,.tar.gz,.tgz,.tar.bz2,.tar.xz"'
        in _client(alice).get(url).content.decode()
    )
    # when an admin allows pickles for the team
    alice.team.allow_pickled_models = True
    alice.team.save(update_fields=["allow_pickled_models"])
    # then the chooser offers them too, and the drop zone names the format
    page = _client(alice).get(url).content.decode()
    assert (
        'accept=".onnx,.txt,.model,.lgb,.json,.ubj,.joblib,.pkl,.pickle,.keras,.h5,.hdf5,.pb,.tflite,.pt,.pth,.jit,.pt2,.plan,.engine,.trt,.zip,.tar,.tar.gz,.tgz,.tar.bz2,.tar.xz"'
        in page
    )
    assert "scikit-learn" in page


def test_the_upload_page_shows_an_open_upload_and_how_to_go_on_with_it(alice):
    # given an upload of an 11 MiB file in parts of 5 MiB (folder storage), its first and last parts sent
    data = bytes(range(256)) * (11 * 4096)
    model = RegisteredModel.objects.create(team=alice.team, name="orientation")
    client = _client(alice)
    assert 'data-testid="open-uploads"' not in client.get(f"/wizard/models/{model.pk}/upload/").content.decode()
    body = {
        "filename": "orientation.onnx",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "part_size_bytes": 5 * 2**20,
    }
    upload = alice.client.post(f"/api/v1/models/{model.pk}/uploads/", body, format="json").json()
    parts = alice.client.post(
        f"/api/v1/models/{model.pk}/uploads/{upload['id']}/parts/", {"numbers": [1, 3]}, format="json"
    ).json()["parts"]
    for part in parts:
        start = (part["number"] - 1) * 5 * 2**20
        chunk = data[start : start + 5 * 2**20]
        assert alice.client.put(part["url"], data=chunk, content_type="application/octet-stream").status_code == 200
    # when the upload page is opened again (a reload)
    page = client.get(f"/wizard/models/{model.pk}/upload/").content.decode()
    # then it lists the open upload: its file, what is stored of it, when it expires; and how to go on
    expires = Upload.objects.get(pk=upload["id"]).expires_at.strftime("%Y-%m-%d %H:%M")
    assert "An upload of this model is still open" in page
    assert f'data-testid="open-upload" data-upload="{upload["id"]}"' in page
    assert "<b>orientation.onnx</b>:\n      6 MiB of 11 MiB stored (2 of 3 parts)," in page
    assert "expires <time datetime=" in page and f">{expires} UTC</time> · started by alice</li>" in page
    assert "Drop or choose the same file again (same name, size and content) and the upload continues" in page


def test_another_team_s_model_version_and_deployment_are_404(alice, bob):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    deployment = Deployment.objects.create(team=alice.team, name="web", model_version=version)
    client = _client(bob)
    for url in (
        f"/wizard/models/{version.model_id}/upload/",
        f"/wizard/versions/{version.pk}/build/",
        f"/wizard/versions/{version.pk}/deploy/",
        f"/wizard/deployments/{deployment.pk}/status/",
        f"/wizard/deployments/{deployment.pk}/test/",
    ):
        assert client.get(url).status_code == 404, url


def test_the_build_page_shows_signature_config_and_diff(alice):
    # given two built versions with different batch sizes
    write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    second = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=4))
    # when
    page = _client(alice).get(f"/wizard/versions/{second.pk}/build/").content.decode()
    # then
    assert 'data-testid="build-status"' in page
    assert "<code>[batch*, 3, 224, 224]</code>" in page
    assert 'data-testid="config-pbtxt"' in page and "max_batch_size: 4" in page
    assert "-max_batch_size: 8" in page and "+max_batch_size: 4" in page
    assert 'data-testid="wizard-next"' in page


def test_the_options_partial_names_each_field_at_fault(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/build/check",
        {"dynamic_batching": "on", "max_batch_size": "x", "instance_count": "0"},
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-field="max_batch_size"' in page and 'data-field="instance_count"' in page
    ok = _client(alice).post(f"/wizard/versions/{version.pk}/build/check", {"dynamic_batching": "on"})
    assert "These options are valid" in ok.content.decode()


def test_the_options_form_takes_output_dims_checked_naming_the_tensor(alice):
    # given a built version whose output is 'fetch_name_0'
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    client = _client(alice)
    assert 'name="output_dims"' in client.get(f"/wizard/versions/{version.pk}/build/").content.decode()
    # when output shapes are checked: one naming no output, then a good one
    unknown = client.post(
        f"/wizard/versions/{version.pk}/build/check", {"dynamic_batching": "on", "output_dims": "nope=1,4"}
    ).content.decode()
    good = client.post(
        f"/wizard/versions/{version.pk}/build/check", {"dynamic_batching": "on", "output_dims": "fetch_name_0=-1,4"}
    ).content.decode()
    # then the field and the tensor are named, and a good shape is valid
    assert 'data-field="output_dims"' in unknown
    assert "output_dims names &#x27;nope&#x27;, which is not an output of the model" in unknown
    assert "These options are valid" in good
    # and a rebuild from the page keeps them in the version's options
    response = client.post(
        f"/wizard/versions/{version.pk}/build/", {"dynamic_batching": "on", "output_dims": "fetch_name_0=-1,4"}
    )
    assert response.status_code == 302, response.content
    version.refresh_from_db()
    assert current_options(version)["output_dims"] == {"fetch_name_0": [-1, 4]}
    # which the form shows again as it was written
    assert current_option_values(version)["output_dims"] == "fetch_name_0=-1,4"


def test_a_rebuild_from_the_page_with_a_bad_option_changes_nothing(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/build/", {"dynamic_batching": "on", "preferred_batch_size": "64"}
    )
    assert response.status_code == 400
    assert 'data-field="preferred_batch_size"' in response.content.decode()
    version.refresh_from_db()
    assert version.status == "built"


def test_the_deploy_page_refuses_before_submit_with_the_create_s_message(alice):
    # given a team with no room for another deployment
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"deployments": 0})
    client = _client(alice)
    # when the page opens, and when its form is posted anyway
    page = client.get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    posted = client.post(f"/wizard/versions/{version.pk}/deploy/", {"name": "classifier", "runtime": "local"})
    # then the page says it before submit, with the create's own message, and the Deploy button is disabled
    message = "Deployment quota exceeded: team &#x27;acme&#x27; uses 0 of 0 deployments; this deployment needs 1"
    assert 'data-testid="deploy-refusal"' in page and message in page
    assert 'data-testid="deploy-submit" disabled' in page
    assert posted.status_code == 400 and message in posted.content.decode()
    assert not Deployment.objects.exists()


def test_the_deploy_check_partial_says_it_fits(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    # (its own copy of the model file and configuration, in the object store)
    stored = filesizeformat(version.source_size_bytes + 100)
    assert stored == filesizeformat(version.source_size_bytes)  # a configuration's few bytes do not show
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/deploy/check", {"name": "web", "runtime": "local", "instance_count": "2"}
    )
    html = response.content.decode()
    assert f"It fits: this deployment takes 1 deployment, 2 instances, {stored} of storage." in html
    one = _client(alice).post(
        f"/wizard/versions/{version.pk}/deploy/check", {"name": "web", "runtime": "local", "instance_count": "1"}
    )
    assert f"It fits: this deployment takes 1 deployment, 1 instance, {stored} of storage." in one.content.decode()


def test_the_deploy_check_partial_puts_every_refusal_next_to_its_field(alice, settings):
    # given a team with no room for another deployment and room for 2 model instances, on a machine without GPUs
    settings.CONCH_LOCAL_GPUS = "0"
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"deployments": 0, "instances": 2})
    # when the form is checked with a bad name and 3 instances
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/deploy/check", {"name": "Web!", "runtime": "local", "instance_count": "3"}
    )
    html = response.content.decode()
    # then all three refusals are listed, in the create's order
    assert response.status_code == 200
    assert "It would be refused, for 3 reasons (each one about a form field is also shown next to it):" in html
    items = html.split('data-testid="deploy-refusal" ')[1:]
    assert [item.split('data-field="')[1].split('"')[0] for item in items] == ["name", "deployments", "instances"]
    # and the name's and the instances' go out of band into their fields' slots; the other slots are emptied
    assert '<p id="deploy-error-name" class="field-error" data-testid="deploy-error-name" hx-swap-oob="true">' in html
    instances = (
        "Model instance quota exceeded: team &#x27;acme&#x27; uses 0 of 2 model instances; this deployment needs 3"
    )
    assert (
        '<p id="deploy-error-instance_count" class="field-error" data-testid="deploy-error-instance_count" '
        f'hx-swap-oob="true">{instances}</p>'
    ) in html
    assert (
        '<p id="deploy-error-cluster" class="field-error" data-testid="deploy-error-cluster" hx-swap-oob="true" hidden>'
        "</p>"
    ) in html
    # when GPU instances are asked for on this machine, the instance kind's slot says why not
    gpu = _client(alice).post(
        f"/wizard/versions/{version.pk}/deploy/check",
        {"name": "web", "runtime": "local", "instance_kind": "KIND_GPU"},
    )
    assert (
        'data-testid="deploy-error-instance_kind" hx-swap-oob="true">instance_kind KIND_GPU needs a GPU, and this '
        "machine (the local runtime&#x27;s worker host) has none"
    ) in gpu.content.decode()


def test_the_deploy_page_offers_cpu_instances_and_says_why_gpu_ones_are_not(alice, settings):
    # given a machine without GPUs
    settings.CONCH_LOCAL_GPUS = "0"
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    client = _client(alice)
    # when the deploy page opens
    page = client.get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    # then KIND_CPU can be chosen, KIND_GPU is disabled, and the help says why
    assert '<option value="KIND_CPU">KIND_CPU: model instances on the CPU</option>' in page
    assert '<option value="KIND_GPU" disabled>KIND_GPU: model instances on the GPU (unavailable)</option>' in page
    assert (
        "KIND_GPU is unavailable: this machine is set up without GPUs (CONCH_LOCAL_GPUS=0). Triton runs the model "
        "instances of the kind chosen (instance_group kind)."
    ) in page
    # when the machine has a GPU, KIND_GPU is offered
    settings.CONCH_LOCAL_GPUS = "1"
    page = client.get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    assert '<option value="KIND_GPU">KIND_GPU: model instances on the GPU</option>' in page
    # when it is deployed with KIND_CPU, its configuration runs CPU instances
    settings.CONCH_LOCAL_GPUS = "0"
    response = client.post(
        f"/wizard/versions/{version.pk}/deploy/",
        {"name": "web", "runtime": "local", "instance_count": "2", "instance_kind": "KIND_CPU"},
    )
    assert response.status_code == 302
    deployment = Deployment.objects.get(name="web")
    assert "count: 2" in deployment.config_pbtxt and "kind: KIND_CPU" in deployment.config_pbtxt
    # when a deployment asks for KIND_GPU on this machine, the page names the field
    refused = client.post(
        f"/wizard/versions/{version.pk}/deploy/", {"name": "web2", "runtime": "local", "instance_kind": "KIND_GPU"}
    )
    assert refused.status_code == 400
    assert 'data-testid="deploy-error" data-field="instance_kind"' in refused.content.decode()
    assert not Deployment.objects.filter(name="web2").exists()


def test_a_viewer_sees_no_deploy_button(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    viewer = make_caller("victor", "acme", role="viewer")
    page = _client(viewer).get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    assert 'data-testid="deploy-submit"' not in page
    assert "deploying needs the developer role" in page


def test_a_viewer_gets_a_403_page_naming_the_developer_role_on_the_wizards_model_and_upload_steps(alice):
    # given a viewer of alice's team, which has a model
    model = RegisteredModel.objects.create(team=alice.team, name="classifier")
    viewer = _client(make_caller("victor", "acme", role="viewer"))
    # when the viewer opens the wizard's first two steps (or posts the register form)
    pages = [
        viewer.get("/wizard/"),
        viewer.post("/wizard/", {"name": "mine"}),
        viewer.get(f"/wizard/models/{model.pk}/upload/"),
    ]
    # then each is a 403 page naming the role needed, with no register form or file picker
    for response in pages:
        html = response.content.decode()
        assert response.status_code == 403
        assert (
            "Uploading and deploying a model needs the developer role in team &#x27;acme&#x27;; you are a viewer."
            in html
        )
        assert 'data-testid="wizard-forbidden"' in html
        assert 'id="model-name"' not in html and 'data-testid="upload-file-input"' not in html
    assert not RegisteredModel.objects.filter(name="mine").exists()
    # and the overview has no start-wizard button for the viewer, but says why; a developer's has it
    overview = viewer.get("/").content.decode()
    assert 'data-testid="start-wizard"' not in overview
    assert "Uploading and deploying models needs the developer role in acme; you are a viewer." in overview
    assert 'data-testid="start-wizard"' in _client(alice).get("/").content.decode()


def test_the_status_partial_shows_pods_and_messages(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    deployment = Deployment.objects.create(
        team=alice.team,
        name="web",
        model_version=version,
        runtime="kubernetes",
        status="starting",
        status_message="ready 0/1; waiting for a GPU",
        observed={
            "replicas": {"desired": 1, "ready": 0},
            "pods": [
                {
                    "name": "web-abc",
                    "node": None,
                    "phase": "Pending",
                    "ready": False,
                    "restarts": 0,
                    "message": "0/3 nodes are available",
                }
            ],
        },
    )
    page = _client(alice).get(f"/wizard/deployments/{deployment.pk}/status/live").content.decode()
    assert 'data-status="starting"' in page and 'hx-trigger="every 1s"' in page
    assert "web-abc" in page and "0/3 nodes are available" in page and "waiting for a GPU" in page


def test_the_status_partial_follows_a_ready_deployment_until_every_pod_is_ready(alice):
    # given a kubernetes deployment that is ready with 1 of its 2 pods (the other starting)
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    pod = {"node": "gpu-a", "phase": "Running", "restarts": 0}
    deployment = Deployment.objects.create(
        team=alice.team,
        name="web",
        model_version=version,
        runtime="kubernetes",
        status="ready",
        status_message="ready 1/2; 1 more starting",
        observed={
            "replicas": {"desired": 2, "ready": 1},
            "pods": [
                {**pod, "name": "web-a", "ready": True, "message": ""},
                {**pod, "name": "web-b", "ready": False, "message": "Triton is starting and loading the model"},
            ],
        },
    )
    url = f"/wizard/deployments/{deployment.pk}/status/live"
    # then the status partial keeps polling, and offers the test inference already
    page = _client(alice).get(url).content.decode()
    assert "Pods ready: 1 of 2" in page and 'hx-trigger="every 1s"' in page and 'data-testid="wizard-next"' in page
    # when both pods are ready, it stops
    deployment.observed = {**deployment.observed, "replicas": {"desired": 2, "ready": 2}}
    deployment.save(update_fields=["observed"])
    page = _client(alice).get(url).content.decode()
    assert "Pods ready: 2 of 2" in page and "hx-trigger" not in page


def test_the_options_partial_shows_what_a_rebuild_would_change(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/build/check", {"dynamic_batching": "on", "max_batch_size": "16"}
    )
    page = response.content.decode()
    assert "A rebuild would change the configuration" in page
    assert "-max_batch_size: 8\n+max_batch_size: 16" in page


KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: lab
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
contexts:
- name: lab
  context: {cluster: lab, user: admin}
users:
- name: admin
  user: {token: not-a-real-token}
"""


def use_an_unreachable_cluster(settings) -> None:
    """S3 storage (only named: nothing here reaches it) and a registered cluster whose API does not answer."""
    from deployments.services.clusters import register_cluster

    settings.CONCH_STORAGE_URL = "s3://models/conch"
    settings.CONCH_S3_ENDPOINT_URL = "http://127.0.0.1:1"
    register_cluster(name="lab", namespace="conch", kubeconfig=KUBECONFIG)


def test_the_deploy_page_offers_a_cluster_and_says_when_it_does_not_answer(alice, settings):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    use_an_unreachable_cluster(settings)
    page = _client(alice).get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    assert '<option value="kubernetes">A Kubernetes cluster (Triton pods)</option>' in page
    assert '<option value="lab">lab (namespace conch)</option>' in page
    assert "GPUs on lab" in page and 'class="field-error"' in page


def test_kubernetes_choices_on_a_cluster_are_checked_by_the_create_s_rules(alice, settings):
    # given a built version and a cluster
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    use_an_unreachable_cluster(settings)
    client = _client(alice)
    url = f"/wizard/versions/{version.pk}/deploy/check"
    form = {"name": "web", "runtime": "kubernetes", "cluster": "lab", "scaling": "autoscaling"}
    # when autoscaling bounds are upside down
    bounds = client.post(url, {**form, "min_replicas": "3", "max_replicas": "2"}).content.decode()
    # then the field is named
    assert 'data-field="autoscaling.min_replicas"' in bounds
    # when the bounds are right but the team has no deployment left
    set_quota(team=alice.team, limits={"deployments": 0})
    refused = client.post(url, {**form, "min_replicas": "1", "max_replicas": "2"}).content.decode()
    posted = client.post(
        f"/wizard/versions/{version.pk}/deploy/", {**form, "min_replicas": "1", "max_replicas": "2"}
    ).content.decode()
    # then the check and the create say the same
    message = "Deployment quota exceeded: team &#x27;acme&#x27; uses 0 of 0 deployments; this deployment needs 1"
    assert message in refused and message in posted


def test_kubernetes_refusals_are_all_named_each_in_its_slot(alice, settings):
    # given a built version, a cluster, and a team with no deployment left
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    use_an_unreachable_cluster(settings)
    set_quota(team=alice.team, limits={"deployments": 0})
    # when the form asks for autoscaling bounds upside down and GPU instances in pods without GPUs
    form = {
        "name": "web",
        "runtime": "kubernetes",
        "cluster": "lab",
        "scaling": "autoscaling",
        "min_replicas": "3",
        "max_replicas": "2",
        "instance_kind": "KIND_GPU",
    }
    html = _client(alice).post(f"/wizard/versions/{version.pk}/deploy/check", form).content.decode()
    # then the three refusals are listed, and the first two go next to their fields (the kind in the cluster's)
    items = html.split('data-testid="deploy-refusal" ')[1:]
    assert [item.split('data-field="')[1].split('"')[0] for item in items] == [
        "autoscaling.min_replicas",
        "instance_kind",
        "deployments",
    ]
    assert (
        'data-testid="deploy-error-min_replicas" hx-swap-oob="true">autoscaling.min_replicas (3) must not exceed '
        "autoscaling.max_replicas (2).</p>"
    ) in html
    assert (
        'data-testid="deploy-error-kubernetes_instance_kind" hx-swap-oob="true">instance_kind KIND_GPU needs GPUs in '
        "the pod"
    ) in html
    assert 'data-testid="deploy-error-instance_kind" hx-swap-oob="true" hidden></p>' in html


def test_the_build_partial_shows_steps_live_and_reloads_the_page_once_built(alice):
    from builds.models import BuildStep

    # given a version being built, its inspect step done
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    version.status = "building"
    version.save()
    build = current_build(version)
    BuildStep.objects.create(
        build=build, name="inspect", position=0, status="succeeded", log=["12:00:00 input x: FP32 [-1, 3]"]
    )
    BuildStep.objects.create(build=build, name="configure", position=1, status="running")
    url = f"/wizard/versions/{version.pk}/build/status"
    client = _client(alice)
    # when the page polls
    live = client.get(f"{url}?was=building")
    # then it shows the steps with their log lines, and polls again
    page = live.content.decode()
    assert 'data-status="building"' in page and 'hx-trigger="every 1s"' in page
    assert "12:00:00 input x: FP32 [-1, 3]" in page and "status-running" in page
    assert "HX-Refresh" not in live
    # when the build has finished
    version.status = "built"
    version.save()
    done = client.get(f"{url}?was=building")
    # then the whole page reloads (to show the signature, configuration and options) and polling stops
    assert done["HX-Refresh"] == "true"
    assert 'hx-trigger="every 1s"' not in done.content.decode()


def test_a_refused_rebuild_lists_every_bad_option_without_repeating_the_field_name(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    response = _client(alice).post(
        f"/wizard/versions/{version.pk}/build/",
        {
            "dynamic_batching": "on",
            "max_batch_size": "abc",
            "preferred_batch_size": "4, 99",
            "instance_count": "-1",
        },
    )
    page = response.content.decode()
    assert response.status_code == 400
    for field in ("max_batch_size", "preferred_batch_size", "instance_count"):
        assert f'data-field="{field}"' in page, field
    # a sentence that begins with its field is not prefixed with it again
    assert "max_batch_size</strong>: max_batch_size" not in page and "max_batch_size: max_batch_size" not in page
    assert "max_batch_size must be" in page


def test_a_test_inference_in_image_mode_without_an_image_names_the_input(alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    deployment = Deployment.objects.create(
        team=alice.team, name="web", model_version=version, status="ready", config_pbtxt=latest_config_pbtxt(version)
    )
    name = version.signature["inputs"][0]["name"]
    response = _client(alice).post(f"/wizard/deployments/{deployment.pk}/test/", {"mode": "image"})
    page = response.content.decode()
    assert 'data-field="image"' in page
    assert f"Choose an image for input &#x27;{name}&#x27;." in page and "values but shape" not in page


def test_a_viewer_sees_the_test_form_without_its_send_button(alice):
    # given a ready deployment and a viewer of its team
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    deployment = Deployment.objects.create(
        team=alice.team, name="web", model_version=version, status="ready", config_pbtxt=latest_config_pbtxt(version)
    )
    viewer = _client(make_caller("victor", "acme", role="viewer"))
    # when the viewer opens the test step, and a developer does
    page = viewer.get(f"/wizard/deployments/{deployment.pk}/test/").content.decode()
    developer_page = _client(alice).get(f"/wizard/deployments/{deployment.pk}/test/").content.decode()
    # then the viewer sees the inputs but no Send, and is told why before trying; the developer has Send
    assert 'data-testid="infer-input"' in page or 'data-testid="infer-json"' in page
    assert 'data-testid="infer-submit"' not in page
    assert "Your role in team" in page and "is viewer: sending a test inference needs the developer role" in page
    assert 'data-testid="infer-submit"' in developer_page


def test_a_failed_build_says_what_to_do_next_with_links(alice):
    # given a version whose build failed
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    fail_current_build(version, "The file starts like an ONNX model but is damaged.")
    # when its build step is opened
    page = _client(alice).get(f"/wizard/versions/{version.pk}/build/").content.decode()
    # then the page offers the way on: rebuild with other options, upload a fixed file, delete this version
    assert 'data-testid="build-failed-actions"' in page
    assert "change the options under" in page
    assert f'href="/wizard/models/{version.model_id}/upload/"' in page
    assert f'href="/models/{version.model_id}/"' in page


def test_the_options_form_shows_the_values_the_built_configuration_has(alice):
    # given a version built with the model's default largest batch (8) and a dynamic batcher
    version = write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
    Build.objects.filter(version=version).update(options={})
    # when its build step is opened
    page = _client(alice).get(f"/wizard/versions/{version.pk}/build/").content.decode()
    # then each option left to the model's default says the value the configuration has
    assert "As built: 8 (the model's default; empty keeps it)" in page
    assert "max_batch_size: 8" in page


def test_the_deploy_page_s_quota_names_the_team_and_shows_its_storage_in_bytes_units(alice):
    # given a team with a storage limit of 2 GiB
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    set_quota(team=alice.team, limits={"storage_bytes": 2 * 1024**3})
    # when the deploy step opens
    page = _client(alice).get(f"/wizard/versions/{version.pk}/deploy/").content.decode()
    # then the quota is headed with the team's name and lists storage in readable units
    assert f"Quota of team {alice.team.name}</h2>" in page
    row = page.split('data-testid="quota-storage"')[1].split("</tr>")[0]
    assert "<td>Storage</td>" in row and "2.0\xa0GB" in row

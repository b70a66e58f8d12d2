"""Console views through Django's test client: scoping, methods, role checks, errors with their status, the token
secret shown once, the download; and the pure presenters."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.test import Client

from builds.model_config import BuildOptions
from builds.services import latest_config_pbtxt
from console import presenters
from deployments.models import Deployment
from tenancy.models import ApiToken
from tests import real_models
from tests.deployments.conftest import write_built_version
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.tiny_models import add_constant

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(alice) -> Client:
    client = Client()
    client.force_login(alice.user)
    return client


@pytest.fixture
def adder(alice, tmp_path):
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions())
    deployment = Deployment.objects.create(
        team=alice.team, name="adder", model_version=version, status="ready", config_pbtxt=latest_config_pbtxt(version)
    )
    return version, deployment


def test_pages_need_a_session(client):
    for url in ("/", "/models/", "/deployments/", "/teams/acme/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_the_overview_shows_the_current_teams_deployments_builds_and_quota(session, adder):
    html = session.get("/").content.decode()
    assert 'data-testid="start-wizard"' in html and 'href="/wizard/"' in html
    assert f'href="/deployments/{adder[1].pk}/"' in html
    assert f'data-sparkline="{adder[1].pk}"' in html
    assert "Recent builds" in html and "adder" in html
    assert 'id="quota-deployments"' in html and "1 of 10 deployments" in html


def test_the_overview_lists_stopped_deployments_after_the_others(session, alice, adder):
    version, ready = adder
    # given two deployments stopped after the ready one was made (newer)
    stopped = [
        Deployment.objects.create(
            team=alice.team,
            name=name,
            model_version=version,
            status="stopped",
            config_pbtxt=latest_config_pbtxt(version),
        )
        for name in ("old-a", "old-b")
    ]
    html = session.get("/").content.decode()
    # then the ready one comes first, the stopped ones after it, newest first
    places = [html.index(f'href="/deployments/{d.pk}/"') for d in (ready, stopped[1], stopped[0])]
    assert places == sorted(places)


def test_switching_team_changes_the_overview_and_refuses_a_team_not_ones_own(session, alice):
    other = TeamFactory(slug="initech", name="Initech")
    MembershipFactory(user=alice.user, team=other, role="viewer")
    TeamFactory(slug="hooli", name="Hooli")
    assert session.post("/switch-team/", {"team": "initech", "next": "/models/"})["Location"] == "/models/"
    assert "<h1>Initech</h1>" in session.get("/").content.decode()
    # a team she is not in is 404, and an outside `next` goes home
    assert session.post("/switch-team/", {"team": "hooli"}).status_code == 404
    assert session.post("/switch-team/", {"team": "acme", "next": "https://evil.example/"})["Location"] == "/"


def test_another_teams_objects_are_404_for_every_method(bob, adder):
    version, deployment = adder
    client = Client()
    client.force_login(bob.user)
    urls = [
        f"/models/{version.model_id}/",
        f"/models/{version.model_id}/versions/{version.pk}/download/",
        f"/models/{version.model_id}/versions/{version.pk}/delete/",
        f"/deployments/{deployment.pk}/",
        f"/deployments/{deployment.pk}/stop/",
        "/teams/acme/",
        "/teams/acme/tokens/",
    ]
    for url in urls:
        for method in ("get", "post"):
            assert getattr(client, method)(url).status_code == 404, (method, url)
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"


def test_a_page_answers_405_to_a_wrong_method_of_its_owner(session, adder):
    version, deployment = adder
    assert session.post(f"/deployments/{deployment.pk}/").status_code == 405
    assert session.get(f"/deployments/{deployment.pk}/stop/").status_code == 405
    assert session.get(f"/models/{version.model_id}/versions/{version.pk}/delete/").status_code == 405


def test_a_viewer_gets_no_controls_and_a_403_naming_the_role_when_posting(alice, adder):
    _, deployment = adder
    viewer = UserFactory(username="vera")
    MembershipFactory(user=viewer, team=alice.team, role="viewer")
    client = Client()
    client.force_login(viewer)
    assert 'data-testid="deployment-actions"' not in client.get(f"/deployments/{deployment.pk}/").content.decode()
    response = client.post(f"/deployments/{deployment.pk}/stop/")
    assert response.status_code == 403
    assert "needs the developer role" in response.content.decode()
    assert 'data-testid="confirm"' not in response.content.decode()
    response = client.post(f"/deployments/{deployment.pk}/stop/", {"confirm": "yes"})
    assert response.status_code == 403
    assert "needs the developer role" in response.content.decode()
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"


def test_stopping_asks_first_naming_the_deployment_and_stops_only_once_confirmed(session, adder):
    _, deployment = adder
    # when the Stop button's form is posted (no confirmation field)
    response = session.post(f"/deployments/{deployment.pk}/stop/")
    # then a confirmation page names the deployment and posts back to the same URL with confirm=yes
    html = response.content.decode()
    assert response.status_code == 200
    assert "Stop deployment “adder” of team acme (model adder version 1, on this machine, now ready)?" in html
    assert f'action="/deployments/{deployment.pk}/stop/"' in html
    assert 'name="confirm" value="yes"' in html
    assert f'href="/deployments/{deployment.pk}/" data-testid="confirm-cancel"' in html
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"
    # and a wrong confirmation value asks again
    assert session.post(f"/deployments/{deployment.pk}/stop/", {"confirm": "y"}).status_code == 200
    deployment.refresh_from_db()
    assert deployment.desired_state == "running"
    # when confirmed, it stops
    response = session.post(f"/deployments/{deployment.pk}/stop/", {"confirm": "yes"})
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.desired_state == "stopped"


def test_revoking_a_token_asks_first_naming_the_token(session, alice):
    from tenancy.models import ApiToken

    token = ApiToken.objects.get(user=alice.user, team=alice.team)
    response = session.post(f"/teams/acme/tokens/{token.pk}/revoke/")
    html = response.content.decode()
    assert response.status_code == 200
    label = f"“{token.name}” ({token.prefix}…)" if token.name else f"{token.prefix}…"
    assert f"Revoke token {label} of alice in team acme, scopes {', '.join(token.scopes) or 'all'}?" in html
    assert 'href="/teams/acme/" data-testid="confirm-cancel"' in html
    token.refresh_from_db()
    assert not token.is_revoked
    assert session.post(f"/teams/acme/tokens/{token.pk}/revoke/", {"confirm": "yes"}).status_code == 302
    token.refresh_from_db()
    assert token.is_revoked


def test_scaling_a_local_deployment_is_400_naming_the_field(session, adder):
    response = session.post(f"/deployments/{adder[1].pk}/scale/", {"replicas": "3"})
    assert response.status_code == 400
    assert "replicas applies to kubernetes deployments" in response.content.decode()
    response = session.post(f"/deployments/{adder[1].pk}/scale/", {"replicas": "many"})
    assert response.status_code == 400
    assert "replicas: give a whole number" in response.content.decode()


def test_deleting_a_used_version_is_409_naming_the_deployment_and_an_unused_one_goes(session, alice, adder, tmp_path):
    version, deployment = adder
    response = session.post(f"/models/{version.model_id}/versions/{version.pk}/delete/", {"confirm": "yes"})
    assert response.status_code == 409
    html = response.content.decode()
    assert "used by 1 deployment not stopped: &#x27;adder&#x27;. On its deployment&#x27;s page, press" in html
    assert "DELETE /api/v1/deployments" not in html
    spare = write_built_version(alice.team, "adder", add_constant(tmp_path / "v2.onnx", 2.0), BuildOptions())
    response = session.post(f"/models/{version.model_id}/versions/{spare.pk}/delete/", {"confirm": "yes"})
    assert response.status_code == 302
    assert not type(spare).objects.filter(pk=spare.pk).exists()


def test_deleting_a_version_asks_first_naming_it_and_a_viewer_is_refused_at_once(session, alice, tmp_path):
    # given an unused built version
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions())
    url = f"/models/{version.model_id}/versions/{version.pk}/delete/"
    # when the model page's Delete button posts (no confirmation field)
    response = session.post(url)
    # then the confirmation page names the version, and nothing is deleted
    html = response.content.decode()
    assert response.status_code == 200
    assert "Delete version 1 of model “adder” in team acme (now built, " in html
    assert f'href="/models/{version.model_id}/" data-testid="confirm-cancel"' in html
    assert '<input type="hidden" name="confirm" value="yes">' in html
    assert type(version).objects.filter(pk=version.pk, status="built").exists()
    # and a viewer gets the 403 naming the role, not the confirmation page
    viewer = UserFactory(username="vic")
    MembershipFactory(user=viewer, team=alice.team, role="viewer")
    client = Client()
    client.force_login(viewer)
    refused = client.post(url)
    assert refused.status_code == 403
    assert "Deleting a model version needs the developer role in team &#x27;acme&#x27;" in refused.content.decode()
    # when confirmed, it goes
    assert session.post(url, {"confirm": "yes"}).status_code == 302
    assert not type(version).objects.filter(pk=version.pk).exists()


def test_download_streams_the_uploaded_file(session, alice):
    version = write_built_version(alice.team, "classifier", real_models.classifier())
    response = session.get(f"/models/{version.model_id}/versions/{version.pk}/download/")
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("attachment;")
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(real_models.classifier().read_bytes()).hexdigest()


def test_a_token_secret_is_shown_once_and_bad_input_names_the_field(session, alice):
    response = session.post("/teams/acme/tokens/", {"name": "ci", "scopes": ["infer"]})
    assert response.status_code == 302
    first = session.get("/teams/acme/").content.decode()
    assert 'data-testid="new-token-secret">conch_' in first
    assert 'data-testid="new-token-secret"' not in session.get("/teams/acme/").content.decode()
    response = session.post("/teams/acme/tokens/", {"name": "ci", "scopes": ["root"]})
    assert response.status_code == 400 and "root" in response.content.decode()
    response = session.post("/teams/acme/tokens/", {"name": "ci", "expires_in_days": "soon"})
    assert response.status_code == 400 and "expires_in_days: give a whole number" in response.content.decode()


def test_a_viewer_is_offered_only_the_read_scope_and_gets_a_read_token(alice):
    # given a viewer of acme signed in to the console
    vera = UserFactory(username="vera")
    MembershipFactory(user=vera, team=alice.team, role="viewer")
    viewer = Client()
    viewer.force_login(vera)
    # when the team page is shown, then its token form offers read alone
    page = viewer.get("/teams/acme/").content.decode()
    assert re.findall(r'name="scopes" value="([^"]+)"', page) == ["read"]
    # and a token made with no scope ticked can only read
    assert viewer.post("/teams/acme/tokens/", {"name": "dash"}).status_code == 302
    assert ApiToken.objects.get(user=vera, name="dash").scopes == ["read"]
    # while a developer is offered every scope
    developer_page = Client()
    developer_page.force_login(alice.user)
    offered = re.findall(r'name="scopes" value="([^"]+)"', developer_page.get("/teams/acme/").content.decode())
    assert offered == ["read", "models:write", "deployments:write", "infer"]


def test_only_a_team_admin_edits_roles(session, alice):
    bob = UserFactory(username="bobby")
    MembershipFactory(user=bob, team=alice.team, role="developer")
    response = session.post("/teams/acme/members/bobby/role/", {"role": "viewer"})
    assert response.status_code == 403 and "needs the admin role" in response.content.decode()
    alice.user.memberships.filter(team=alice.team).update(role="admin")
    assert session.post("/teams/acme/members/bobby/role/", {"role": "viewer"}).status_code == 302
    assert bob.memberships.get().role == "viewer"
    response = session.post("/teams/acme/members/bobby/role/", {"role": "owner"})
    assert response.status_code == 400


#: A symbolic axis name as exporters write a formula: 400 characters.
FORMULA = "((" + " + ".join(f"floor((sequence_length_{i} - 1) / 2)" for i in range(12)) + "))"


def test_a_long_symbolic_axis_name_is_shortened_in_the_signatures_and_the_build_log_whole_on_hover(alice, tmp_path):
    from builds.verify_step import axis_names_text

    assert len(FORMULA) > 400
    short = f"{FORMULA[:20]}…{FORMULA[-8:]} [{len(FORMULA)} chars]"
    # given a built version whose input and output have that name on axis 1
    version = write_built_version(alice.team, "formula", add_constant(tmp_path / "f.onnx", 1.0), BuildOptions())
    for kind in ("inputs", "outputs"):
        (tensor,) = version.signature[kind]
        tensor.update(dims=[-1, -1], dim_names=["batch", FORMULA])
    version.save(update_fields=["signature"])
    session = Client()
    session.force_login(alice.user)
    # when the model page and the wizard's build page show its signature
    for url in (f"/models/{version.model_id}/", f"/wizard/versions/{version.pk}/build/"):
        page = session.get(url).content.decode()
        # then the name is shown short, and whole only in the title the pointer shows
        assert page.count(FORMULA) == 2, url  # one title per tensor
        assert len(re.findall(rf'title="[^"]*{re.escape(FORMULA)}[^"]*">[^<]*{re.escape(short)}', page)) == 2, url
    # and the build log's line for it is short too
    assert axis_names_text(("batch", FORMULA)) == f" axes [batch, {short}]"
    assert axis_names_text(("batch", "sequence")) == " axes [batch, sequence]"


def test_signature_rows_mark_the_batch_axis_and_dynamic_axes():
    signature = {
        "inputs": [{"name": "ids", "datatype": "INT64", "dims": [-1, -1], "dim_names": ["batch", "sequence"]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 384], "dim_names": [None, None]}],
    }
    rows = presenters.signature_rows(signature, batching=True)
    assert rows["inputs"][0].axes == ("? (batch)", "? (sequence)") and rows["inputs"][0].batch_axis
    assert rows["inputs"][0].example_shape == [1, 1]
    assert rows["outputs"][0].example_shape == [1, 384]
    assert not presenters.signature_rows(signature, batching=False)["inputs"][0].batch_axis
    assert presenters.signature_rows(None, batching=True) == {"inputs": [], "outputs": []}


def test_a_tensor_with_only_the_batch_axis_is_shown_and_sent_as_triton_serves_it():
    # given a tree classifier's signature: input [N, 4], output label [N]
    signature = {
        "inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 4], "dim_names": ["N", None]}],
        "outputs": [{"name": "label", "datatype": "INT64", "dims": [-1], "dim_names": ["N"]}],
    }
    # when
    batched = presenters.signature_rows(signature, batching=True)
    flat = presenters.signature_rows(
        {"inputs": [{"name": "sr", "datatype": "INT64", "dims": []}], "outputs": []}, batching=False
    )
    # then the label is [batch, 1], the axis marked as Triton's; the input keeps its own shape
    (label,) = batched["outputs"]
    assert label.axes == ("? (N)", "1") and label.added_axis and label.example_shape == [1, 1]
    assert not batched["inputs"][0].added_axis and batched["inputs"][0].axes == ("? (N)", "4")
    # and a scalar input of a model that does not batch is sent as [1]
    assert flat["inputs"][0].axes == ("1",) and flat["inputs"][0].example_shape == [1]


def test_snippets_use_the_gateway_and_a_token_placeholder():
    [row] = presenters.signature_rows(
        {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}], "outputs": []}, batching=True
    )["inputs"]
    curl = presenters.curl_snippet(gateway_url="http://gw:8001/serve/acme/web", model_name="adder", inputs=[row])
    assert "$CONCH_TOKEN" in curl and "http://gw:8001/serve/acme/web/v2/models/adder/infer" in curl
    assert '"shape": [1, 4], "datatype": "FP32"' in curl
    python = presenters.tritonclient_snippet(
        gateway_url="http://gw:8001/serve/acme/web", model_name="adder", inputs=[row], outputs=[]
    )
    assert 'InferenceServerClient(url="gw:8001/serve/acme/web")' in python
    assert "np.zeros([1, 4], dtype=np.float32)" in python
    compile(python, "snippet", "exec")


def test_scaling_a_kubernetes_deployment_sets_its_replicas_and_lists_its_pods(session, alice, adder):
    from deployments.models import Cluster

    # given a kubernetes deployment with a pod observed
    version, _ = adder
    cluster = Cluster.objects.create(name="gpu-east", namespace="conch", in_cluster=True)
    pod = {"name": "adder-7d9-x", "node": "n1", "phase": "Running", "ready": True, "restarts": 0, "message": ""}
    deployment = Deployment.objects.create(
        team=alice.team,
        name="adder-k8s",
        model_version=version,
        runtime="kubernetes",
        cluster=cluster,
        replicas=1,
        status="ready",
        observed={"pods": [pod], "replicas": {"desired": 1, "ready": 1}},
        config_pbtxt=latest_config_pbtxt(version),
    )
    html = session.get(f"/deployments/{deployment.pk}/").content.decode()
    assert 'id="scale-replicas"' in html and "<code>adder-7d9-x</code>" in html
    assert "<code>adder-7d9-x</code>" in session.get(f"/deployments/{deployment.pk}/live/").content.decode()
    # when alice scales it to 3
    response = session.post(f"/deployments/{deployment.pk}/scale/", {"replicas": "3"})
    # then the deployment wants 3 pods
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.replicas == 3


def test_a_team_admin_removes_a_member_but_not_the_last_admin(session, alice):
    bob = UserFactory(username="bobby")
    MembershipFactory(user=bob, team=alice.team, role="developer")
    alice.user.memberships.filter(team=alice.team).update(role="admin")
    # the first POST (the team page's Remove button) only asks, naming the member
    asked = session.post("/teams/acme/members/bobby/remove/")
    assert asked.status_code == 200
    assert 'data-testid="confirm-question"><b>Remove bobby from team acme?</b>' in asked.content.decode()
    assert bob.memberships.exists()
    assert session.post("/teams/acme/members/bobby/remove/", {"confirm": "yes"}).status_code == 302
    assert not bob.memberships.exists()
    response = session.post("/teams/acme/members/alice/remove/", {"confirm": "yes"})
    assert response.status_code == 409
    assert alice.user.memberships.filter(team=alice.team).exists()


def test_the_deployments_list_shows_only_the_current_teams_deployments(session, alice, adder):
    other = TeamFactory(slug="initech", name="Initech")
    MembershipFactory(user=alice.user, team=other, role="developer")
    theirs = Deployment.objects.create(
        team=other, name="elsewhere", model_version=adder[0], status="ready", config_pbtxt=latest_config_pbtxt(adder[0])
    )
    html = session.get("/deployments/").content.decode()
    assert f'href="/deployments/{adder[1].pk}/"' in html and f'href="/deployments/{theirs.pk}/"' not in html
    session.post("/switch-team/", {"team": "initech"})
    html = session.get("/deployments/").content.decode()
    assert f'href="/deployments/{theirs.pk}/"' in html and f'href="/deployments/{adder[1].pk}/"' not in html


def test_the_team_page_says_a_or_an_before_the_role_and_is_titled_with_the_team_name(session, alice):
    html = session.get("/teams/acme/").content.decode()
    assert "You are a <b>developer</b> of" in html
    assert f"<h1>{alice.team.name}</h1>" in html and "<h1>Team " not in html
    alice.team.memberships.filter(user=alice.user).update(role="admin")
    assert "You are an <b>admin</b> of" in session.get("/teams/acme/").content.decode()


def test_quota_amounts_read_in_singular_and_plural():
    from console.templatetags.console_tags import quota_amount

    assert quota_amount(1, "deployments") == "1 deployment"
    assert quota_amount(2, "instances") == "2 instances"
    assert quota_amount(1, "gpu") == "1 GPU" and quota_amount(0, "gpu") == "0 GPUs"
    # a deployment's GPU request is {resource name: count}, as gpu_request gives it
    assert quota_amount({"nvidia.com/gpu": 2}, "gpu") == "2 GPUs (nvidia.com/gpu)"
    assert quota_amount({"nvidia.com/mig-1g.10gb": 1}, "gpu") == "1 MIG slice (nvidia.com/mig-1g.10gb)"
    assert quota_amount({}, "gpu") == "no GPU"
    assert quota_amount(6_800_000, "storage_bytes") == "6.5\xa0MB of storage"


def test_adding_a_member_already_in_the_team_says_to_change_the_role_in_the_console(session, alice):
    bob = UserFactory(username="bob")
    MembershipFactory(user=bob, team=alice.team, role="developer")
    alice.user.memberships.filter(team=alice.team).update(role="admin")
    response = session.post("/teams/acme/members/", {"username": "bob", "role": "viewer"})
    assert response.status_code == 409
    html = response.content.decode()
    assert "&#x27;bob&#x27; is already a member of team &#x27;acme&#x27;; change their role in the" in html
    assert "PATCH" not in html and "/api/v1/teams/acme/members/bob/" not in html


def test_a_stopped_deployment_s_timeline_does_not_say_ready_since(session, adder):
    _, deployment = adder
    deployment.ready_at = deployment.created_at
    deployment.save(update_fields=["ready_at"])
    assert "Ready since" in session.get(f"/deployments/{deployment.pk}/live/").content.decode()
    deployment.status = "stopped"
    deployment.save(update_fields=["status"])
    html = session.get(f"/deployments/{deployment.pk}/live/").content.decode()
    assert "Ready since" not in html
    assert "Was ready from <time" in html and "now <b>stopped</b>." in html

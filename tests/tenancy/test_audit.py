"""The audit log: every mutation records who (user and token prefix, or system), team, action, object, a
before/after summary, client IP and time; team admins read their team's entries, staff all of them; nothing
changes or deletes an entry, the database included."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from deployments import services as deployments
from deployments.models import Deployment
from deployments.services.requests import DeploymentRequest, PlacementRequest
from deployments.tasks import reconcile_deployments
from tenancy.audit import audit_context, client_ip, record_audit
from tenancy.choices import AuditAction, AuditSource
from tenancy.models import ApiToken, AuditEntry, Team
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.factories import MembershipFactory, TeamFactory, UserFactory
from tests.tiny_models import add_constant, onnx_like

pytestmark = pytest.mark.django_db


def _entries(**filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


@pytest.fixture
def acme_admin(db):
    """An admin of team acme with a token of every scope."""
    return make_caller("ada", "acme", role="admin")


@pytest.fixture
def owen(db):
    """A developer of team acme with a token of every scope."""
    return make_caller("owen", "acme")


@pytest.fixture
def pending_web(owen, tmp_path):
    """A pending local deployment `web` of team acme (nothing started), created by owen."""
    version = write_built_version(owen.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0))
    return deployments.create_deployment(
        user=owen.user,
        request=DeploymentRequest(
            team_slug="acme", name="web", model_version_id=version.pk, placement=PlacementRequest(runtime="local")
        ),
    )


# --- what is recorded ----------------------------------------------------------------


def test_an_api_call_with_a_token_records_user_token_prefix_team_object_and_ip(alice):
    # given alice, a developer of acme, calling with her token from 203.0.113.7
    prefix = ApiToken.objects.get(user=alice.user).prefix
    before = timezone.now()
    # when she registers a model
    response = alice.client.post(
        "/api/v1/models/", {"team": "acme", "name": "resnet"}, format="json", REMOTE_ADDR="203.0.113.7"
    )
    # then one entry says who, with which token, from where, to what
    assert response.status_code == 201, response.json()
    [entry] = _entries(action="model.created")
    assert entry.user == alice.user
    assert (entry.actor, entry.token_prefix, entry.team, entry.team_slug) == ("alice", prefix, alice.team, "acme")
    assert (entry.source, entry.source_detail, entry.ip) == ("api", "POST /api/v1/models/", "203.0.113.7")
    assert (entry.object_type, entry.object_id, entry.object_repr) == (
        "model",
        str(response.json()["id"]),
        "acme/resnet",
    )
    assert before <= entry.created_at <= timezone.now()


def test_an_api_call_with_a_session_records_the_user_and_no_token(db):
    # given bob, signed in to the console (a session, no token)
    bob = UserFactory(username="bob")
    MembershipFactory(user=bob, team=TeamFactory(slug="globex"))
    client = APIClient()
    client.force_login(bob)
    # when he creates an API token for CI, limited to reading
    response = client.post("/api/v1/tokens/", {"team": "globex", "name": "ci", "scopes": ["read"]}, format="json")
    # then the entry names bob without a token prefix, and the created token as the object
    assert response.status_code == 201, response.json()
    [entry] = _entries(action="token.created")
    assert (entry.actor, entry.user, entry.token_prefix, entry.team_slug) == ("bob", bob, "", "globex")
    assert (entry.source, entry.ip) == ("api", "127.0.0.1")
    created = response.json()
    assert (entry.object_type, entry.object_id) == ("token", str(created["id"]))
    assert entry.object_repr == f"{created['prefix']}… (bob)"
    assert entry.after == {
        "name": "ci",
        "scopes": ["read"],
        "deployments": [],
        "expires_at": ApiToken.objects.get(pk=created["id"]).expires_at.isoformat(),
    }


def test_revoking_a_token_through_the_api_records_it(alice):
    # given a second token of alice
    first = ApiToken.objects.get(user=alice.user)
    victim = create_api_token(user=alice.user, team=alice.team, name="old").token
    # when alice revokes it with her first token
    response = alice.client.delete(f"/api/v1/tokens/{victim.pk}/")
    # then
    assert response.status_code == 204
    [entry] = _entries(action="token.revoked")
    assert (entry.actor, entry.token_prefix, entry.object_id) == ("alice", first.prefix, str(victim.pk))
    assert (entry.team_slug, entry.object_repr) == ("acme", f"{victim.prefix}… (alice)")
    assert (entry.before, entry.after) == ({"is_revoked": False}, {})


def test_a_management_command_records_system_and_its_name_with_before_and_after(db):
    # given team acme with no limits set
    TeamFactory(slug="acme")
    # when staff set its GPU and deployment limits from the shell
    call_command("set_quota", "acme", "--gpus", "4", "--deployments", "2", stdout=io.StringIO())
    # then
    [entry] = _entries(action="quota.changed")
    assert (entry.actor, entry.user, entry.token_prefix, entry.ip) == ("system", None, "", None)
    assert (entry.source, entry.source_detail, entry.team_slug) == ("command", "set_quota", "acme")
    assert entry.before == {"gpu": None, "deployments": None}
    assert entry.after == {"gpu": 4, "deployments": 2}


def test_create_team_command_records_the_team_and_each_membership_once(db):
    # given a user
    UserFactory(username="carol")
    # when the team is created with carol as admin, then the same command runs again
    call_command("create_team", "vision", "--admin", "carol", stdout=io.StringIO())
    call_command("create_team", "vision", "--admin", "carol", stdout=io.StringIO())
    # then the team's creation and carol's role are each recorded once (the second run changed nothing)
    entries = _entries(team_slug="vision")
    assert [(e.action, e.source_detail, e.before, e.after) for e in entries] == [
        ("team.created", "create_team", {}, {"name": "vision"}),
        ("membership.changed", "create_team", {"role": None}, {"role": "admin"}),
    ]


def test_a_reconcile_task_that_finds_triton_gone_records_failed_and_restarted_as_system(
    pending_web, django_capture_on_commit_callbacks
):
    # given a ready deployment whose Triton process has exited (a pid that runs nothing)
    Deployment.objects.filter(pk=pending_web.pk).update(
        status="ready", runtime_state={"pid": 999_999_999, "create_time": 1.0}
    )
    # when beat's reconcile task runs (its start task is queued, not run)
    with django_capture_on_commit_callbacks(execute=False):
        counts = reconcile_deployments.apply().get()
    # then the deployment failed, a restart was queued, and both are recorded as the task's
    assert counts["failed"] == 1
    assert Deployment.objects.get(pk=pending_web.pk).restart_count == 1
    entries = _entries(object_type="deployment", object_id=str(pending_web.pk), source="task")
    assert [(e.action, e.actor, e.source_detail, e.team_slug) for e in entries] == [
        ("deployment.failed", "system", "deployments.reconcile_deployments", "acme"),
        ("deployment.restarted", "system", "deployments.reconcile_deployments", "acme"),
    ]
    assert entries[0].before == {"status": "ready"}
    assert entries[0].after == {
        "status": "failed",
        "message": "Triton exited unexpectedly; its exit status was not recorded.",
        "permanent": False,
    }
    assert entries[1].after == {"restart_count": 1, "waited_s": 0.0}


def test_an_upload_and_its_build_in_the_worker_record_who_queued_it_and_that_it_failed(
    alice, eager_tasks, django_capture_on_commit_callbacks
):
    # given a model of acme
    model = alice.client.post("/api/v1/models/", {"team": "acme", "name": "broken"}, format="json").json()
    # when alice uploads a file that is no ONNX model, and the build task runs it
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(
            f"/api/v1/models/{model['id']}/versions/",
            {"file": SimpleUploadedFile("model.onnx", onnx_like(b"not really onnx"))},
            format="multipart",
        )
    # then her upload is recorded, then the build's start and failure as the task's
    assert response.status_code == 201, response.json()
    version = response.json()
    entries = _entries(object_type="version", object_id=str(version["id"]))
    assert [(e.action, e.actor, e.source, e.source_detail) for e in entries] == [
        ("version.created", "alice", "api", f"POST /api/v1/models/{model['id']}/versions/"),
        ("version.uploaded", "alice", "api", f"POST /api/v1/models/{model['id']}/versions/"),
        ("build.started", "system", "task", "builds.build_version"),
        ("build.failed", "system", "task", "builds.build_version"),
    ]
    assert entries[1].after["size_bytes"] == len(b"not really onnx")
    assert entries[1].after["filename"] == "model.onnx"
    assert (entries[3].before, entries[3].after["status"]) == ({"status": "building"}, "failed")
    assert entries[3].after["error"] != ""


def test_api_changes_of_a_deployment_record_create_and_stop(alice, tmp_path):
    # given a built version of acme
    version = write_built_version(alice.team, "adder", add_constant(tmp_path / "adder.onnx", 1.0))
    body = {"team": "acme", "name": "web", "model_version": version.pk, "runtime": "local"}
    # when alice creates a deployment (its start is queued, not run) and stops it
    created = alice.client.post("/api/v1/deployments/", body, format="json")
    stopped = alice.client.delete(f"/api/v1/deployments/{created.json()['id']}/")
    # then both are recorded with her token
    assert (created.status_code, stopped.status_code) == (201, 202)
    entries = _entries(object_type="deployment")
    assert [(e.action, e.actor, e.source) for e in entries] == [
        ("deployment.created", "alice", "api"),
        ("deployment.stop_requested", "alice", "api"),
    ]
    assert entries[0].after["model_version"] == version.pk
    assert (entries[1].before, entries[1].after) == ({"status": "pending"}, {"status": "stopping"})


def test_a_failed_change_leaves_no_entry(alice, settings):
    # given acme may hold no model at all
    settings.CONCH_QUOTA_MODELS = 0
    # when alice tries to register one
    response = alice.client.post("/api/v1/models/", {"team": "acme", "name": "resnet"}, format="json")
    # then it is refused and nothing is recorded (the entry is written in the refused transaction)
    assert response.status_code == 409
    assert _entries(action="model.created") == []


def test_an_admin_add_and_a_bulk_delete_are_recorded_with_the_staff_user(db):
    # given a staff user signed in to the admin, and two empty teams
    staff = UserFactory(username="root", is_staff=True, is_superuser=True)
    ids = sorted(TeamFactory(slug=slug).pk for slug in ("old-one", "old-two"))
    client = APIClient()
    client.force_login(staff)
    # when staff add a team in the admin, then delete both empty ones with the "delete selected" action
    added = client.post(
        "/admin/tenancy/team/add/",
        {
            "slug": "vision",
            "name": "Vision",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
            "quota-TOTAL_FORMS": "0",
            "quota-INITIAL_FORMS": "0",
        },
        REMOTE_ADDR="198.51.100.4",
    )
    deleted = client.post(
        "/admin/tenancy/team/",
        {"action": "delete_selected", "_selected_action": [str(i) for i in ids], "post": "yes"},
    )
    # then the addition and each deletion are recorded as staff's, from the admin
    assert (added.status_code, deleted.status_code) == (302, 302)
    vision = Team.objects.get(slug="vision")
    [addition] = _entries(action="admin.added")
    assert (addition.actor, addition.source, addition.ip, addition.team) == ("root", "admin", "198.51.100.4", vision)
    assert (addition.object_type, addition.object_id, addition.after) == ("team", str(vision.pk), {"change": "Added."})
    deletions = _entries(action="admin.deleted")
    assert sorted((e.object_type, int(e.object_id), e.object_repr, e.actor) for e in deletions) == [
        ("team", ids[0], "old-one", "root"),
        ("team", ids[1], "old-two", "root"),
    ]
    assert Team.objects.filter(pk__in=ids).count() == 0


def test_record_audit_refuses_an_action_it_does_not_know(db):
    with pytest.raises(ValueError, match="unknown audit action 'model.renamed'"):
        record_audit(action="model.renamed", team=None)


def test_summaries_keep_values_small_and_plain(db):
    # given a summary with a long text and a time
    now = timezone.now()
    # when recorded in a command's context
    with audit_context(source=AuditSource.COMMAND, detail="tests"):
        entry = record_audit(action=AuditAction.USER_CHANGED, team=None, after={"text": "x" * 1000, "at": now})
    # then the text is cut at 300 characters and the time is ISO 8601 text
    entry.refresh_from_db()
    assert entry.after == {"text": "x" * 299 + "…", "at": now.isoformat()}
    assert (entry.actor, entry.source, entry.source_detail) == ("system", "command", "tests")


# --- the client's IP -----------------------------------------------------------------


def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(settings):
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="198.51.100.9")
    settings.CONCH_TRUSTED_PROXIES = []
    assert client_ip(request) == "203.0.113.7"
    settings.CONCH_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert client_ip(request) == "203.0.113.7"


def test_behind_trusted_proxies_the_first_untrusted_forwarded_address_is_the_client(settings):
    settings.CONCH_TRUSTED_PROXIES = ["10.0.0.0/8", "192.0.2.1"]
    factory = RequestFactory()
    # a client's own forged entry stays left of the address the proxies saw
    chain = factory.get("/", REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.9, 192.0.2.1")
    assert client_ip(chain) == "198.51.100.9"
    # a hop that is no address ends the walk at the last trusted one
    garbage = factory.get("/", REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="198.51.100.9, not-an-ip")
    assert client_ip(garbage) == "10.1.2.3"
    # IPv6 peers work the same; no header: the proxy itself
    assert client_ip(factory.get("/", REMOTE_ADDR="2001:db8::1")) == "2001:db8::1"
    assert client_ip(factory.get("/", REMOTE_ADDR="10.9.9.9")) == "10.9.9.9"


def test_the_forwarded_client_address_is_what_an_api_entry_records(alice, settings):
    # given Conch behind a proxy at 10.0.0.2
    settings.CONCH_TRUSTED_PROXIES = ["10.0.0.2"]
    # when alice's request arrives through it
    response = alice.client.post(
        "/api/v1/models/",
        {"team": "acme", "name": "resnet"},
        format="json",
        REMOTE_ADDR="10.0.0.2",
        HTTP_X_FORWARDED_FOR="198.51.100.20",
    )
    # then
    assert response.status_code == 201
    assert [e.ip for e in _entries(action="model.created")] == ["198.51.100.20"]


# --- reading the log -------------------------------------------------------------------


def test_a_team_admin_reads_the_entries_of_their_team_newest_first(acme_admin, owen, pending_web):
    # given acme's deployment was stopped, and globex has entries of its own
    owen.client.delete(f"/api/v1/deployments/{pending_web.pk}/")
    globex = make_caller("bob", "globex")
    globex.client.post("/api/v1/models/", {"team": "globex", "name": "secret"}, format="json")
    # when acme's admin reads the log
    response = acme_admin.client.get("/api/v1/audit/")
    # then only acme's entries, newest first, paginated
    assert response.status_code == 200, response.json()
    body = response.json()
    expected = list(AuditEntry.objects.filter(team_slug="acme").order_by("-created_at", "-id"))
    assert body["count"] == len(expected) > 0
    assert [e["id"] for e in body["results"]] == [e.pk for e in expected]
    assert {e["team"] for e in body["results"]} == {"acme"}
    newest = body["results"][0]
    assert newest["action"] == "deployment.stop_requested"
    assert {k: newest[k] for k in ("actor", "source", "object_type", "object_repr", "before", "after")} == {
        "actor": "owen",
        "source": "api",
        "object_type": "deployment",
        "object_repr": "acme/web",
        "before": {"status": "pending"},
        "after": {"status": "stopping"},
    }
    assert newest["token_prefix"].startswith("conch_") and newest["ip"] == "127.0.0.1"


def test_filters_narrow_the_log(acme_admin):
    # given entries of several actions, users and times in acme
    carol = make_caller("carol", "acme")
    carol.client.post("/api/v1/models/", {"team": "acme", "name": "one"}, format="json")
    acme_admin.client.post("/api/v1/models/", {"team": "acme", "name": "two"}, format="json")
    old = AuditEntry.objects.get(action="model.created", actor="carol")
    # (entries cannot be changed: a time filter is checked against the real timestamps)
    after_first = old.created_at + timedelta(microseconds=1)
    client = acme_admin.client

    def names(query: dict) -> list[tuple[str, str]]:
        response = client.get("/api/v1/audit/", query)
        assert response.status_code == 200, response.json()
        return [(e["action"], e["object_repr"]) for e in response.json()["results"]]

    # then each filter, and several together, narrow the list
    assert names({"action": "model.created"}) == [("model.created", "acme/two"), ("model.created", "acme/one")]
    assert names({"action": "model.created", "user": "carol"}) == [("model.created", "acme/one")]
    assert names({"object_type": "model", "since": after_first.isoformat()}) == [("model.created", "acme/two")]
    assert names({"object_type": "model", "until": after_first.isoformat()}) == [("model.created", "acme/one")]
    assert names({"object_type": "model", "object_id": str(old.object_id)}) == [("model.created", "acme/one")]
    assert names({"source": "system", "action": "token.created"}) == [
        ("token.created", f"{ApiToken.objects.get(user__username='carol').prefix}… (carol)"),
        ("token.created", f"{ApiToken.objects.get(user__username='ada').prefix}… (ada)"),
    ]
    assert names({"team": "acme", "action": "team.created"}) == []  # teams made by factories are not audited
    assert names({"user": "nobody"}) == []


@pytest.mark.parametrize(
    ("query", "field", "detail"),
    [
        ({"action": "model.renamed"}, "action", 'action: "model.renamed" is not a valid choice.'),
        ({"source": "fax"}, "source", 'source: "fax" is not a valid choice.'),
        ({"object_type": "Deploy ment"}, "object_type", "object_type: Give an object type in lowercase letters"),
        ({"since": "yesterday"}, "since", "since: Datetime has wrong format."),
        ({"since": "2026-05-02T00:00:00Z", "until": "2026-05-01T00:00:00Z"}, "until", "until: until must be later"),
        ({"team": "not a slug"}, "team", "team: Enter a valid"),
        ({"limit": "0"}, "limit", "limit must be a whole number from 1 to 1000"),
    ],
)
def test_a_bad_filter_value_is_400_naming_the_field(acme_admin, query, field, detail):
    response = acme_admin.client.get("/api/v1/audit/", query)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert response.json()["detail"].startswith(detail), response.json()


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_a_viewer_or_developer_gets_403_naming_the_admin_role(role):
    # given a member of acme who is not its admin, with a token and with a session
    member = make_caller("mia", "acme", role=role)
    session = APIClient()
    session.force_login(member.user)
    # when they read the audit log
    with_token = member.client.get("/api/v1/audit/")
    with_session = session.get("/api/v1/audit/")
    with_session_for_team = session.get("/api/v1/audit/", {"team": "acme"})
    # then
    assert with_token.status_code == with_session.status_code == with_session_for_team.status_code == 403
    needs = f"Reading the audit log needs the admin role in team 'acme'; you are a {role}."
    assert with_token.json() == {"detail": needs, "field": None}
    assert with_session_for_team.json() == {"detail": needs, "field": None}
    assert with_session.json() == {
        "detail": f"Reading the audit log needs the admin role in a team; you are a {role} in 'acme'.",
        "field": None,
    }


def test_another_teams_entries_are_never_visible(acme_admin):
    # given globex's own activity, and a user who administers acme and is a developer of globex
    bob = make_caller("bob", "globex")
    secret = bob.client.post("/api/v1/models/", {"team": "globex", "name": "secret"}, format="json").json()
    MembershipFactory(user=acme_admin.user, team=Team.objects.get(slug="globex"), role="developer")
    session = APIClient()
    session.force_login(acme_admin.user)
    # when acme's admin reads the log every way there is
    everything = session.get("/api/v1/audit/", {"limit": 1000}).json()["results"]
    by_id = session.get("/api/v1/audit/", {"object_type": "model", "object_id": secret["id"]}).json()["results"]
    for_globex = session.get("/api/v1/audit/", {"team": "globex"})
    token_for_globex = acme_admin.client.get("/api/v1/audit/", {"team": "globex"})
    # then no globex entry shows; naming globex is 403 (a developer there) or 404 (outside the token's team)
    assert AuditEntry.objects.filter(team_slug="globex").count() >= 2
    assert {e["team"] for e in everything} == {"acme"}
    assert by_id == []
    assert for_globex.status_code == 403
    assert token_for_globex.status_code == 404


def test_a_token_without_the_read_scope_gets_403_naming_it(db):
    writer = make_caller("wes", "acme", role="admin", scopes=["models:write"])
    response = writer.client.get("/api/v1/audit/")
    assert response.status_code == 403
    assert "needs a token with the 'read' scope" in response.json()["detail"]


def test_staff_read_every_team_and_entries_of_no_team(acme_admin):
    # given an entry of globex and a cluster-like entry of no team
    make_caller("bob", "globex")
    with audit_context(source=AuditSource.COMMAND, detail="register_cluster"):
        record_audit(action=AuditAction.CLUSTER_REGISTERED, team=None, object_type="cluster", object_repr="gpu")
    staff = UserFactory(username="root", is_staff=True)
    client = APIClient()
    client.force_login(staff)
    # when staff read the log
    teams = {e["team"] for e in client.get("/api/v1/audit/", {"limit": 1000}).json()["results"]}
    # then
    assert teams == {"acme", "globex", ""}


# --- append-only ---------------------------------------------------------------------------


def test_the_api_offers_no_way_to_change_or_delete_an_entry(acme_admin):
    for method in ("post", "put", "patch", "delete"):
        response = getattr(acme_admin.client, method)("/api/v1/audit/", {}, format="json")
        assert response.status_code == 405, (method, response.status_code)
    entry = AuditEntry.objects.filter(team_slug="acme").first()
    assert acme_admin.client.delete(f"/api/v1/audit/{entry.pk}/").status_code == 404


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE tenancy_auditentry SET actor = 'someone else'",
        "DELETE FROM tenancy_auditentry",
    ],
)
def test_postgresql_refuses_update_and_delete_of_entries(acme_admin, statement):
    # given entries exist
    count = AuditEntry.objects.count()
    assert count > 0
    # when anything, the table's owner included, updates or deletes one
    with pytest.raises(DatabaseError, match="audit entries are append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    # then the entries are as they were
    assert AuditEntry.objects.count() == count
    assert not AuditEntry.objects.exclude(actor__in=["system", "ada"]).exists()


def test_the_orm_cannot_change_or_delete_entries_either(acme_admin):
    entry = AuditEntry.objects.first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(action="token.revoked")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        entry.delete()
    assert AuditEntry.objects.filter(pk=entry.pk, action=entry.action).exists()


def test_staff_read_the_log_in_the_admin_which_cannot_add_change_or_delete(acme_admin):
    # given a staff user (not a superuser: no model permissions granted)
    staff = UserFactory(username="root", is_staff=True)
    client = APIClient()
    client.force_login(staff)
    entry = AuditEntry.objects.first()
    # when they open the log, an entry, and try to add, change or delete one
    listing = client.get("/admin/tenancy/auditentry/")
    detail = client.get(f"/admin/tenancy/auditentry/{entry.pk}/change/")
    add = client.get("/admin/tenancy/auditentry/add/")
    change = client.post(f"/admin/tenancy/auditentry/{entry.pk}/change/", {"actor": "x"})
    delete = client.post(f"/admin/tenancy/auditentry/{entry.pk}/delete/", {"post": "yes"})
    # then they read it, and every change is refused
    assert (listing.status_code, detail.status_code) == (200, 200)
    assert entry.object_repr in listing.content.decode()
    assert (add.status_code, change.status_code, delete.status_code) == (403, 403, 403)
    assert AuditEntry.objects.get(pk=entry.pk).actor == entry.actor
    # and a user who is not staff does not reach it
    outsider = APIClient()
    outsider.force_login(acme_admin.user)
    assert outsider.get("/admin/tenancy/auditentry/").status_code == 302


def test_a_trusted_proxy_that_is_no_address_stops_start_up(tmp_path):
    from tests.conch.test_settings import _run

    completed = _run(tmp_path, ["-c", "import django; django.setup()"], CONCH_TRUSTED_PROXIES="10.0.0.0/8,proxy.lan")
    assert completed.returncode != 0
    assert (
        "CONCH_TRUSTED_PROXIES must list IP addresses or networks such as 10.0.0.0/8, not 'proxy.lan'."
        in completed.stderr
    )

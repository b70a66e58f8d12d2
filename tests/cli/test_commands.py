"""The `conch` CLI's commands on the existing API (models, builds, deployments, teams) against a live Conch:
login and its config file, --json output, and the exit codes a pipeline branches on."""

from __future__ import annotations

import http.server
import json
import stat
import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from builds.model_config import BuildOptions
from builds.services import latest_config_pbtxt
from deployments.models import Deployment
from tenancy.services import create_api_token
from tests.conftest import make_caller
from tests.deployments.conftest import write_built_version
from tests.tiny_models import add_constant, onnx_like


def test_login_checks_the_token_and_saves_it_for_the_owner_only(cli, conch_env):
    # when the user logs in with the URL and token (and no environment variables)
    result = cli("login", "--url", conch_env.url + "/", "--token", conch_env.token, CONCH_URL=None, CONCH_TOKEN=None)
    # then the config file holds them, readable by the user only, in a folder only they enter
    assert result.code == 0, result.err
    assert result.out.startswith(f"logged in to {conch_env.url} (teams: acme); saved in {conch_env.config}")
    assert json.loads(conch_env.config.read_text()) == {"url": conch_env.url, "token": conch_env.token}
    assert stat.S_IMODE(conch_env.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(conch_env.config.parent.stat().st_mode) == 0o700
    # and later commands use it without any environment variable
    listed = cli("models", "list", "--json", CONCH_URL=None, CONCH_TOKEN=None)
    assert listed.code == 0 and listed.json() == []


def test_login_with_a_page_s_url_uses_its_scheme_host_and_port(cli, conch_env):
    # when the user logs in with the URL of the admin page they had open
    result = cli(
        "login", "--url", conch_env.url + "/admin/", "--token", conch_env.token, CONCH_URL=None, CONCH_TOKEN=None
    )
    # then the CLI says it uses the base URL, and saves that
    assert result.code == 0, result.err
    assert f"{conch_env.url}/admin is not Conch's base URL; using {conch_env.url}" in " ".join(result.err.split())
    assert json.loads(conch_env.config.read_text())["url"] == conch_env.url


def test_login_to_the_inference_gateway_s_url_says_to_give_the_console_s(cli, conch_env, gateway):
    # when the user logs in with the gateway's URL (its port is next to the console's in var/demo.env)
    result = cli("login", "--url", gateway.url, "--token", conch_env.token, "--json", CONCH_URL=None, CONCH_TOKEN=None)
    # then it is not found there, and the error says which URL to give instead; nothing is saved
    assert result.code == 3
    detail = result.json()["error"]["detail"]
    assert detail.startswith(f"{gateway.url} has no Conch API (GET /api/v1/teams/ answered 404: ")
    assert "Give the URL of Conch's console and REST API (CONCH_URL in var/demo.env)" in detail
    assert not conch_env.config.exists()


def test_login_with_a_bad_token_exits_2_and_saves_nothing(cli, conch_env):
    result = cli("login", "--url", conch_env.url, "--token", "conch_nottherightone", "--json")
    assert result.code == 2
    error = result.json()["error"]
    assert error["status"] == 401 and error["exit_code"] == 2
    assert "token" in error["detail"].lower()
    assert (
        result.err.strip().splitlines()[-1].startswith("error: ") and "[HTTP 401 from GET /api/v1/teams/]" in result.err
    )
    assert not conch_env.config.exists()


def test_environment_variables_override_the_config_file(cli, conch_env):
    # given a config file pointing at a server that is not there
    conch_env.config.parent.mkdir(mode=0o700)
    conch_env.config.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "conch_stale"}))
    # when CONCH_URL and CONCH_TOKEN are set, they win
    assert cli("models", "list").code == 0
    # and without them the file is used (nothing listens there: exit 6, server unavailable)
    result = cli("models", "list", CONCH_URL=None, CONCH_TOKEN=None)
    assert result.code == 6
    assert "is Conch running at http://127.0.0.1:9?" in result.err


def test_no_settings_at_all_is_a_usage_error_saying_how_to_log_in(cli):
    result = cli("models", "list", CONCH_URL=None, CONCH_TOKEN=None)
    assert result.code == 1
    assert "conch login --url URL --token TOKEN" in result.err


def test_models_create_list_and_the_json_they_print(cli):
    created = cli("models", "create", "classifier", "--json")
    assert created.code == 0, created.err
    model = created.json()
    assert (model["name"], model["team"], model["created"]) == ("classifier", "acme", True)
    assert cli("models", "create", "other").out.strip().endswith("'other' in team acme (created)")
    listed = cli("models", "list", "--json").json()
    assert [(m["id"], m["name"]) for m in listed] == [(model["id"], "classifier"), (model["id"] + 1, "other")]
    table = cli("models", "list").out.splitlines()
    assert table[0].split() == ["ID", "NAME", "TEAM", "LATEST", "VERSION", "LATEST", "VERSION", "ID"]
    assert table[1].split() == [str(model["id"]), "classifier", "acme"]


def test_models_list_shows_the_latest_version_s_number_and_its_id_apart(cli, conch_env, tmp_path):
    # given a model whose versions 1..3 have ids that are not their numbers (another model's version came first)
    team = conch_env.caller.team
    write_built_version(team, "first", add_constant(tmp_path / "f.onnx", 1.0), BuildOptions())
    versions = [
        write_built_version(team, "adder", add_constant(tmp_path / f"v{n}.onnx", float(n)), BuildOptions())
        for n in (1, 2, 3)
    ]
    newest = versions[-1]
    assert newest.number == 3 and newest.pk != 3
    # when the models are listed
    rows = {line.split()[1]: line.split() for line in cli("models", "list").out.splitlines()[1:]}
    # then LATEST VERSION is the number (adder:3) and LATEST VERSION ID the id
    assert rows["adder"][3:] == ["3", str(newest.pk)]
    listed = {m["name"]: m for m in cli("models", "list", "--json").json()}
    assert (listed["adder"]["latest_version_number"], listed["adder"]["latest_version"]) == (3, newest.pk)


def test_a_taken_name_is_a_conflict_unless_exist_ok(cli):
    first = cli("models", "create", "dup", "--json").json()
    # when the same name is registered again
    again = cli("models", "create", "dup")
    # then exit 4 with the server's detail and field
    assert again.code == 4
    assert "(field: name) [HTTP 409 from POST /api/v1/models/]" in again.err
    # and says how to use the existing model instead
    assert "(--exist-ok uses the existing model instead)" in again.err
    # and with --exist-ok the existing model is returned
    existing = cli("models", "create", "dup", "--exist-ok", "--json")
    assert existing.code == 0
    assert existing.json()["id"] == first["id"] and existing.json()["created"] is False


def test_a_refused_quota_exits_4_with_the_quota_in_the_json(cli, settings):
    settings.CONCH_QUOTA_MODELS = 1
    assert cli("models", "create", "first").code == 0
    refused = cli("models", "create", "second", "--json")
    assert refused.code == 4
    error = refused.json()["error"]
    assert error["status"] == 409 and error["quota"] == {"limit": 1, "used": 1, "requested": 1}
    assert "models" in error["detail"]


def test_an_unknown_team_is_not_found(cli):
    result = cli("models", "create", "x", "--team", "no-such-team")
    assert result.code == 3
    # (the last line: the live server, in this process, may log its "Not Found" to stderr before it)
    assert result.err.strip().splitlines()[-1] == (
        "error: Team 'no-such-team' does not exist or you are not a member of it. (field: team) "
        "[HTTP 404 from POST /api/v1/models/]"
    )


def test_not_found_things_exit_3(cli, tmp_path):
    model_file = tmp_path / "model.onnx"
    model_file.write_bytes(b"\x08\x08x")
    assert cli("upload", "no-such-model", model_file).code == 3
    assert cli("status", "no-such-deployment").code == 3
    assert cli("status", "424242").code == 3
    assert cli("builds", "wait", "424242").code == 3
    assert cli("infer", "nowhere", "--input", f"x={tmp_path / 'missing.npy'}").code == 1  # the file, before asking


def test_a_revoked_token_and_a_missing_scope_exit_2(cli, conch_env):
    # a read-only token may list but not create
    reader = create_api_token(user=conch_env.caller.user, team=conch_env.caller.team, scopes=["read"]).secret
    assert cli("models", "list", CONCH_TOKEN=reader).code == 0
    refused = cli("models", "create", "x", CONCH_TOKEN=reader)
    assert refused.code == 2 and "models:write" in refused.err
    # a revoked one gets nothing
    from tenancy.models import ApiToken

    ApiToken.objects.filter(user=conch_env.caller.user).update(is_revoked=True)
    assert cli("models", "list").code == 2


def test_usage_errors_exit_1(cli, tmp_path):
    assert cli("models", "lst").code == 1
    assert cli("deploy", "m").code == 1  # --name is required
    model_file = tmp_path / "m.onnx"
    model_file.write_bytes(b"\x08\x08x")
    bad = cli("upload", "m", model_file, "--build-option", "no-equals-sign", "--json")
    assert bad.code == 1 and bad.json()["error"]["field"] == "--build-option"
    assert cli("upload", "m", model_file, "--part-size", "lots").code == 1


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("yaml", "--build-option (-o) takes KEY=VALUE with KEY one of "),
        ("max_bach_size=8", "--build-option (-o) has no option 'max_bach_size' (did you mean 'max_batch_size'?)"),
        ("output_dim=json", "--build-option (-o) has no option 'output_dim' (did you mean 'output_dims'?); it takes "),
    ],
)
def test_an_unknown_build_option_is_a_usage_error_naming_the_accepted_ones(cli, tmp_path, option, says):
    model_file = tmp_path / "m.onnx"
    model_file.write_bytes(b"\x08\x08 model")
    result = cli("upload", "m", model_file, "-o", option, "--json")
    assert result.code == 1
    error = result.json()["error"]
    assert error["field"] == "--build-option" and says in error["detail"]
    assert (
        "max_batch_size, max_queue_delay_microseconds, preferred_batch_size, instance_count, output_dims"
        in error["detail"]
    )


def test_upload_sends_output_dims_as_a_build_option_which_the_server_checks(cli, tmp_path):
    # given a model, and a file whose start Conch checks
    assert cli("models", "create", "ocr").code == 0
    model_file = tmp_path / "m.onnx"
    model_file.write_bytes(b"\x08\x08 model")
    # when the upload gives an output shape with a dim below -1
    result = cli("upload", "ocr", model_file, "-o", "output_dims=y=-1,-2", "--json")
    # then the server refused the start naming the option and the tensor
    assert result.code == 1
    error = result.json()["error"]
    assert error["field"] == "build_options.output_dims"
    assert error["detail"].startswith("output_dims gives output 'y' the dim '-2'")


def test_an_unknown_runtime_is_a_usage_error_naming_the_accepted_ones(cli):
    result = cli("deploy", "m", "--name", "web", "--runtime", "lcoal")
    assert result.code == 1
    assert "Invalid value for '--runtime': 'lcoal' is not one of local, kubernetes." in " ".join(result.err.split())


@pytest.mark.parametrize(
    ("command", "usage", "option", "metavar"),
    [
        (["builds", "wait"], "conch builds wait [OPTIONS] VERSION", "--timeout", "SECONDS"),
        (["upload"], "conch upload [OPTIONS] MODEL FILE", "--build-option", "KEY=VALUE"),
        (["deploy"], "conch deploy [OPTIONS] MODEL[:NUMBER]", "--runtime", "local|kubernetes"),
        (["infer"], "conch infer [OPTIONS] DEPLOYMENT", "--input", "NAME=FILE.npy"),
        (["status"], "conch status [OPTIONS] [DEPLOYMENT]", "--team", "TEAM"),
        (["models", "create"], "conch models create [OPTIONS] NAME", "--team", "TEAM"),
    ],
)
def test_help_names_what_the_user_types(cli, command, usage, option, metavar):
    result = cli(*command, "--help", COLUMNS="200")
    assert result.code == 0
    assert f"Usage: {usage}" in [line.strip() for line in result.out.splitlines()]
    assert any(option in line and f" {metavar} " in line for line in result.out.splitlines()), result.out
    # typer's own style writes `{version}`, `<int>`, `<bool>`: placeholders, not what to type
    for placeholder in ("{", "<int>", "<bool>", "<str>", "<float", "<list", "<path>", "<file>"):
        assert placeholder not in result.out, result.out


def test_builds_wait_exits_5_with_the_build_error_when_the_build_fails(cli, conch_env, eager_tasks):
    # given a version whose build failed (the file is no ONNX model)
    client = conch_env.caller.client
    model_id = client.post("/api/v1/models/", {"name": "broken", "team": "acme"}, format="json").json()["id"]
    response = client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"this is not onnx"))}
    )
    version_id = response.json()["id"]
    assert client.get(f"/api/v1/versions/{version_id}/").json()["status"] == "failed"
    # when a pipeline waits for its build
    result = cli("builds", "wait", version_id, "--json")
    # then it exits 5 with the build's error
    assert result.code == 5
    error = result.json()["error"]
    assert error["detail"].startswith(f"The build of version {version_id} failed: ")
    assert error["exit_code"] == 5
    # and so it does when the version is named as MODEL:NUMBER, as `conch upload` prints it first
    by_name = cli("builds", "wait", "broken:1", "--json")
    assert by_name.code == 5 and by_name.json()["error"]["detail"].startswith(f"The build of version {version_id} ")


def test_builds_list_shows_every_attempt_newest_first(cli, conch_env, eager_tasks):
    # given a version whose build failed, then failed again when rebuilt
    client = conch_env.caller.client
    model_id = client.post("/api/v1/models/", {"name": "broken", "team": "acme"}, format="json").json()["id"]
    response = client.post(
        f"/api/v1/models/{model_id}/versions/", {"file": SimpleUploadedFile("m.onnx", onnx_like(b"this is not onnx"))}
    )
    version_id = response.json()["id"]
    assert client.post(f"/api/v1/versions/{version_id}/rebuild", {}, format="json").status_code == 202
    # when the history is listed, as JSON and as a table
    listed = cli("builds", "list", "broken:1", "--json")
    table = cli("builds", "list", str(version_id))
    # then both attempts are there, newest first, each failed with the build's error
    assert listed.code == 0, listed.err
    assert [(b["attempt"], b["status"]) for b in listed.json()] == [(2, "failed"), (1, "failed")]
    assert all(b["error"].startswith("The file starts like an ONNX model but is damaged") for b in listed.json())
    assert table.code == 0 and table.out.split()[:6] == ["ATTEMPT", "STATUS", "STARTED", "FINISHED", "WORKER", "ERROR"]
    rows = [row.split()[:2] for row in table.out.splitlines() if row[:1].isdigit()]
    assert rows == [["2", "failed"], ["1", "failed"]]


@pytest.mark.parametrize(
    ("version", "code", "says"),
    [
        ("broken", 1, "VERSION is a version id (as in 12) or MODEL:NUMBER"),
        ("broken:x", 1, "got 'x'"),
        ("broken:7", 3, "has no version number 7"),
        ("nosuch:1", 3, "nosuch"),
    ],
)
def test_builds_wait_names_what_is_wrong_with_the_version(cli, version, code, says):
    cli("models", "create", "broken")
    result = cli("builds", "wait", version, "--json")
    assert result.code == code, result.err
    assert says in result.json()["error"]["detail"]


def test_deploy_of_a_version_number_the_model_lacks_is_not_found(cli):
    cli("models", "create", "empty")
    assert cli("deploy", "empty", "--name", "web").code == 3
    assert cli("deploy", "empty:7", "--name", "web").code == 3
    assert cli("deploy", "empty:seven", "--name", "web").code == 1


def test_status_lists_deployments_of_the_token_only(cli, conch_env):
    make_caller("bob", "globex")  # another team's things stay invisible
    listed = cli("status", "--json")
    assert listed.code == 0 and listed.json() == []
    assert cli("status").out.split() == ["ID", "NAME", "TEAM", "MODEL", "RUNTIME", "STATUS"]


def test_json_errors_carry_the_http_status_only_when_there_was_one(cli):
    by_name = cli("status", "no-such-deployment", "--json")
    assert by_name.code == 3 and "status" not in by_name.json()["error"]
    by_id = cli("status", "424242", "--json")
    assert by_id.code == 3 and by_id.json()["error"]["status"] == 404


def test_a_url_that_answers_html_is_said_not_to_be_conch(cli):
    # given a plain web server (Python's http.server) where Conch was expected
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = cli("models", "list", CONCH_URL=url)
    finally:
        server.shutdown()
        server.server_close()
    # then the CLI says so, with the status and content type, and prints no page
    said = " ".join(result.err.split())
    assert f"{url} does not look like a Conch server (HTTP 404, text/html); check the URL (conch login)" in said
    assert "<html" not in result.err.lower() and "<!doctype" not in result.err.lower()


def test_stop_says_what_became_of_the_deployment_once(cli, conch_env, tmp_path):
    version = write_built_version(
        conch_env.caller.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions()
    )
    deployment = Deployment.objects.create(
        team=conch_env.caller.team,
        name="web",
        model_version=version,
        status="ready",
        config_pbtxt=latest_config_pbtxt(version),
    )
    result = cli("stop", "web")
    assert result.code == 0, result.err
    said = " ".join(result.out.split())
    assert said.startswith(f"deployment {deployment.pk} (web) is ")
    assert "stopped stopped" not in said and "stopping stopping" not in said


def test_metrics_table_shows_failures_rate_and_latency_of_the_json(cli, conch_env, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from deployments.models import MetricSample
    from deployments.observe import FIELDS

    # given a deployment with two samples a minute apart: 6 inferences in 6 requests of 40 ms each, 1 failure
    version = write_built_version(
        conch_env.caller.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions()
    )
    deployment = Deployment.objects.create(
        team=conch_env.caller.team,
        name="web",
        model_version=version,
        status="ready",
        config_pbtxt=latest_config_pbtxt(version),
    )
    now = timezone.now()
    # (created before the window: its rate is over the whole window, the same for both commands below)
    Deployment.objects.filter(pk=deployment.pk).update(created_at=now - timedelta(hours=1))
    for seconds_ago, count in ((70, 0.0), (10, 6.0)):
        fields = {f: 0.0 for f in FIELDS}
        fields.update(
            success_count=count, inference_count=count, failure_count=count / 6, request_duration_us=40000 * count
        )
        MetricSample.objects.create(
            deployment=deployment,
            scraped_at=now - timedelta(seconds=seconds_ago),
            model_name="adder",
            model_version="1",
            **fields,
        )
    # when the metrics are printed as JSON and as a table
    model = cli("metrics", "web", "--json").json()["models"][0]
    table = cli("metrics", "web")
    # then every column of the table has the JSON's value
    assert table.code == 0, table.err
    row = table.out.strip().splitlines()[1].split()
    assert row == [
        "adder",
        "6",
        "6",
        "1",
        str(round(model["throughput_inferences_per_second"], 3)),
        "40000",
    ]


def test_metrics_of_a_deployment_with_no_sample_yet_say_so(cli, conch_env, tmp_path):
    # given a deployment just ready, not scraped yet
    version = write_built_version(
        conch_env.caller.team, "adder", add_constant(tmp_path / "v1.onnx", 1.0), BuildOptions()
    )
    Deployment.objects.create(
        team=conch_env.caller.team,
        name="web",
        model_version=version,
        status="ready",
        config_pbtxt=latest_config_pbtxt(version),
    )
    # when its metrics are printed
    result = cli("metrics", "web")
    # then the table is empty and a note says why and what to do
    assert result.code == 0, result.err
    assert "No metric samples of web in the last 300 s yet" in " ".join(result.err.split())
    assert "Run this again shortly." in result.err


def test_backends_register_packs_a_folder_and_list_shows_it(cli, tmp_path):
    # given a Python-based backend's folder
    folder = tmp_path / "scaling"
    folder.mkdir()
    (folder / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n", encoding="utf-8"
    )
    # when it is registered from the folder
    done = cli("backends", "register", "scaling", "1.0", folder, "--json")
    assert done.code == 0, done.err
    backend = done.json()
    assert (backend["name"], backend["version"], backend["kind"], backend["files"]) == (
        "scaling",
        "1.0",
        "python",
        ["model.py"],
    )
    # then the list shows it; the same version again is refused with the server's words
    table = cli("backends", "list").out.splitlines()
    assert table[1].split()[:5] == [str(backend["id"]), "scaling", "1.0", "python", "acme"]
    again = cli("backends", "register", "scaling", "1.0", folder)
    assert again.code != 0 and "has backend scaling version 1.0 already" in again.err
    # and a name Triton's own backends use is refused naming the field
    refused = cli("backends", "register", "python", "1", folder)
    assert refused.code != 0 and "one of Triton's own backends" in refused.err


def test_pipelines_create_version_and_list(cli, conch_env, tmp_path):
    import json

    team = conch_env.caller.team
    one = write_built_version(team, "plus-one", add_constant(tmp_path / "one.onnx", 1.0), BuildOptions())
    two = write_built_version(team, "plus-two", add_constant(tmp_path / "two.onnx", 2.0), BuildOptions())
    created = cli("pipelines", "create", "chain", "--json")
    assert created.code == 0, created.err
    spec = {
        "inputs": {"input": {"datatype": "FP32", "dims": [-1, 4]}},
        "outputs": ["output"],
        "steps": [
            {"name": "first", "model_version": one.pk, "inputs": {"x": "input"}, "outputs": {"y": "between"}},
            {"name": "second", "model_version": two.pk, "inputs": {"x": "between"}, "outputs": {"y": "output"}},
        ],
    }
    (tmp_path / "chain.json").write_text(json.dumps(spec))
    made = cli("pipelines", "version", "chain", tmp_path / "chain.json")
    assert made.code == 0, made.err
    assert made.out.strip() == "pipeline 'chain' version 1: first -> second"
    table = cli("pipelines", "list").out.splitlines()
    assert table[1].split() == [str(created.json()["id"]), "chain", "acme", "1", "first", "->", "second"]
    # a mis-wired version is refused with every problem the server found
    spec["steps"][1]["inputs"] = {"x": "nowhere"}
    (tmp_path / "bad.json").write_text(json.dumps(spec))
    refused = cli("pipelines", "version", "chain", tmp_path / "bad.json")
    assert refused.code == 1 and "Step `second` takes tensor 'nowhere'" in refused.err, refused.err

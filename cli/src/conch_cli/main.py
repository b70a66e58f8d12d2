"""The `conch` command: one command per pipeline step, `--json` on each, exit codes to branch on.

Exit codes (conch_cli.errors): 0 done, 1 usage or input refused, 2 authentication/permission, 3 not found,
4 conflict or quota/size limit, 5 the upload check, build or deployment failed, 6 server unavailable or timeout.
"""

from __future__ import annotations

import contextlib
import copy
import getpass
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from conch_cli import __version__, output, tensors
from conch_cli.api import ConchApi
from conch_cli.config import Settings, load_settings, normalize_url, save_settings
from conch_cli.errors import FAILED, INTERRUPTED, NOT_FOUND, OK, UNAVAILABLE, USAGE, CliError
from conch_cli.packing import pack_folder
from conch_cli.transfer import (
    STALL_TIMEOUT_S,
    BackgroundHash,
    RateLimit,
    check_model_file,
    check_upload_api,
    file_sha256,
    head_sha256,
    upload_file,
)

EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 usage error (also: no URL or token configured) or input the server refused; "
    "2 authentication or permission; 3 not found; 4 conflict or quota/size limit; 5 upload check, build or "
    "deployment failed; 6 server unavailable or timed out; 130 interrupted (Ctrl-C)."
)

#: Build options `conch upload --build-option` takes (the upload API's `build_options`).
#: `output_dims` gives outputs' full shapes in place of those the model file declares: -o output_dims=NAME=-1,1,8210
#: (several outputs separated by ';'). `tolerance` is the comparison tolerance of a converted model's floating outputs
#: (-o tolerance=0.001). `graph_inputs`/`graph_outputs` name a TensorFlow frozen graph's nodes
#: (-o graph_outputs=logits,embedding). `input_spec` gives a TorchScript model's inputs
#: (-o 'input_spec=features=FP32:-1,5'); a TensorRT plan takes it with `output_spec`, `gpu_product` and
#: `tensorrt_version`.
BUILD_OPTIONS = (
    "max_batch_size",
    "max_queue_delay_microseconds",
    "preferred_batch_size",
    "instance_count",
    "output_dims",
    "tolerance",
    "graph_inputs",
    "graph_outputs",
    "input_spec",
    "output_spec",
    "gpu_product",
    "tensorrt_version",
)
RUNTIMES = ("local", "kubernetes")
#: Parts `conch upload` sends at once by default. Four 16 MiB parts keep a link busy; more add contention where the
#: CPU is the limit: 1 GiB into an S3 server on the same 2-core machine (bench/upload.py) took 3.9-4.1 s with 4
#: against 4.0-4.4 s with 8, alternated runs.
DEFAULT_PARALLEL_PARTS = 4


def _plain_help(params: list) -> list:
    """Show each parameter as the user types it: typer 0.28 writes a required argument as `{NAME}` in the usage
    line and an argument's type as `<int>`, `<path>`, which read like unfilled placeholders. Arguments keep their
    metavar (VERSION_ID, `[DEPLOYMENT]` when optional) and show no type."""
    for param in params:
        if isinstance(param, typer.core.TyperArgument) and not getattr(param, "_plain", False):
            name = param.metavar or param.name.upper()
            param.make_metavar = lambda ctx=None, *, usage=False, n=name, p=param: (
                f"[{n}]" if usage and not p.required else n
            )
            # The type is shared by every parameter of that type: a copy of it shows no name for this one only.
            param.type = copy.copy(param.type)
            param.type.get_metavar = lambda param, ctx: ""
            param._plain = True
    return params


class _Command(typer.core.TyperCommand):
    """A command whose help shows VERSION_ID, SECONDS… instead of typer's `{version}`, `<float range>`."""

    def get_params(self, ctx: typer.Context) -> list:
        return _plain_help(super().get_params(ctx))


class _Group(typer.core.TyperGroup):
    """A command group with the same plain help as `_Command`."""

    def get_params(self, ctx: typer.Context) -> list:
        return _plain_help(super().get_params(ctx))


app = typer.Typer(
    name="conch",
    cls=_Group,
    help="Conch from the command line: upload a model, wait for its build, deploy it, send inferences. "
    "Settings come from `conch login` (or CONCH_URL and CONCH_TOKEN). " + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Register and list models.", no_args_is_help=True, cls=_Group)
builds_app = typer.Typer(help="Follow builds of model versions.", no_args_is_help=True, cls=_Group)
backends_app = typer.Typer(help="Register and list the team's own Triton backends.", no_args_is_help=True, cls=_Group)
app.add_typer(models_app, name="models")
app.add_typer(builds_app, name="builds")
app.add_typer(backends_app, name="backends")
pipelines_app = typer.Typer(
    help="Compose pipelines (Triton ensembles) of the team's models.", no_args_is_help=True, cls=_Group
)
app.add_typer(pipelines_app, name="pipelines")

Json = Annotated[bool, typer.Option("--json", help="Print the result as one JSON document on stdout.")]
VersionArg = Annotated[
    str,
    typer.Argument(metavar="VERSION", help="The version: its id, or MODEL:NUMBER (as `conch upload` prints it)."),
]
Team = Annotated[str | None, typer.Option("--team", metavar="TEAM", help="Team slug (default: the token's only team).")]
Timeout = Annotated[
    float, typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait at most (exit 6 past it).", min=1)
]
DeploymentName = Annotated[
    str, typer.Argument(metavar="DEPLOYMENT", help="The deployment's name or id (as `conch status` lists them).")
]


def _api() -> ConchApi:
    settings = load_settings()
    return ConchApi(settings.url, settings.token)


def _version_callback(value: bool) -> None:
    if value:
        output.line(f"conch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Conch's command line client."""


@app.command(cls=_Command)
def login(
    url: Annotated[str | None, typer.Option(metavar="URL", help="Conch's URL, e.g. http://127.0.0.1:8000.")] = None,
    token: Annotated[
        str | None,
        typer.Option(metavar="TOKEN", help="An API token (conch_…); '-' reads it from stdin; asked for when left out."),
    ] = None,
    as_json: Json = False,
) -> None:
    """Check a URL and token against Conch and save them in the config file (readable by you only)."""
    url = url or os.environ.get("CONCH_URL") or typer.prompt("Conch URL")
    if token == "-":
        token = sys.stdin.readline().strip()
    token = token or os.environ.get("CONCH_TOKEN") or getpass.getpass("API token: ")
    settings = Settings(url=normalize_url(url), token=token.strip())
    if not settings.token:
        raise CliError("Give an API token (--token, CONCH_TOKEN or the prompt).", USAGE, field="token")
    try:
        teams = _login_teams(settings)
    except CliError as error:
        # A page's URL (…/admin/, …/console/x) instead of Conch's base URL: try scheme://host:port.
        parts = urlsplit(settings.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin == settings.url:
            if error.status == 404:
                # A server without Conch's API there: often the inference gateway's port instead of the console's.
                error.detail = (
                    f"{settings.url} has no Conch API (GET /api/v1/teams/ answered 404: {error.detail}). Give the URL "
                    "of Conch's console and REST API (CONCH_URL in var/demo.env), not the inference gateway's "
                    "(which serves only /serve/…)"
                )
            raise
        try:
            teams = _login_teams(Settings(url=origin, token=settings.token))
        except CliError:
            error.detail = f"{error.detail}. Give Conch's base URL (scheme://host:port), e.g. {origin}"
            raise error from None
        output.note(f"{settings.url} is not Conch's base URL; using {origin}")
        settings = Settings(url=origin, token=settings.token)
    path = save_settings(settings)
    if as_json:
        output.emit_json({"url": settings.url, "teams": teams, "config": str(path)})
    else:
        output.line(f"logged in to {settings.url} (teams: {', '.join(teams) or 'none'}); saved in {path}")


def _login_teams(settings: Settings) -> list[str]:
    """The slugs of the teams the token sees at `settings.url`; raises what the API call raised (CliError)."""
    with ConchApi(settings.url, settings.token) as api:
        return [t["slug"] for t in api.teams()]


@models_app.command("create", cls=_Command)
def models_create(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The model's name: a lowercase DNS label, at most 63 characters.")
    ],
    team: Team = None,
    exist_ok: Annotated[bool, typer.Option("--exist-ok", help="Return the model when the name is taken.")] = False,
    as_json: Json = False,
) -> None:
    """Register a model name in a team."""
    with _api() as api:
        model, created = _register_model(api, name, team, exist_ok=exist_ok)
    if as_json:
        output.emit_json({**model, "created": created})
    else:
        how = "created" if created else "existing"
        output.line(f"model {model['id']} {model['name']!r} in team {model['team']} ({how})")


def _forget_created_model(api: ConchApi, model: dict, *, quiet: bool) -> None:
    """Delete the model this command registered when the server refused its upload and the model holds nothing (no
    version, no open upload): a refused file leaves no empty model behind. A model that holds something, or a
    deletion that fails, is left as it is."""
    try:
        listed = api.get(f"/api/v1/models/{model['id']}/uploads/")
        uploads = listed.get("results", []) if isinstance(listed, dict) else listed
        if api.model_versions(model["id"]) or uploads:
            return
        api.call("DELETE", f"/api/v1/models/{model['id']}/", expect=(204,))
    except CliError:
        return
    if not quiet:
        output.note(f"model {model['id']} {model['name']!r} deleted again: the upload was refused")


def _register_model(api: ConchApi, name: str, team: str | None, *, exist_ok: bool) -> tuple[dict, bool]:
    """Register model `name` in `team` (the token's only team when None); return (the model, True).

    A name the team already has (409 naming `name`, also when another client registered it a moment ago) gives
    (that model, False) with `exist_ok`, else raises that CliError, saying --exist-ok uses the existing model.
    Raises the API's other refusals (CliError)."""
    team = api.default_team(team)
    try:
        return api.post("/api/v1/models/", {"name": name, "team": team}, expect=(201,)), True
    except CliError as exc:
        if exc.status != 409 or exc.field != "name":
            raise
        if not exist_ok:
            exc.detail = f"{exc.detail} (--exist-ok uses the existing model instead)"
            raise
        return api.find_model(name, team), False


@models_app.command("list", cls=_Command)
def models_list(team: Team = None, as_json: Json = False) -> None:
    """List the models the token sees."""
    with _api() as api:
        found = [m for m in api.pages("/api/v1/models/") if team is None or m["team"] == team]
    if as_json:
        output.emit_json(found)
    else:
        output.table(
            ["ID", "NAME", "TEAM", "LATEST VERSION", "LATEST VERSION ID"],
            [[m["id"], m["name"], m["team"], m.get("latest_version_number"), m["latest_version"]] for m in found],
        )


def _build_options(options: list[str]) -> dict[str, Any]:
    """{KEY: VALUE} from `--build-option KEY=VALUE` texts (VALUE an int when it is digits). Raises CliError (USAGE,
    field `--build-option`) naming the accepted keys for a text without `=` or a key Conch does not take."""
    parsed: dict[str, Any] = {}
    accepted = ", ".join(BUILD_OPTIONS)
    for option in options:
        key, sep, value = option.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(
                f"--build-option (-o) takes KEY=VALUE with KEY one of {accepted}, e.g. -o max_batch_size=8; "
                f"got {option!r}.",
                USAGE,
                field="--build-option",
            )
        if key not in BUILD_OPTIONS:
            import difflib  # only for this message: every command's start-up pays for a top-level import

            close = difflib.get_close_matches(key, BUILD_OPTIONS, n=1)
            raise CliError(
                f"--build-option (-o) has no option {key!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; it takes {accepted}.",
                USAGE,
                field="--build-option",
            )
        parsed[key] = int(value) if value.strip().isdigit() else value
    return parsed


def _size(text: str) -> int:
    """Bytes from `64M`, `5MiB`, `1G`, `1048576` (K, M, G are powers of 1024)."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (cleaned[:-1], cleaned[-1]) if cleaned and cleaned[-1] in units else (cleaned, "")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise CliError(f"Expected a size such as 64M or 1G, got {text!r}.", USAGE) from None
    if value <= 0:
        raise CliError(f"A size must be above 0, got {text!r}.", USAGE)
    return int(value)


BuildOptionArg = Annotated[
    list[str] | None,
    typer.Option(
        "--build-option",
        "-o",
        metavar="KEY=VALUE",
        help=f"A build option, KEY one of {', '.join(BUILD_OPTIONS)}; repeatable. output_dims gives outputs' "
        "shapes in place of those the model file declares: -o output_dims=NAME=-1,1,8210.",
    ),
]


def _option_args(options: dict[str, Any]) -> str:
    """`-o KEY=VALUE` arguments for `options`, as a command line would give them again."""
    return " ".join(f"-o {shlex.quote(f'{key}={value}')}" for key, value in options.items())


@app.command(cls=_Command)
def upload(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="The model's name or id.")],
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help="The model file (ONNX .onnx, LightGBM .txt, XGBoost .json/.ubj, an archive .zip/.tar.gz…), or a "
            "folder (an ONNX model beside its external data files), which is zipped first; GET /api/v1/formats/ "
            "lists every format.",
            exists=True,
            dir_okay=True,
            readable=True,
        ),
    ],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the version's build; exit 5 if it fails.")] = False,
    build_option: BuildOptionArg = None,
    team: Team = None,
    parallel: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Most parts sent at once (fewer on a slow link; more may help over a long, fast link).",
            min=1,
            max=64,
        ),
    ] = DEFAULT_PARALLEL_PARTS,
    part_size: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Part size, e.g. 64M (default: the server's choice, or about 2 s of --limit-rate; at least 5M).",
        ),
    ] = None,
    limit_rate: Annotated[
        str | None,
        typer.Option(metavar="SIZE", help="Send at most this many bytes per second, e.g. 20M (all parts together)."),
    ] = None,
    stall_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            envvar="CONCH_STALL_TIMEOUT",
            help="Send a part again when its connection moved no byte for this long (a slow part that moves is "
            "never cut).",
            min=0.1,
        ),
    ] = STALL_TIMEOUT_S,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
    create_model: Annotated[
        bool,
        typer.Option(
            "--create-model",
            help="Register MODEL (a name) in the team when it has no model of that name, once the server said it "
            "can build FILE: a refused file leaves no empty model behind.",
        ),
    ] = False,
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="Make a new version even when FILE already is a version of the model (by default that version is "
            "used: exit 0, said so).",
        ),
    ] = False,
    timeout: Timeout = 3600,
    as_json: Json = False,
) -> None:
    """Upload FILE as the model's next version: parts in parallel, straight to the object store when Conch uses
    S3. Run the same command again after an interruption and it sends only the parts the store lacks.
    Prints the version as MODEL:NUMBER (what `conch deploy` and `conch builds wait` take) and its VERSION_ID
    (which `conch builds wait` takes too). When FILE already is a version of the model (same sha256), no version
    is made: it prints that version (`"duplicate": true` with --json) and exits 0, so a pipeline run again goes on
    with it; --new-version makes another version anyway. Build options (-o) given then are not applied to that
    version: it says so and prints the `conch builds rebuild` command that applies them (with --json:
    `"build_options_applied": false` and `"rebuild_command"`)."""
    options = _build_options(build_option or [])
    part_bytes = _size(part_size) if part_size else None
    rate = RateLimit(_size(limit_rate)) if limit_rate else None
    with contextlib.ExitStack() as cleanup, _api() as api:
        if file.is_dir():
            file = pack_folder(file, Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="conch-pack-"))))
            if not quiet and not as_json:
                output.note(f"packed the folder into {file.name} ({output.mib(file.stat().st_size)})")
        model_created = False
        try:
            found = api.find_model(model, team)
        except CliError as error:
            if not (create_model and error.exit_code == NOT_FOUND and not model.isdigit()):
                raise
            # The server refuses a file it cannot build for the team (a pickle the team may not load) before a
            # model is registered: the team is the one the model would be registered in.
            team = api.default_team(team)
            check_model_file(api, file, team=team)
            # exist_ok: another run may have registered it meanwhile, and that one is used
            found, model_created = _register_model(api, model, team, exist_ok=True)
            if model_created and not as_json:
                output.note(f"model {found['id']} {found['name']!r} created in team {found['team']}")
        else:
            # the server refuses a file it cannot build for the model's team before a byte is hashed or sent
            check_model_file(api, file, model_id=found["id"])
        open_uploads = check_upload_api(api, found["id"], file)
        size = file.stat().st_size
        head = head_sha256(file)
        resumable = any(
            u.get("filename") == file.name
            and u.get("size_bytes") == size
            and u.get("head_sha256") in (None, "", head)  # started without first bytes, or with this file's
            for u in open_uploads
        )
        # A version of the same size may be this very file: the sha256 sent with the start then finds it before a
        # part is sent.
        maybe_made = not new_version and any(
            (v.get("source") or {}).get("size_bytes") == size and v.get("status") != "deleting"
            for v in api.model_versions(found["id"])
        )
        if resumable or maybe_made:
            # A run of this file may have stopped, or made that version: the start must send the sha256 to find
            # its upload again, or to be told the file already is a version before a part is sent.
            hashing = time.monotonic()
            sha256: str | BackgroundHash = file_sha256(file, output.progress_for_terminal(quiet))
            sha256_s = time.monotonic() - hashing
        else:  # a new upload: hash while the parts go, and send the sha256 with the completion
            sha256 = BackgroundHash(file)
        try:
            result = upload_file(
                api,
                found["id"],
                file,
                sha256=sha256,
                build_options=options,
                parallel=parallel,
                part_size=part_bytes,
                progress=output.progress_for_terminal(quiet),
                rate_limit=rate,
                stall_timeout_s=stall_timeout,
                timeout_s=timeout,
                say=output.note,
                allow_duplicate=new_version,
            )
        except CliError:
            if model_created:
                _forget_created_model(api, found, quiet=quiet or as_json)
            raise
        version = result.version
        if isinstance(sha256, BackgroundHash):
            sha256_s = sha256.seconds
        ref = f"{found['name']}:{version['number']}"
        # A duplicate makes no version, so the options given for it were not used: say so, and how to use them.
        rebuild = (
            f"conch builds rebuild {shlex.quote(ref)} {_option_args(options)}" if result.duplicate and options else ""
        )
        if result.duplicate and not as_json:
            output.line(
                f"{file.name} already is {ref} (version id {version['id']}, "
                f"{version['status']}): no new version made (--new-version makes one)"
            )
            if rebuild:
                output.line(
                    f"the build options ({_option_args(options)}) were not applied: {ref} keeps its own; "
                    f"to build it with them: {rebuild}"
                )
        elif not as_json:
            output.line(
                f"uploaded {found['name']}:{version['number']} (version id {version['id']}): "
                f"{output.mib(result.upload['size_bytes'])}, sha256 {result.upload['sha256']}"
                + ("" if version["source"].get("sha256_checked", True) else " (its build checks it)")
            )
        if wait:
            version = _wait_build(api, version["id"], timeout, quiet=quiet or as_json)
    if as_json:
        output.emit_json(
            {
                "upload": result.upload,
                "version": version,
                "model_created": model_created,
                "duplicate": result.duplicate,
                "build_options_applied": not rebuild,
                "rebuild_command": rebuild or None,
                "sent_bytes": result.sent_bytes,
                "resumed_parts": result.resumed_parts,
                "seconds": {
                    "sha256": round(sha256_s, 3),
                    "parts": round(result.parts_s, 3),
                    "sha256_wait": round(result.hash_wait_s, 3),
                    "check": round(result.check_s, 3),
                },
            }
        )
    elif wait:
        output.line(f"{found['name']}:{version['number']} built (version id {version['id']})")


def _wait_build(api: ConchApi, version_id: int | str, timeout_s: float, *, quiet: bool) -> dict:
    """Poll the version until built (returned) or failed (CliError FAILED with the build's error)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[tuple[int, str], str] = {}
    while True:
        version = api.get(f"/api/v1/versions/{version_id}/")
        attempt = (version.get("build") or {}).get("attempt") or 0
        for step in version.get("steps") or []:
            if not quiet and seen.get((attempt, step["name"])) != step["status"]:
                output.note(f"version {version['id']} build attempt {attempt}: {step['name']} {step['status']}")
            seen[(attempt, step["name"])] = step["status"]
        if version["status"] == "built":
            return version
        if version["status"] == "failed":
            raise CliError(
                f"The build of version {version['id']} failed: {version.get('error') or 'no reason given'}",
                FAILED,
                field=version.get("error_field") or None,
            )
        if version["status"] == "deleting":
            raise CliError(f"Version {version['id']} is being deleted.", FAILED)
        if time.monotonic() > deadline:
            raise CliError(
                f"Version {version['id']} is still {version['status']!r} after {timeout_s:.0f} s.", UNAVAILABLE
            )
        time.sleep(1)


@builds_app.command("wait", cls=_Command)
def builds_wait(
    version: Annotated[
        str,
        typer.Argument(
            metavar="VERSION",
            help="The version: its id, unique in Conch (`conch upload` prints `version id N`), or MODEL:NUMBER "
            "(as `conch upload` prints it first).",
        ),
    ],
    team: Team = None,
    timeout: Timeout = 3600,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No step lines on stderr.")] = False,
    as_json: Json = False,
) -> None:
    """Wait until a version's build ends: exit 0 when built, 5 when it failed (with the build's error)."""
    with _api() as api:
        found = _wait_build(api, _version_id(api, version, team), timeout, quiet=quiet or as_json)
    if as_json:
        output.emit_json(found)
    else:
        output.line(f"version id {found['id']} built")


@builds_app.command("rebuild", cls=_Command)
def builds_rebuild(
    version: VersionArg,
    build_option: BuildOptionArg = None,
    team: Team = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the build; exit 5 if it fails.")] = False,
    timeout: Timeout = 3600,
    as_json: Json = False,
) -> None:
    """Build a version again from its stored file (POST /api/v1/versions/ID/rebuild). With -o options they replace
    the version's build options (one left out goes back to the model's default); without, it keeps its own."""
    options = _build_options(build_option or [])
    with _api() as api:
        version_id = _version_id(api, version, team)
        queued = api.post(f"/api/v1/versions/{version_id}/rebuild", options)
        if not as_json:
            applied = f" with {_option_args(options)}" if options else " with its build options"
            output.line(
                f"rebuild of {queued['model_name']}:{queued['number']} (version id {queued['id']}) queued{applied}"
            )
        found = _wait_build(api, version_id, timeout, quiet=as_json) if wait else queued
    if as_json:
        output.emit_json(found)
    elif wait:
        output.line(f"version id {found['id']} built")


@builds_app.command("list", cls=_Command)
def builds_list(
    version: VersionArg,
    team: Team = None,
    as_json: Json = False,
) -> None:
    """List every build attempt of a version, newest first (GET /api/v1/versions/ID/builds/): its status, when it
    started and finished (UTC), the worker that ran it and its error (--json: every field, steps and logs too)."""
    with _api() as api:
        found = list(api.pages(f"/api/v1/versions/{_version_id(api, version, team)}/builds/"))
    if as_json:
        output.emit_json(found)
        return
    output.table(
        ["ATTEMPT", "STATUS", "STARTED", "FINISHED", "WORKER", "ERROR"],
        [
            [
                b["attempt"],
                b["status"] + (f" (after {b['lost_attempts']} lost)" if b["lost_attempts"] else ""),
                _when(b["started_at"]),
                _when(b["finished_at"]),
                b["worker"] or "-",
                (b["error"].splitlines() or ["-"])[0][:100],
            ]
            for b in found
        ],
    )


@app.command(cls=_Command)
def optimize(
    version: VersionArg,
    cluster: Annotated[
        str, typer.Option("--cluster", metavar="NAME", help="The Kubernetes cluster whose nodes build the plan.")
    ],
    gpu_product: Annotated[
        str,
        typer.Option(
            "--gpu-product", metavar="PRODUCT", help="The nodes' nvidia.com/gpu.product label, e.g. NVIDIA-A10."
        ),
    ],
    fp16: Annotated[bool, typer.Option("--fp16", help="Let TensorRT pick FP16 kernels.")] = False,
    team: Team = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the plan; exit 5 if it fails.")] = False,
    timeout: Timeout = 3600,
    as_json: Json = False,
) -> None:
    """Build a TensorRT plan of an ONNX version on a cluster's GPU product (POST /api/v1/tensorrt-plans/): a Job
    there runs trtexec, and Conch compares the plan's outputs with the ONNX model's. Deployments of the version
    on that cluster with that GPU product then serve the plan."""
    with _api() as api:
        body = {"model_version": _version_id(api, version, team), "cluster": cluster, "gpu_product": gpu_product}
        plan = api.post("/api/v1/tensorrt-plans/", {**body, "fp16": fp16})
        if not as_json:
            output.line(f"plan {plan['id']}: {plan['status']} {plan['message']}")
        deadline = time.monotonic() + timeout
        said = plan["message"]
        while wait and plan["status"] not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise CliError(f"Plan {plan['id']} is still {plan['status']!r} after {timeout:.0f} s.", UNAVAILABLE)
            time.sleep(2)
            plan = api.get(f"/api/v1/tensorrt-plans/{plan['id']}/")
            if plan["message"] != said and not as_json:
                output.line(f"plan {plan['id']}: {plan['status']} {plan['message']}")
                said = plan["message"]
    if as_json:
        output.emit_json(plan)
    if plan["status"] == "failed":
        raise CliError(f"Plan {plan['id']} failed: {plan['message']}", FAILED)


def _when(stamp: str | None) -> str:
    """`YYYY-MM-DD HH:MM:SS` of an API timestamp (ISO 8601, UTC), "-" for none."""
    return stamp[:19].replace("T", " ") if stamp else "-"


def _version_id(api: ConchApi, version: str, team: str | None) -> int:
    """The id of VERSION given as an id or as MODEL:NUMBER. Raises CliError (USAGE, field `version`) otherwise."""
    if version.isdigit():
        return int(version)
    model_ref, colon, number = version.partition(":")
    if not colon or not model_ref:
        raise CliError(
            f"VERSION is a version id (as in 12) or MODEL:NUMBER (as in classifier:2), got {version!r}.",
            USAGE,
            field="version",
        )
    return _pick_version(api, api.find_model(model_ref, team), number)["id"]


def _status_line(deployment_id: int, status: str, message: str | None) -> str:
    """`deployment ID: STATUS MESSAGE`, the message left out when it only repeats the status."""
    said = (message or "").strip()
    if said.rstrip(".").lower() == status.lower():
        said = ""
    return f"deployment {deployment_id}: {status} {said}".rstrip()


def _wait_deployment(api: ConchApi, deployment_id: int, wanted: str, timeout_s: float) -> dict:
    """Poll the deployment until its status is `wanted` (returned); failed (or stopped while waiting for ready)
    raises CliError FAILED with its error, a timeout UNAVAILABLE."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        deployment = api.get(f"/api/v1/deployments/{deployment_id}/")
        status = deployment["status"]
        if status != last:
            output.note(_status_line(deployment_id, status, deployment.get("status_message")))
            last = status
        if status == wanted:
            return deployment
        if status == "failed" or (wanted == "ready" and status == "stopped"):
            raise CliError(
                f"Deployment {deployment_id} {status}: {deployment.get('error') or deployment.get('status_message')}",
                FAILED,
            )
        if time.monotonic() > deadline:
            raise CliError(f"Deployment {deployment_id} is still {status!r} after {timeout_s:.0f} s.", UNAVAILABLE)
        time.sleep(1)


def _choice(value: str, accepted: tuple[str, ...]) -> str:
    """`value` when it is one of `accepted`; else a usage error naming them (typer.BadParameter)."""
    if value not in accepted:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(accepted)}.")
    return value


def _pick_version(api: ConchApi, model: dict, number: str | None) -> dict:
    """The model's version with that number, or its newest one. Raises CliError (NOT_FOUND, USAGE)."""
    versions = api.model_versions(model["id"])
    if number is None:
        if not versions:
            raise CliError(f"Model {model['name']!r} has no version yet; upload one.", NOT_FOUND, field="model")
        return versions[-1]
    if not number.isdigit():
        raise CliError(
            f"MODEL:NUMBER takes the version's number within the model after ':' (as in {model['name']}:2), "
            f"got {number!r}.",
            USAGE,
            field="model",
        )
    for version in versions:
        if version["number"] == int(number):
            return version
    raise CliError(f"Model {model['name']!r} has no version number {number}.", NOT_FOUND, field="model")


@app.command(cls=_Command)
def deploy(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODEL[:NUMBER]",
            help="The model's name or id, and after ':' the version's number within the model, as in "
            "orientation:2 (default: its newest version).",
        ),
    ],
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="The deployment's name (a DNS label).")],
    team: Team = None,
    runtime: Annotated[
        str, typer.Option(metavar="|".join(RUNTIMES), help="Where it runs.", callback=lambda v: _choice(v, RUNTIMES))
    ] = "local",
    cluster: Annotated[
        str | None, typer.Option(metavar="CLUSTER", help="kubernetes: a registered cluster's name.")
    ] = None,
    replicas: Annotated[int | None, typer.Option(metavar="N", help="kubernetes: number of pods.", min=1)] = None,
    min_replicas: Annotated[
        int | None, typer.Option(metavar="N", help="kubernetes autoscaling: fewest pods.", min=1)
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(metavar="N", help="kubernetes autoscaling: most pods.", min=1)
    ] = None,
    target_queue_time_us: Annotated[
        int | None,
        typer.Option(metavar="MICROSECONDS", help="kubernetes autoscaling: Triton queue time per request to hold."),
    ] = None,
    target_cpu_percent: Annotated[
        int | None, typer.Option(metavar="PERCENT", help="kubernetes autoscaling: CPU use to hold.")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            metavar="PRODUCT[:COUNT]", help="kubernetes: GPUs per pod, as NVIDIA-A10:1, or mig:PROFILE for a MIG slice."
        ),
    ] = None,
    cpu: Annotated[str | None, typer.Option(metavar="CPU", help="kubernetes: CPU request per pod ('2').")] = None,
    memory: Annotated[str | None, typer.Option(metavar="MEMORY", help="kubernetes: memory per pod ('8Gi').")] = None,
    instance_count: Annotated[int | None, typer.Option(metavar="N", help="Model instances per server.")] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(metavar="N", help="Override the version's max_batch_size.")
    ] = None,
    max_queue_delay_us: Annotated[
        int | None, typer.Option(metavar="MICROSECONDS", help="Override the dynamic batcher's delay.")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until ready; exit 5 if it fails.")] = False,
    timeout: Timeout = 1800,
    as_json: Json = False,
) -> None:
    """Deploy a built model version and, with --wait, wait until it serves."""
    model_ref, _, number = target.partition(":")
    body: dict[str, Any] = {"name": name, "runtime": runtime}
    if min_replicas is not None or max_replicas is not None:
        if min_replicas is None or max_replicas is None:
            raise CliError("Autoscaling needs both --min-replicas and --max-replicas.", USAGE, field="autoscaling")
        body["autoscaling"] = {"min_replicas": min_replicas, "max_replicas": max_replicas}
        if target_queue_time_us is not None:
            body["autoscaling"]["target_queue_time_us"] = target_queue_time_us
        if target_cpu_percent is not None:
            body["autoscaling"]["target_cpu_percent"] = target_cpu_percent
    if gpu:
        kind, _, rest = gpu.partition(":")
        if kind == "mig":
            body["gpu"] = {"mig_profile": rest}
        elif rest and not rest.isdigit():
            raise CliError(f"--gpu takes PRODUCT[:COUNT] or mig:PROFILE, got {gpu!r}.", USAGE, field="gpu")
        else:
            body["gpu"] = {"product": kind, "count": int(rest) if rest else 1}
    extras = {
        "cluster": cluster,
        "replicas": replicas,
        "cpu": cpu,
        "memory": memory,
        "instance_count": instance_count,
        "max_batch_size": max_batch_size,
        "max_queue_delay_microseconds": max_queue_delay_us,
    }
    body.update({k: v for k, v in extras.items() if v is not None})
    with _api() as api:
        model = api.find_model(model_ref, team)
        version = _pick_version(api, model, number or None)
        body.update({"team": model["team"], "model_version": version["id"]})
        deployment = api.post("/api/v1/deployments/", body, expect=(201,))
        if not as_json:
            output.line(
                f"deployment {deployment['id']} {deployment['name']!r} of {model['name']} version {version['number']} "
                f"created ({deployment['status']})"
            )
        if wait:
            deployment = _wait_deployment(api, deployment["id"], "ready", timeout)
    if as_json:
        output.emit_json(deployment)
    elif wait:
        output.line(f"deployment {deployment['id']} ready; gateway {deployment['endpoints']['gateway']}")


@app.command(cls=_Command)
def infer(
    deployment: DeploymentName,
    input_: Annotated[
        list[str],
        typer.Option("--input", "-i", metavar="NAME=FILE.npy", help="One input tensor from a .npy file; repeatable."),
    ],
    team: Team = None,
    output_dir: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Also write each output to DIR/NAME.npy.", file_okay=False)
    ] = None,
    as_json: Json = False,
) -> None:
    """Send one inference (KServe v2, binary tensor data) with inputs from .npy files, through Conch's REST API."""
    inputs = [tensors.parse_input_option(option) for option in input_]
    body, header_length = tensors.build_request(inputs)
    with _api() as api:
        found = api.find_deployment(deployment, team)
        response = api.call(
            "POST",
            f"/api/v1/deployments/{found['id']}/infer",
            content=body,
            headers={"Content-Type": "application/octet-stream", tensors.HEADER_LENGTH: str(header_length)},
        )
    answer = response.json()
    arrays = tensors.output_arrays(answer)
    if output_dir is not None:
        import numpy as np

        output_dir.mkdir(parents=True, exist_ok=True)
        for name, array in arrays.items():
            np.save(output_dir / f"{name.replace('/', '_')}.npy", array)
    if as_json:
        output.emit_json(answer)
        return
    for item in answer.get("outputs") or []:
        array = arrays[item["name"]]
        output.line(f"{item['name']} {item['datatype']} {list(array.shape)}: {_summary(array)}")


def _summary(array: Any) -> str:
    import numpy as np

    with np.printoptions(threshold=20, edgeitems=4, precision=5, suppress=True):
        text = np.array2string(array, separator=", ")
    return " ".join(text.split())


def _deployment_row(d: dict) -> list[Any]:
    return [d["id"], d["name"], d["team"], f"{d['model']}:{d['model_version_number']}", d["runtime"], d["status"]]


@app.command(cls=_Command)
def status(
    deployment: Annotated[
        str | None, typer.Argument(metavar="DEPLOYMENT", help="A deployment's name or id (default: list them all).")
    ] = None,
    team: Team = None,
    all_: Annotated[bool, typer.Option("--all", help="List stopped deployments too.")] = False,
    as_json: Json = False,
) -> None:
    """Show one deployment in detail, or list the deployments (exit 3 when the named one does not exist)."""
    with _api() as api:
        if deployment is None:
            found = [
                d
                for d in api.pages("/api/v1/deployments/")
                if (team is None or d["team"] == team) and (all_ or d["status"] != "stopped")
            ]
            if as_json:
                output.emit_json(found)
            else:
                output.table(["ID", "NAME", "TEAM", "MODEL", "RUNTIME", "STATUS"], [_deployment_row(d) for d in found])
            return
        one = api.find_deployment(deployment, team)
    if as_json:
        output.emit_json(one)
        return
    output.table(["ID", "NAME", "TEAM", "MODEL", "RUNTIME", "STATUS"], [_deployment_row(one)])
    for label, value in (
        ("message", one.get("status_message")),
        ("error", one.get("error")),
        ("gateway", one["endpoints"].get("gateway")),
        ("gateway grpc", _grpc_gateway_line(one["endpoints"])),
        ("replicas", one.get("replicas")),
        ("update", one.get("update_status")),
    ):
        if value:
            output.line(f"{label}: {value}")
    for pod in one.get("pods") or []:
        output.line(f"pod {pod.get('name')}: {pod.get('phase')} ready={pod.get('ready')} {pod.get('message') or ''}")


def _grpc_gateway_line(endpoints: dict) -> str:
    """`host:port (metadata key: value, …)` of the gateway's gRPC service, "" when the server shows none."""
    address = endpoints.get("gateway_grpc")
    if not address:
        return ""
    metadata = [f"{key}: {value}" for key, value in (endpoints.get("gateway_grpc_metadata") or {}).items()]
    return f"{address} (metadata {', '.join([*metadata, 'authorization: Bearer <token>'])})"


@app.command(cls=_Command)
def stop(
    deployment: DeploymentName,
    team: Team = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it is stopped.")] = False,
    timeout: Timeout = 600,
    as_json: Json = False,
) -> None:
    """Stop a deployment (its servers end; its name is free again once stopped)."""
    with _api() as api:
        found = api.find_deployment(deployment, team)
        stopped = api.call("DELETE", f"/api/v1/deployments/{found['id']}/", expect=(202,)).json()
        if wait:
            stopped = _wait_deployment(api, found["id"], "stopped", timeout)
    if as_json:
        output.emit_json(stopped)
    else:
        name = f"deployment {stopped['id']} ({stopped.get('name') or found.get('name')})"
        if stopped["status"] == "stopped":
            output.line(f"{name} is stopped")
        else:
            output.line(f"{name} is {stopped['status']}; `conch stop --wait` waits until it is stopped")


@app.command(cls=_Command)
def metrics(
    deployment: DeploymentName,
    team: Team = None,
    window: Annotated[int, typer.Option(metavar="SECONDS", help="Seconds to look back (10..86400).")] = 300,
    as_json: Json = False,
) -> None:
    """Throughput, latency and batching of a deployment over the last --window seconds."""
    with _api() as api:
        found = api.find_deployment(deployment, team)
        summary = api.get(f"/api/v1/deployments/{found['id']}/metrics", params={"window": window})
    if as_json:
        output.emit_json(summary)
        return
    rows = [
        [
            m.get("model_name"),
            # counts of requests: Triton's counters arrive as floats (Prometheus samples), shown as whole numbers
            _round(m.get("request_count"), 0),
            _round(m.get("inference_count"), 0),
            _round(m.get("failures"), 0),
            _round(m.get("throughput_inferences_per_second"), 3),
            _round(m.get("average_request_latency_us"), 0),
        ]
        for m in summary.get("models") or []
    ]
    output.table(["MODEL", "REQUESTS", "INFERENCES", "FAILURES", "INFER/S", "AVG LATENCY µs"], rows)
    if not rows:
        # a deployment just ready has not been scraped yet: say so rather than print a bare header
        output.note(
            f"No metric samples of {found['name']} in the last {window} s yet: Conch reads a ready deployment's "
            "Triton metrics every few seconds. Run this again shortly."
        )


def _round(value: float | None, digits: int) -> float | int | None:
    """`value` rounded to `digits` decimals (an int for 0), None kept."""
    if value is None:
        return None
    return round(value) if digits == 0 else round(value, digits)


def _report(error: CliError, json_mode: bool) -> None:
    if json_mode:
        output.emit_json(error.as_json())
    output.note(str(error))


def run(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) and return its exit code; never raises for a CLI
    error (the message goes to stderr, and with --json an `{"error": …}` document to stdout)."""
    args = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="conch", standalone_mode=False)
    except typer.TyperException as exc:  # a usage error: unknown command or option, a bad value
        if json_mode:
            output.emit_json({"error": {"detail": exc.format_message(), "field": None, "exit_code": USAGE}})
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            output.note(f"error: {exc.format_message()}")
        return USAGE
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        output.note("interrupted")
        return INTERRUPTED
    except CliError as exc:
        _report(exc, json_mode)
        return exc.exit_code
    except OSError as exc:  # a local file or folder problem
        _report(CliError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), USAGE), json_mode)
        return USAGE
    return result if isinstance(result, int) else OK


def main() -> None:
    """Console entry point of `conch`: exits with run()'s code.

    Everything the command does has ended when run() returns (its threads joined, its files closed), so the exit
    skips the interpreter's teardown (freeing every module and object: 30-70 ms after an upload) once stdout and
    stderr are flushed. A reader that closed the pipe early (`conch status | head -1`) is no error."""
    code = run()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written to it
            pass
    os._exit(code)


@backends_app.command("register", cls=_Command)
def backends_register(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The backend's name, as config.pbtxt names it.")],
    version: Annotated[str, typer.Argument(metavar="VERSION", help="Its version, e.g. 1.0.0.")],
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH",
            help="The backend's folder (libtriton_NAME.so and its libraries, or model.py), or a zip/tar of it.",
        ),
    ],
    api_version: Annotated[
        str | None,
        typer.Option("--api-version", metavar="MAJOR.MINOR", help="The TRITONBACKEND API it was built against."),
    ] = None,
    team: Team = None,
    as_json: Json = False,
) -> None:
    """Register a custom backend (POST /api/v1/backends/): the server checks it before accepting it."""
    if not path.exists():
        raise CliError(f"{path} does not exist", USAGE, field="path")
    with tempfile.TemporaryDirectory(prefix="conch-backend-") as work, _api() as api:
        archive = pack_folder(path, Path(work)) if path.is_dir() else path
        fields = {"team": api.default_team(team), "name": name, "version": version}
        if api_version:
            fields["api_version"] = api_version
        with archive.open("rb") as handle:
            response = api.call(
                "POST", "/api/v1/backends/", data=fields, files={"file": (archive.name, handle)}, expect=(201,)
            )
    backend = response.json()
    if as_json:
        output.emit_json(backend)
    else:
        output.line(
            f"backend {backend['id']} {backend['name']} {backend['version']} ({backend['kind']}) registered in team "
            f"{backend['team']}: {len(backend['files'])} file(s), {backend['size_bytes']} bytes"
        )


@backends_app.command("list", cls=_Command)
def backends_list(team: Team = None, as_json: Json = False) -> None:
    """List the custom backends the token sees."""
    with _api() as api:
        found = [b for b in api.pages("/api/v1/backends/") if team is None or b["team"] == team]
    if as_json:
        output.emit_json(found)
    else:
        output.table(
            ["ID", "NAME", "VERSION", "KIND", "TEAM", "FILES", "BYTES"],
            [[b["id"], b["name"], b["version"], b["kind"], b["team"], len(b["files"]), b["size_bytes"]] for b in found],
        )


def _find_pipeline(api: ConchApi, ref: str, team: str | None) -> dict:
    """The pipeline `ref` (its id or its name; `team` narrows a name). Raises CliError (NOT_FOUND)."""
    if ref.isdigit():
        return api.get(f"/api/v1/pipelines/{ref}/")
    found = [p for p in api.pages("/api/v1/pipelines/") if p["name"] == ref and (team is None or p["team"] == team)]
    if len(found) != 1:
        where = f" in team {team!r}" if team else ""
        detail = (
            f"No pipeline named {ref!r}{where} is visible to this token; create it with `conch pipelines create {ref}`."
            if not found
            else f"Pipelines named {ref!r} are in teams {', '.join(p['team'] for p in found)}; name one with --team."
        )
        raise CliError(detail, NOT_FOUND if not found else USAGE, field="pipeline")
    return found[0]


@pipelines_app.command("create", cls=_Command)
def pipelines_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The pipeline's name: the ensemble's Triton model name.")],
    team: Team = None,
    as_json: Json = False,
) -> None:
    """Register a pipeline name in a team."""
    with _api() as api:
        pipeline = api.post("/api/v1/pipelines/", {"team": api.default_team(team), "name": name}, expect=(201,))
    if as_json:
        output.emit_json(pipeline)
    else:
        output.line(f"pipeline {pipeline['id']} {pipeline['name']!r} in team {pipeline['team']} (created)")


@pipelines_app.command("version", cls=_Command)
def pipelines_version(
    pipeline: Annotated[str, typer.Argument(metavar="PIPELINE", help="The pipeline's name or id.")],
    spec: Annotated[
        Path,
        typer.Argument(
            metavar="SPEC.json",
            help="The version: {inputs, outputs, max_batch_size, steps: [{name, model_version, inputs, outputs}]}.",
        ),
    ],
    team: Team = None,
    as_json: Json = False,
) -> None:
    """Check a pipeline version's steps as a graph and make it (every problem is told at once)."""
    try:
        body = json.loads(spec.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"{spec} is not a readable JSON file: {exc}", USAGE, field="spec") from None
    with _api() as api:
        found = _find_pipeline(api, pipeline, team)
        made = api.post(f"/api/v1/pipelines/{found['id']}/versions/", body, expect=(201,))
    if as_json:
        output.emit_json(made)
    else:
        output.line(f"pipeline {found['name']!r} version {made['number']}: {' -> '.join(made['graph']['order'])}")


@pipelines_app.command("list", cls=_Command)
def pipelines_list(team: Team = None, as_json: Json = False) -> None:
    """List the pipelines the token sees, with their latest version's steps."""
    with _api() as api:
        found = [p for p in api.pages("/api/v1/pipelines/") if team is None or p["team"] == team]
    if as_json:
        output.emit_json(found)
    else:
        rows = []
        for p in found:
            latest = max(p["versions"], key=lambda v: v["number"], default=None)
            rows.append(
                [
                    p["id"],
                    p["name"],
                    p["team"],
                    len(p["versions"]),
                    " -> ".join(latest["graph"]["order"]) if latest else "-",
                ]
            )
        output.table(["ID", "NAME", "TEAM", "VERSIONS", "LATEST STEPS"], rows)

"""The `conch` CLI against a real Conch web server: pytest-django's live server (a threaded WSGI server on the
test database, real PostgreSQL under `make test`), with folder storage or S3 storage on the moto S3 server.

`cli` runs the CLI in this process (`conch_cli.main.run`, output captured); `cli_process` runs the installed
`conch` command as a pipeline would, in a subprocess. Both get CONCH_URL and CONCH_TOKEN of a developer in team
`acme`, and a config file path of their own (never the user's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import make_caller

CONCH = Path(sys.executable).with_name("conch")


@dataclass
class Result:
    """What one CLI run did: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    def json(self):
        """stdout parsed as the one JSON document `--json` prints."""
        return json.loads(self.out)


@dataclass
class CliEnv:
    """Where the CLI talks to: the live server's URL, the caller's token, the caller (user, team, API client)."""

    url: str
    token: str
    caller: object
    config: Path

    def environ(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONCH_")}
        env.update({"CONCH_URL": self.url, "CONCH_TOKEN": self.token, "CONCH_CONFIG": str(self.config)})
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}


@pytest.fixture
def conch_env(live_server, transactional_db, tmp_path) -> CliEnv:
    """A developer of team `acme` with a token, and the live server's URL."""
    caller = make_caller("alice", "acme")
    return CliEnv(url=live_server.url, token=caller.token, caller=caller, config=tmp_path / "conch" / "config.json")


@pytest.fixture
def cli(conch_env, monkeypatch, capsys):
    """Run `conch ARGS…` in this process; returns a Result. Keyword arguments override environment variables
    (None removes one)."""
    from conch_cli.main import run

    def invoke(*args: str, **env: str | None) -> Result:
        for name, value in conch_env.environ(**env).items():
            monkeypatch.setenv(name, value)
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
        capsys.readouterr()
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def cli_process(conch_env):
    """Run the installed `conch` command in a subprocess; returns a Result (or the Popen with `background=True`)."""

    def invoke(*args: str, background: bool = False, timeout: float = 300, **env: str | None):
        command = [str(CONCH), *map(str, args)]
        if background:
            return subprocess.Popen(
                command, env=conch_env.environ(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        done = subprocess.run(command, env=conch_env.environ(**env), capture_output=True, text=True, timeout=timeout)
        return Result(done.returncode, done.stdout, done.stderr)

    return invoke

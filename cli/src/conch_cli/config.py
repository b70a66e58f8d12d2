"""Where the CLI finds Conch and its token: environment variables first, then the config file.

The file is JSON `{"url": ..., "token": ...}` at `$CONCH_CONFIG`, else `$XDG_CONFIG_HOME/conch/config.json`, else
`~/.config/conch/config.json`. `conch login` writes it readable by its owner only (0600, in a 0700 folder).
`CONCH_URL` and `CONCH_TOKEN` override what the file says.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from conch_cli.errors import USAGE, CliError


@dataclass(frozen=True)
class Settings:
    """Where Conch is (`url`, no trailing slash) and the API token to send."""

    url: str
    token: str


def config_path() -> Path:
    """Return the config file's path (it may not exist)."""
    explicit = os.environ.get("CONCH_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "conch" / "config.json"


def read_config_file() -> dict:
    """Return the config file's contents, `{}` when it does not exist.

    Raises CliError (USAGE) when the file is not a JSON object, naming the file.
    """
    path = config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"Cannot read the config file {path}: {exc.strerror}.", USAGE) from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise CliError(f"The config file {path} is not a JSON object; run `conch login` again.", USAGE)
    return data


def load_settings() -> Settings:
    """Return the URL and token to use: `CONCH_URL`/`CONCH_TOKEN`, else the config file's.

    Raises CliError (USAGE: nothing to authenticate with yet) when either is missing, saying how to set them.
    """
    stored = read_config_file()
    url = os.environ.get("CONCH_URL") or stored.get("url") or ""
    token = os.environ.get("CONCH_TOKEN") or stored.get("token") or ""
    if not url or not token:
        missing = " and ".join(name for name, value in (("URL", url), ("token", token)) if not value)
        raise CliError(
            f"No Conch {missing} configured: run `conch login --url URL --token TOKEN`, or set CONCH_URL and "
            "CONCH_TOKEN.",
            USAGE,
        )
    return Settings(url=normalize_url(url), token=token)


def normalize_url(url: str) -> str:
    """Return `url` without trailing slashes; raises CliError (USAGE, field url) unless it is http(s)://…."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise CliError(f"The Conch URL must start with http:// or https://, got {url!r}.", USAGE, field="url")
    return url


def save_settings(settings: Settings) -> Path:
    """Write the config file readable by its owner only (0600; its folder 0700) and return its path.

    The file is replaced atomically, so a reader never sees half of it.
    """
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps({"url": settings.url, "token": settings.token}, indent=2) + "\n"
    # mkstemp creates the file 0600 before anything is written into it.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path

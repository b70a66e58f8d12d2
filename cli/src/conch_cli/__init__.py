"""`conch`: the command line client of Conch's REST API, for CI pipelines and shells (no Django inside)."""

import sys
from types import ModuleType

__version__ = "0.1.0"

# httpx imports its own command line client (`httpx._main`: click, pygments, rich) whenever those packages are
# installed, as they are beside typer: about 30 ms of every `conch` command, for a module conch never uses. Taking
# its place with an empty module makes httpx skip it (its `httpx.main` then says the client needs httpx[cli]).
# Nothing else is changed; a process that has already loaded the real one keeps it.
sys.modules.setdefault("httpx._main", ModuleType("httpx._main"))

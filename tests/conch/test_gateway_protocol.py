"""`conch.gateway_protocol` changes nothing of uvicorn's modules: other servers in the process (the console's,
`conch.web`) keep uvicorn's own request cycle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter (this one may have imported the module already): every global of uvicorn's HTTP protocol
# modules before and after the import, by identity.
_PROBE = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conch.settings")
import django
django.setup()
from uvicorn.protocols.http import httptools_impl, h11_impl, flow_control
modules = (httptools_impl, h11_impl, flow_control)
before = {m.__name__: {k: id(v) for k, v in vars(m).items()} for m in modules}
import conch.gateway_protocol
after = {m.__name__: {k: id(v) for k, v in vars(m).items()} for m in modules}
names = [(m, k) for m in before for k in before[m].keys() | after[m].keys()]
changed = sorted(f"{m}.{k}" for m, k in names if before[m].get(k) != after[m].get(k))
print(json.dumps({"changed": changed, "cycle": httptools_impl.RequestResponseCycle.__module__}))
"""


def test_importing_the_gateway_protocol_leaves_uvicorn_s_module_globals_as_they_were():
    # when a fresh process imports conch.gateway_protocol
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    # then no global of uvicorn's HTTP protocol modules changed, and the cycle class is uvicorn's own
    assert found == {"changed": [], "cycle": "uvicorn.protocols.http.httptools_impl"}

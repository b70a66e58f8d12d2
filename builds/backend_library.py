"""Checking an uploaded custom Triton backend (a C/C++ shared library) before Conch accepts it.

Triton loads a backend named `<name>` from `<backend-dir>/<name>/libtriton_<name>.so` with
`dlopen(path, RTLD_NOW | RTLD_LOCAL)` (Triton "Backends", backend repository README "Backend Shared Library"; core
`src/shared_library.cc`), then looks its entry points up by name. `RTLD_NOW` binds every function the library calls
at load time, so a library that calls a Triton function the server lacks, or needs a library the node lacks, fails
to load. This module reads the library's ELF headers, dynamic symbol table (`.dynsym`) and dynamic section (its
`DT_NEEDED` entries) with pyelftools and refuses, before any build, what would fail there:

- a file that is not an ELF shared object (`e_type` ET_DYN; a position-independent executable is refused too);
- one built for another architecture than the nodes' (`e_machine`), or not 64-bit little-endian;
- a file name other than `libtriton_<name>.so`;
- a library that does not export `TRITONBACKEND_ModelInstanceExecute`, the one entry point Triton requires;
- one that calls `TRITONBACKEND_*` / `TRITONSERVER_*` functions the Triton release that will load it does not
  export (a backend built against a newer API), or that declares a backend API version that release cannot serve;
- one that needs libraries which are neither in the upload beside it, nor on every Triton container, nor loaded
  with Triton's own server library.

Every refusal is `InvalidInput` (field "file") naming the file, what is wrong and what to do; `check_backend_library`
gathers the refusals that do not hide each other (name, entry points, API, libraries) and raises them together
(`conch.errors.refuse_each`). A server library that cannot be read is `Unavailable`: Conch's installation is at
fault, not the upload.

The uploaded library is never loaded: only parsed. pyelftools reads an untrusted file in this process, so a caller
holding an upload runs the check in the build's sandbox (`builds.sandbox`), as for other uploaded files. Reading the
server's backend API version does load Triton's own `libtritonserver.so`, in a child process
(`read_backend_api_version`), so a crash there cannot take the caller down.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import subprocess
import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.construct.core import ConstructError
from elftools.elf.dynamic import DynamicSection, DynamicTag
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_DT_FLAGS_1
from elftools.elf.sections import SymbolTableSection

from conch.errors import ConchError, InvalidInput, Unavailable, attempt, refuse_each

__all__ = [
    "OPTIONAL_ENTRY_POINTS",
    "REQUIRED_ENTRY_POINTS",
    "SUPPORTED_MACHINES",
    "SYSTEM_LIBRARIES",
    "BackendLibraryReport",
    "check_backend_library",
    "check_library_job",
    "find_server_library",
    "read_backend_api_version",
]

#: The entry points Triton looks up in a backend library, required first. From triton-inference-server/core
#: `src/backend_manager.cc`, `TritonBackend::LoadBackendLibrary` (each `GetEntrypoint(..., optional)` call), read
#: on the r24.10 branch (Triton 2.51, the release in the nvidia-pytriton wheel) and on main (June 2026): the same
#: eight, plus `TRITONBACKEND_ModelInstanceReady`, which main (r25.12 and later) also looks up, optionally.
#: The `TRITONBACKEND_BackendAttribute*` functions are not entry points: the server exports them and a backend's
#: `TRITONBACKEND_GetBackendAttribute` calls them. (The custom batching functions, `TRITONBACKEND_ModelBatch*`,
#: are looked up in a separate batching library, `src/backend_model.cc`, not here.)
REQUIRED_ENTRY_POINTS: tuple[str, ...] = ("TRITONBACKEND_ModelInstanceExecute",)
OPTIONAL_ENTRY_POINTS: tuple[str, ...] = (
    "TRITONBACKEND_Initialize",
    "TRITONBACKEND_Finalize",
    "TRITONBACKEND_GetBackendAttribute",
    "TRITONBACKEND_ModelInitialize",
    "TRITONBACKEND_ModelFinalize",
    "TRITONBACKEND_ModelInstanceInitialize",
    "TRITONBACKEND_ModelInstanceFinalize",
    "TRITONBACKEND_ModelInstanceReady",
)

#: Node architectures (Python's `platform.machine()` names on Linux) -> the ELF `e_machine` a library for them has.
SUPPORTED_MACHINES: dict[str, str] = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}

#: How refusals name an `e_machine` (pyelftools' names of the values); others are named as pyelftools gives them.
_MACHINE_NAMES = {
    "EM_X86_64": "x86-64",
    "EM_AARCH64": "AArch64",
    "EM_386": "32-bit x86",
    "EM_ARM": "32-bit ARM",
    "EM_PPC64": "POWER (ppc64)",
    "EM_S390": "IBM Z (s390x)",
    "EM_RISCV": "RISC-V",
}

#: Libraries of the C and C++ runtimes that every Triton container (an Ubuntu image) has, so a backend need not
#: ship them; the dynamic loader itself (`ld-linux-x86-64.so.2`, `ld-linux-aarch64.so.1`) is matched by pattern.
SYSTEM_LIBRARIES: frozenset[str] = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libgcc_s.so.1",
        "libstdc++.so.6",
    }
)
_LOADER_PATTERN = "ld-linux-*.so.*"
#: The name every Triton build's server library has (its SONAME) and backends link against.
SERVER_LIBRARY_NAME = "libtritonserver.so"
#: Functions a backend may call in the server: the prefixes of Triton's backend and server C APIs.
_SERVER_API_PREFIXES = ("TRITONBACKEND_", "TRITONSERVER_")

_API_VERSION_TIMEOUT_S = 60.0
# Loads the server library and prints "major minor" from TRITONBACKEND_ApiVersion (a NULL TRITONSERVER_Error* is
# success); exit status 3 with the error's message otherwise.
_API_VERSION_PROGRAM = """
import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
api_version = library.TRITONBACKEND_ApiVersion
api_version.restype = ctypes.c_void_p
api_version.argtypes = [ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
major, minor = ctypes.c_uint32(), ctypes.c_uint32()
error = api_version(ctypes.byref(major), ctypes.byref(minor))
if error:
    message = library.TRITONSERVER_ErrorMessage
    message.restype = ctypes.c_char_p
    message.argtypes = [ctypes.c_void_p]
    sys.stderr.write(message(error).decode(errors="replace"))
    sys.exit(3)
print(major.value, minor.value)
"""


@dataclass(frozen=True)
class BackendLibraryReport:
    """What `check_backend_library` found in a backend library it accepted.

    `name`: the backend's name (`libtriton_<name>.so`). `machine`: the nodes' architecture it was built for
    (`platform.machine()` name, "x86_64"). `entry_points`: the Triton entry points it exports, in
    REQUIRED_ENTRY_POINTS + OPTIONAL_ENTRY_POINTS order; `optional_entry_points`: the optional ones among them.
    `server_functions`: the `TRITONBACKEND_*` / `TRITONSERVER_*` functions it calls in the server, sorted.
    `needed_libraries`: its `DT_NEEDED` entries, in file order; `search_path`: where the loader looks for them
    first, its DT_RUNPATH folders (or, without one, DT_RPATH's) as written ("$ORIGIN"). `api_version`: the
    backend API version (major, minor) of the Triton it was checked against; `declared_api_version`: the one the
    user declared, if any.
    """

    name: str
    machine: str
    entry_points: tuple[str, ...]
    optional_entry_points: tuple[str, ...]
    server_functions: tuple[str, ...]
    needed_libraries: tuple[str, ...]
    search_path: tuple[str, ...]
    api_version: tuple[int, int]
    declared_api_version: tuple[int, int] | None


@dataclass(frozen=True)
class _ElfFacts:
    """The parts of one ELF file the checks read; pyelftools' names for the header values."""

    elf_type: str
    machine: str
    elf_class: int
    little_endian: bool
    position_independent_executable: bool
    soname: str | None
    needed: tuple[str, ...]
    #: DT_RUNPATH's folders, or without one DT_RPATH's, as written ("$ORIGIN", "$ORIGIN/../lib").
    search_path: tuple[str, ...]
    #: Defined, global or weak, visible symbols of `.dynsym`; `exported_functions`: those that are functions.
    exported: frozenset[str]
    exported_functions: frozenset[str]
    #: Undefined `.dynsym` symbols bound globally (the load fails without them) and weakly (it does not).
    undefined_strong: frozenset[str]
    undefined_weak: frozenset[str]
    has_dynamic_symbols: bool


class _NotElf(Exception):
    """`_read_elf` could not read the file as ELF; the message says why."""


def check_backend_library(
    path: Path,
    *,
    name: str,
    machine: str,
    server_library: Path,
    shipped: Collection[str] = (),
    declared_api_version: tuple[int, int] | None = None,
    server_api_version: tuple[int, int] | None = None,
) -> BackendLibraryReport:
    """Check the custom backend library at `path` for backend `name` on `machine` nodes; return what it holds.

    `machine`: the nodes' architecture as `platform.machine()` names it ("x86_64", "aarch64"; SUPPORTED_MACHINES).
    `server_library`: the `libtritonserver.so` of the Triton release that will load it (`find_server_library`).
    `shipped`: file names of the other files in the upload beside the library (the libraries it may need).
    `declared_api_version`: (major, minor) of the TRITONBACKEND API the user says it was built for, or None.
    `server_api_version`: the server library's own (major, minor) when the caller read it already
    (`read_backend_api_version`: a sandboxed caller reads it outside, where loading Triton is not limited); None
    reads it here.

    Checks, in order: an ELF shared object (ET_DYN, not a position-independent executable) for `machine`,
    64-bit little-endian; then, all reported together, its name is `libtriton_<name>.so`; it exports
    REQUIRED_ENTRY_POINTS; every function it calls in the server (undefined `.dynsym` symbols named
    `TRITONBACKEND_*`/`TRITONSERVER_*`, bound globally: Triton dlopens with RTLD_NOW, so each must resolve; a weak
    one may stay unresolved) is exported by `server_library`; `declared_api_version` has Triton's major and a minor
    no greater than Triton's (the rule of core `include/triton/core/tritonbackend.h`, "TRITONBACKEND API Version");
    each `DT_NEEDED` library is in `shipped`, in SYSTEM_LIBRARIES (or the dynamic loader), is the server library
    (`libtritonserver.so`, or `server_library`'s own SONAME or file name) or one the server library itself needs
    (loaded with it before any backend, so the dynamic loader reuses it).

    Not checked: that the loader finds the shipped libraries. On Linux Triton does not put the backend's folder on
    the search path (core `src/shared_library.cc`), so they are found only through a `$ORIGIN` folder in the
    library's `search_path` (or LD_LIBRARY_PATH); nor are the shipped libraries' own needs checked.

    The embedded runtime's Triton (the nvidia-pytriton wheel) names its server library libtritonserver-717102f0.so:
    a backend that needs `libtritonserver.so` passes here but loads there only when a `libtritonserver.so` is on
    the server's library path.

    Raises `InvalidInput` (field "file") for the upload's faults, several at once as `refusals`; `Unavailable` when
    `server_library` cannot be read or run; `ValueError` for a `machine` not in SUPPORTED_MACHINES, an empty
    `name`, or a `declared_api_version` that is not two non-negative integers (the caller's mistakes).
    """
    if machine not in SUPPORTED_MACHINES:
        raise ValueError(f"machine {machine!r} is not one of {sorted(SUPPORTED_MACHINES)} (platform.machine() names)")
    if not name:
        raise ValueError("the backend name must not be empty")
    if declared_api_version is not None and not _is_version(declared_api_version):
        raise ValueError(
            f"declared_api_version must be (major, minor), two integers >= 0, got {declared_api_version!r}"
        )
    shown = path.name
    try:
        facts = _read_elf(path)
    except _NotElf as exc:
        raise InvalidInput(
            f"{shown} is not an ELF shared library ({exc}); upload the compiled libtriton_{name}.so your backend's "
            "build produced (not its source, an archive or a static library)",
            field="file",
        ) from exc
    _check_kind(shown, facts, name=name)
    _check_machine(shown, facts, machine=machine)
    server = _read_server_library(server_library)
    api_version = server_api_version or read_backend_api_version(server_library)

    refusals: list[ConchError] = []
    attempt(refusals, _check_name, shown, name=name)
    attempt(refusals, _check_entry_points, shown, facts)
    attempt(refusals, _check_server_functions, shown, facts, server=server, server_library=server_library)
    if declared_api_version is not None:
        attempt(refusals, _check_api_version, shown, declared=declared_api_version, server=api_version)
    attempt(refusals, _check_needed, shown, facts, shipped=shipped, server=server, server_library=server_library)
    if refusals:
        raise refuse_each(refusals)

    known = REQUIRED_ENTRY_POINTS + OPTIONAL_ENTRY_POINTS
    return BackendLibraryReport(
        name=name,
        machine=machine,
        entry_points=tuple(entry for entry in known if entry in facts.exported_functions),
        optional_entry_points=tuple(entry for entry in OPTIONAL_ENTRY_POINTS if entry in facts.exported_functions),
        server_functions=tuple(sorted(_server_calls(facts.undefined_strong | facts.undefined_weak))),
        needed_libraries=facts.needed,
        search_path=facts.search_path,
        api_version=api_version,
        declared_api_version=declared_api_version,
    )


def find_server_library(libs_dir: Path) -> Path:
    """Return the one `libtritonserver*.so` in `libs_dir` (the wheel's `nvidia_pytriton.libs`, whose copy is
    renamed `libtritonserver-<hash>.so`; a Triton container's `/opt/tritonserver/lib`).

    Raises `Unavailable` when there is none or more than one.
    """
    found = sorted(libs_dir.glob("libtritonserver*.so"))
    if len(found) != 1:
        what = "no libtritonserver*.so" if not found else f"several ({', '.join(p.name for p in found)})"
        raise Unavailable(
            f"{libs_dir} holds {what}, so backend libraries cannot be checked against Triton's; "
            "reinstall the pinned nvidia-pytriton wheel"
        )
    return found[0]


def read_backend_api_version(server_library: Path, *, library_dirs: Iterable[Path] = ()) -> tuple[int, int]:
    """Return (major, minor) of the TRITONBACKEND API the Triton whose `server_library` is given serves.

    Calls the library's `TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor)` through ctypes in a child
    Python process (`sys.executable -I -c ...`, its environment only PATH and LD_LIBRARY_PATH), so a crash while
    loading the library cannot take the caller down. LD_LIBRARY_PATH holds `server_library`'s folder (where the
    wheel's `nvidia_pytriton.libs` keeps the libraries it needs) and then `library_dirs`. The answer is cached per
    file (path, size, modification time); the child takes well under a second. The library must be one this
    machine can load (its architecture): an aarch64 Triton's cannot be read on an x86_64 worker.

    Raises `Unavailable` when the child fails, crashes, takes over 60 s or prints something else than two numbers.
    """
    resolved = server_library.resolve()
    try:
        stat = resolved.stat()
    except OSError as exc:
        raise Unavailable(
            f"Triton's server library {server_library} cannot be read ({exc.strerror}); "
            "reinstall the pinned nvidia-pytriton wheel"
        ) from exc
    dirs = (resolved.parent, *(Path(d) for d in library_dirs))
    return _api_version_of(str(resolved), stat.st_size, stat.st_mtime_ns, tuple(str(d) for d in dirs))


@functools.lru_cache(maxsize=16)
def _api_version_of(path: str, size: int, mtime_ns: int, dirs: tuple[str, ...]) -> tuple[int, int]:
    """`read_backend_api_version` of the file at `path` as it was when it had `size` and `mtime_ns` (cache key)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": os.pathsep.join(dirs)}
    try:
        completed = subprocess.run(
            [sys.executable, "-I", "-c", _API_VERSION_PROGRAM, path],
            env=env,
            capture_output=True,
            text=True,
            timeout=_API_VERSION_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(
            f"reading the backend API version of {path} took over {_API_VERSION_TIMEOUT_S:.0f} s; "
            "check that the Triton installation is intact"
        ) from exc
    fields = completed.stdout.split()
    if completed.returncode != 0 or len(fields) != 2 or not all(field.isdigit() for field in fields):
        if completed.returncode < 0:
            how = f"was killed by signal {-completed.returncode}"
        elif completed.returncode > 0:
            how = f"exited with code {completed.returncode}"
        else:
            how = f"printed {completed.stdout[:200]!r}, not the two numbers of a version"
        tail = completed.stderr.strip()[-2000:]
        raise Unavailable(
            f"reading the backend API version of {path} failed: the child process {how}"
            f"{': ' + tail if tail else ''}; reinstall the pinned nvidia-pytriton wheel"
        )
    return int(fields[0]), int(fields[1])


def _read_elf(path: Path) -> _ElfFacts:
    """Read the facts the checks need from the ELF file at `path`; raise `_NotElf` saying why it cannot be read."""
    try:
        stream = path.open("rb")
    except OSError as exc:
        raise _NotElf(f"it cannot be opened: {exc.strerror}") from exc
    with stream:
        try:
            elf = ELFFile(stream)
            dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
            symbols = next(
                (s for s in elf.iter_sections("SHT_DYNSYM") if isinstance(s, SymbolTableSection)),
                None,
            )
            needed: list[str] = []
            runpath: list[str] = []
            rpath: list[str] = []
            soname = None
            pie = False
            if dynamic is not None:
                for tag in dynamic.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(_tag_string(tag))
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        runpath.extend(part for part in _tag_string(tag).split(":") if part)
                    elif tag.entry.d_tag == "DT_RPATH":
                        rpath.extend(part for part in _tag_string(tag).split(":") if part)
                    elif tag.entry.d_tag == "DT_SONAME":
                        soname = _tag_string(tag)
                    elif tag.entry.d_tag == "DT_FLAGS_1":
                        pie = bool(tag.entry.d_val & ENUM_DT_FLAGS_1["DF_1_PIE"])
            exported: set[str] = set()
            functions: set[str] = set()
            strong: set[str] = set()
            weak: set[str] = set()
            for symbol in symbols.iter_symbols() if symbols is not None else ():
                bind = symbol["st_info"]["bind"]
                # STB_LOOS is GNU's STB_GNU_UNIQUE (a C++ inline's static, exported like a global).
                if not symbol.name or bind not in ("STB_GLOBAL", "STB_WEAK", "STB_LOOS"):
                    continue
                if symbol["st_shndx"] == "SHN_UNDEF":
                    (weak if bind == "STB_WEAK" else strong).add(symbol.name)
                elif symbol["st_other"]["visibility"] not in ("STV_HIDDEN", "STV_INTERNAL"):
                    exported.add(symbol.name)
                    if symbol["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC"):
                        functions.add(symbol.name)
            return _ElfFacts(
                elf_type=str(elf["e_type"]),
                machine=str(elf["e_machine"]),
                elf_class=elf.elfclass,
                little_endian=elf.little_endian,
                position_independent_executable=pie,
                soname=soname,
                needed=tuple(needed),
                search_path=tuple(runpath or rpath),
                exported=frozenset(exported),
                exported_functions=frozenset(functions),
                undefined_strong=frozenset(strong),
                undefined_weak=frozenset(weak),
                has_dynamic_symbols=symbols is not None,
            )
        except ELFError as exc:
            if str(exc).startswith("Magic number does not match"):
                raise _NotElf("it does not start with the ELF magic bytes 7f 45 4c 46") from exc
            raise _NotElf(f"its ELF structure is broken or cut short: {exc}") from exc
        except (ConstructError, EOFError, ValueError) as exc:
            raise _NotElf(f"its ELF structure is broken or cut short: {exc}") from exc


def _tag_string(tag: DynamicTag) -> str:
    """The string a DT_NEEDED, DT_SONAME, DT_RPATH or DT_RUNPATH tag names; pyelftools sets it as the tag's
    attribute named after the tag (`needed`, `soname`, `rpath`, `runpath`), which its types do not declare."""
    return str(getattr(tag, str(tag.entry.d_tag).removeprefix("DT_").lower()))


def _read_server_library(server_library: Path) -> _ElfFacts:
    """The facts of Triton's server library; `Unavailable` when it is not a readable shared library of Triton."""
    try:
        facts = _read_elf(server_library)
    except _NotElf as exc:
        raise Unavailable(
            f"Triton's server library {server_library} cannot be read ({exc}); reinstall the pinned nvidia-pytriton "
            "wheel"
        ) from exc
    if "TRITONBACKEND_ApiVersion" not in facts.exported_functions:
        raise Unavailable(
            f"{server_library} does not export TRITONBACKEND_ApiVersion, so it is not Triton's libtritonserver.so; "
            "pass the server library of the Triton that will load the backend"
        )
    return facts


def _check_kind(shown: str, facts: _ElfFacts, *, name: str) -> None:
    """Refuse an ELF file that is not a shared object (an executable, object file or core dump)."""
    kinds = {
        "ET_EXEC": "an executable",
        "ET_REL": "an object file (.o) that is not linked yet",
        "ET_CORE": "a core dump",
    }
    if facts.elf_type != "ET_DYN":
        what = kinds.get(facts.elf_type, f"an ELF file of type {facts.elf_type}")
        raise InvalidInput(
            f"{shown} is {what}, not an ELF shared library; link your backend as a shared library "
            f"(`-shared`, CMake `add_library(triton-{name}-backend SHARED ...)`) and upload libtriton_{name}.so",
            field="file",
        )
    if facts.position_independent_executable:
        raise InvalidInput(
            f"{shown} is a (position-independent) executable, not an ELF shared library; link your backend as a "
            f"shared library (`-shared`) and upload libtriton_{name}.so",
            field="file",
        )
    if not facts.has_dynamic_symbols:
        raise InvalidInput(
            f"{shown} has no dynamic symbol table (.dynsym), so Triton cannot find its entry points; "
            "upload the library as the linker wrote it (`strip` is fine, `sstrip` is not)",
            field="file",
        )


def _check_machine(shown: str, facts: _ElfFacts, *, machine: str) -> None:
    """Refuse a library for another architecture than `machine`, or not 64-bit little-endian (x32, aarch64_be)."""
    if facts.machine != SUPPORTED_MACHINES[machine]:
        built_for = _MACHINE_NAMES.get(facts.machine, facts.machine)
        raise InvalidInput(
            f"{shown} is built for {built_for}, but the nodes are {machine}; build it for {machine}",
            field="file",
        )
    if facts.elf_class != 64 or not facts.little_endian:
        layout = f"{facts.elf_class}-bit {'little' if facts.little_endian else 'big'}-endian"
        raise InvalidInput(
            f"{shown} is a {layout} library, but Triton on {machine} nodes loads 64-bit little-endian ones; "
            f"build it for the standard {machine} Linux ABI",
            field="file",
        )


def _check_name(shown: str, *, name: str) -> None:
    """Refuse a file name other than `libtriton_<name>.so` (Triton "Backends": `<name>/libtriton_<name>.so`)."""
    expected = f"libtriton_{name}.so"
    if shown != expected:
        raise InvalidInput(
            f"{shown} is not named {expected}: Triton loads the backend {name!r} from "
            f"<backend-dir>/{name}/{expected}; rename the file to {expected} (or name the backend after it)",
            field="file",
        )


def _check_entry_points(shown: str, facts: _ElfFacts) -> None:
    """Refuse a library that does not export every REQUIRED_ENTRY_POINTS function."""
    missing = [entry for entry in REQUIRED_ENTRY_POINTS if entry not in facts.exported_functions]
    if missing:
        raise InvalidInput(
            f"{shown} does not export {', '.join(missing)}, which Triton requires of every backend; define it "
            'with C linkage (`extern "C"`, TRITONBACKEND_ISPEC from tritonbackend.h) and default visibility, '
            "then rebuild",
            field="file",
        )


def _check_server_functions(shown: str, facts: _ElfFacts, *, server: _ElfFacts, server_library: Path) -> None:
    """Refuse a library whose strongly bound server calls are not all exported by the server library."""
    missing = sorted(_server_calls(facts.undefined_strong) - server.exported)
    if missing:
        raise InvalidInput(
            f"{shown} calls {', '.join(missing)}, which the Triton that will load it ({server_library.name}) does "
            "not have: it was built against a newer Triton backend API; rebuild it against this Triton's release "
            "of triton-inference-server/core (its tritonbackend.h and tritonserver.h)",
            field="file",
        )


def _check_api_version(shown: str, *, declared: tuple[int, int], server: tuple[int, int]) -> None:
    """Refuse a declared API version Triton cannot serve: another major, or a minor above Triton's."""
    if declared[0] != server[0] or declared[1] > server[1]:
        why = "the major versions differ" if declared[0] != server[0] else "its minor version is newer"
        raise InvalidInput(
            f"{shown} is built for TRITONBACKEND API {declared[0]}.{declared[1]}, but the Triton that will load it "
            f"serves {server[0]}.{server[1]} ({why}; a backend needs the same major and a minor no greater than "
            f"Triton's); rebuild it against TRITONBACKEND API {server[0]}.{server[1]}, or against an older "
            f"{server[0]}.x",
            field="file",
        )


def _check_needed(
    shown: str, facts: _ElfFacts, *, shipped: Collection[str], server: _ElfFacts, server_library: Path
) -> None:
    """Refuse a library that needs libraries neither shipped, system, nor the server library's (see the caller)."""
    provided = set(shipped) | SYSTEM_LIBRARIES | set(server.needed)
    provided |= {SERVER_LIBRARY_NAME, server_library.name} | ({server.soname} if server.soname else set())
    missing = [
        needed for needed in facts.needed if needed not in provided and not fnmatch.fnmatchcase(needed, _LOADER_PATTERN)
    ]
    if missing:
        raise InvalidInput(
            f"{shown} needs {', '.join(missing)}, which {'are' if len(missing) > 1 else 'is'} neither in the upload "
            "nor a system library every Triton container has nor loaded with Triton's server library; put "
            f"{'them' if len(missing) > 1 else 'it'} in the upload beside {shown}, and link {shown} with "
            "`-Wl,-rpath,'$ORIGIN'` so that the loader looks there",
            field="file",
        )


def _server_calls(symbols: Iterable[str]) -> set[str]:
    """The names among `symbols` of Triton's backend and server C APIs."""
    return {symbol for symbol in symbols if symbol.startswith(_SERVER_API_PREFIXES)}


def _is_version(value: object) -> bool:
    """Whether `value` is (major, minor): a pair of integers >= 0 (not bools)."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) and part >= 0 for part in value)
    )


def check_library_job(job_path: Path) -> dict[str, Any]:
    """Sandbox child (`builds.sandbox.run_in_sandbox`): `check_backend_library` with the arguments of the JSON job
    file `job_path` ({"path", "name", "machine", "server_library", "shipped", "declared", "server_api_version"});
    returns the report as JSON data (entry points, needed libraries, search path, "1.19", machine)."""
    job = json.loads(job_path.read_text())
    report = check_backend_library(
        Path(job["path"]),
        name=job["name"],
        machine=job["machine"],
        server_library=Path(job["server_library"]),
        shipped=job["shipped"],
        declared_api_version=tuple(job["declared"]) if job["declared"] else None,
        server_api_version=tuple(job["server_api_version"]),
    )
    return {
        "entry_points": list(report.entry_points),
        "optional_entry_points": list(report.optional_entry_points),
        "needed_libraries": list(report.needed_libraries),
        "search_path": list(report.search_path),
        "api_version": ".".join(str(part) for part in report.api_version),
        "machine": report.machine,
    }

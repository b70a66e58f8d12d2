"""Custom Triton backend libraries checked before Conch accepts them (`builds.backend_library`).

Every library here is a real ELF file: Triton's Python backend and server library from the nvidia-pytriton wheel
(Triton 2.51), the tritonserver executable, markupsafe's compiled extension (x86_64 from the venv, aarch64 from its
PyPI wheel, downloaded once per session), and a small backend that gcc builds here (the machine's documented
compiler) where a case needs a library no package ships. Only the "not an ELF" case writes bytes of its own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builds.backend_library import (
    OPTIONAL_ENTRY_POINTS,
    BackendLibraryReport,
    check_backend_library,
    find_server_library,
    read_backend_api_version,
)
from conch.errors import InvalidInput, Unavailable
from tritonserving.server import TritonInstallation, locate_installation

#: The Python backend's own library beside it in the wheel: reached through its RPATH
#: ($ORIGIN/../../../../nvidia_pytriton.libs), where auditwheel put a renamed copy of libarchive.
PYTHON_BACKEND_SHIPPED = ("libarchive-3508abb0.so.13.6.0",)

# A backend as small as Triton accepts: the required entry point, one optional one, calls into the server, libc
# and a library of its own shipped beside it (_HELPER_SOURCE). TRITONBACKEND_ModelInstanceReportLoad is not a
# function of any Triton release (it stands for one of a newer API than the server's); it is referenced only when
# NEWER_API is defined, weakly when WEAK_NEWER_API is.
_BACKEND_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
int tiny_helper(void);
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
#if defined(NEWER_API) || defined(WEAK_NEWER_API)
#ifdef WEAK_NEWER_API
__attribute__((weak))
#endif
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportLoad(void* instance, double load);
#endif

TRITONSERVER_Error* TRITONBACKEND_Initialize(void* backend) {
  uint32_t major, minor;
  if (getenv("TINY_BACKEND_OFF") || !tiny_helper()) return 0;
  return TRITONBACKEND_ApiVersion(&major, &minor);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(void* instance, void** requests, uint32_t count) {
#ifdef NEWER_API
  return TRITONBACKEND_ModelInstanceReportLoad(instance, 0.5);
#elif defined(WEAK_NEWER_API)
  if (TRITONBACKEND_ModelInstanceReportLoad) return TRITONBACKEND_ModelInstanceReportLoad(instance, 0.5);
#endif
  return 0;
}
"""
_HELPER_SOURCE = "int tiny_helper(void) { return 1; }\n"


@pytest.fixture(scope="session")
def triton() -> TritonInstallation:
    return locate_installation()


@pytest.fixture(scope="session")
def server_library(triton: TritonInstallation) -> Path:
    return find_server_library(triton.libs_dir)


@pytest.fixture(scope="session")
def built_backends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The backend of `_BACKEND_SOURCE` built by gcc as `libtriton_tiny.so`, three ways, by variant:
    "plain", "newer_api" (calls a function the server lacks) and "weak_newer_api" (references it weakly); each
    needs `libtiny_helper.so` (built beside it) and finds it through its RUNPATH, $ORIGIN."""
    compiler = shutil.which("gcc")
    assert compiler is not None, "gcc (on every Conch machine, docs of the machine kind) is needed to build the backend"
    root = tmp_path_factory.mktemp("built-backends")
    source = root / "backend.c"
    source.write_text(_BACKEND_SOURCE)
    helper_source = root / "helper.c"
    helper_source.write_text(_HELPER_SOURCE)
    helper = root / "libtiny_helper.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libtiny_helper.so", "-o", str(helper), str(helper_source)],
        check=True,
        timeout=60,
    )
    built = {}
    for variant, defines in (("plain", []), ("newer_api", ["-DNEWER_API"]), ("weak_newer_api", ["-DWEAK_NEWER_API"])):
        target = root / variant / "libtriton_tiny.so"
        target.parent.mkdir()
        subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-O1",
                *defines,
                "-o",
                str(target),
                str(source),
                f"-L{root}",
                "-ltiny_helper",
                "-Wl,-rpath,$ORIGIN",
            ],
            check=True,
            timeout=60,
        )
        built[variant] = target
    return built


def _copy(source: Path, folder: Path, name: str) -> Path:
    target = folder / name
    shutil.copyfile(source, target)
    return target


def test_python_backend_of_the_wheel_passes(triton: TritonInstallation, server_library: Path) -> None:
    # given Triton's own Python backend and the server library that loads it
    # when it is checked as backend "python" for x86_64 nodes, its wheel-private libarchive shipped
    report = check_backend_library(
        triton.python_backend_library,
        name="python",
        machine="x86_64",
        server_library=server_library,
        shipped=PYTHON_BACKEND_SHIPPED,
    )

    # then it passes, with every entry point Triton 2.51 looks up (all but ModelInstanceReady, newer)
    assert report.name == "python"
    assert report.machine == "x86_64"
    assert report.entry_points == (
        "TRITONBACKEND_ModelInstanceExecute",
        "TRITONBACKEND_Initialize",
        "TRITONBACKEND_Finalize",
        "TRITONBACKEND_GetBackendAttribute",
        "TRITONBACKEND_ModelInitialize",
        "TRITONBACKEND_ModelFinalize",
        "TRITONBACKEND_ModelInstanceInitialize",
        "TRITONBACKEND_ModelInstanceFinalize",
    )
    assert report.optional_entry_points == tuple(
        entry for entry in OPTIONAL_ENTRY_POINTS if entry != "TRITONBACKEND_ModelInstanceReady"
    )
    # its needs: the server library under the wheel's renamed name, libarchive (shipped), the CUDA runtime the
    # server library needs too, and the C/C++ runtimes
    assert report.needed_libraries == (
        "libtritonserver-717102f0.so",
        "libarchive-3508abb0.so.13.6.0",
        "libcudart-09529672.so.12.6.77",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libc.so.6",
        "ld-linux-x86-64.so.2",
    )
    assert report.search_path == ("$ORIGIN/../../../../nvidia_pytriton.libs",)
    assert len(report.server_functions) == 121
    assert {"TRITONBACKEND_ApiVersion", "TRITONSERVER_ErrorNew", "TRITONBACKEND_RequestInput"} <= set(
        report.server_functions
    )
    assert all(name.startswith(("TRITONBACKEND_", "TRITONSERVER_")) for name in report.server_functions)
    assert report.api_version == (1, 19)
    assert report.declared_api_version is None


def test_backend_api_version_of_the_wheel_triton(server_library: Path) -> None:
    # given Triton 2.51's server library; when its TRITONBACKEND_ApiVersion is called in a child; then it is 1.19
    assert server_library.name == "libtritonserver-717102f0.so"
    assert read_backend_api_version(server_library) == (1, 19)


def test_backend_api_version_of_a_library_that_is_not_triton(x86_extension: Path) -> None:
    # given a shared library without TRITONBACKEND_ApiVersion; when the child calls it; then Unavailable says so
    with pytest.raises(Unavailable) as raised:
        read_backend_api_version(x86_extension)

    assert "the child process exited with code 1" in raised.value.detail
    assert "TRITONBACKEND_ApiVersion" in raised.value.detail


def test_library_without_entry_points_is_refused(tmp_path: Path, x86_extension: Path, server_library: Path) -> None:
    # given a real x86_64 shared library that is no backend, named as one
    library = _copy(x86_extension, tmp_path, "libtriton_foo.so")

    # when it is checked; then the missing required entry point is named
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="foo", machine="x86_64", server_library=server_library)

    assert raised.value.field == "file"
    assert raised.value.detail == (
        "libtriton_foo.so does not export TRITONBACKEND_ModelInstanceExecute, which Triton requires of every "
        'backend; define it with C linkage (`extern "C"`, TRITONBACKEND_ISPEC from tritonbackend.h) and default '
        "visibility, then rebuild"
    )
    assert raised.value.refusals == ()


def test_library_for_another_architecture_is_refused(
    tmp_path: Path, aarch64_extension: Path, server_library: Path
) -> None:
    # given a real AArch64 shared library named as a backend
    library = _copy(aarch64_extension, tmp_path, "libtriton_foo.so")

    # when it is checked for x86_64 nodes; then both architectures are named
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="foo", machine="x86_64", server_library=server_library)

    assert raised.value.field == "file"
    assert raised.value.detail == "libtriton_foo.so is built for AArch64, but the nodes are x86_64; build it for x86_64"


def test_library_for_aarch64_nodes_passes_the_architecture_check(
    tmp_path: Path, aarch64_extension: Path, server_library: Path
) -> None:
    # given the same AArch64 library; when it is checked for aarch64 nodes; then what stops it is the entry point
    library = _copy(aarch64_extension, tmp_path, "libtriton_foo.so")

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="foo", machine="aarch64", server_library=server_library)

    assert raised.value.detail.startswith("libtriton_foo.so does not export TRITONBACKEND_ModelInstanceExecute")


def test_x86_library_for_aarch64_nodes_is_refused(triton: TritonInstallation, server_library: Path) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            triton.python_backend_library, name="python", machine="aarch64", server_library=server_library
        )

    assert raised.value.detail == (
        "libtriton_python.so is built for x86-64, but the nodes are aarch64; build it for aarch64"
    )


def test_wrong_file_name_is_refused(tmp_path: Path, triton: TritonInstallation, server_library: Path) -> None:
    # given the Python backend under another name than Triton looks for
    library = _copy(triton.python_backend_library, tmp_path, "libpython_backend.so")

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            library, name="python", machine="x86_64", server_library=server_library, shipped=PYTHON_BACKEND_SHIPPED
        )

    assert raised.value.detail == (
        "libpython_backend.so is not named libtriton_python.so: Triton loads the backend 'python' from "
        "<backend-dir>/python/libtriton_python.so; rename the file to libtriton_python.so (or name the backend "
        "after it)"
    )


def test_file_that_is_not_elf_is_refused(tmp_path: Path, server_library: Path) -> None:
    # given the build script where the library should be (the one synthetic file of this module)
    library = tmp_path / "libtriton_foo.so"
    library.write_text("#!/bin/sh\nc++ -shared -o libtriton_foo.so backend.cc\n")

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="foo", machine="x86_64", server_library=server_library)

    assert raised.value.field == "file"
    assert raised.value.detail == (
        "libtriton_foo.so is not an ELF shared library (it does not start with the ELF magic bytes 7f 45 4c 46); "
        "upload the compiled libtriton_foo.so your backend's build produced (not its source, an archive or a static "
        "library)"
    )


def test_library_cut_short_is_refused(tmp_path: Path, triton: TritonInstallation, server_library: Path) -> None:
    # given the first 64 KiB of the real Python backend (an upload that broke off)
    library = tmp_path / "libtriton_python.so"
    library.write_bytes(triton.python_backend_library.read_bytes()[: 64 * 1024])

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="python", machine="x86_64", server_library=server_library)

    assert raised.value.detail.startswith(
        "libtriton_python.so is not an ELF shared library (its ELF structure is broken or cut short: "
    )


def test_executable_is_refused(tmp_path: Path, triton: TritonInstallation, server_library: Path) -> None:
    # given the tritonserver executable (position-independent: ELF type ET_DYN, like a library) named as a backend
    library = _copy(triton.binary, tmp_path, "libtriton_foo.so")

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(library, name="foo", machine="x86_64", server_library=server_library)

    assert raised.value.detail == (
        "libtriton_foo.so is a (position-independent) executable, not an ELF shared library; link your backend as "
        "a shared library (`-shared`) and upload libtriton_foo.so"
    )


@pytest.mark.parametrize("declared", [(1, 19), (1, 0)])
def test_declared_api_version_the_server_serves_passes(
    declared: tuple[int, int], triton: TritonInstallation, server_library: Path
) -> None:
    report = check_backend_library(
        triton.python_backend_library,
        name="python",
        machine="x86_64",
        server_library=server_library,
        shipped=PYTHON_BACKEND_SHIPPED,
        declared_api_version=declared,
    )

    assert report.declared_api_version == declared
    assert report.api_version == (1, 19)


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        ((1, 20), "its minor version is newer"),
        ((2, 0), "the major versions differ"),
        ((0, 9), "the major versions differ"),
    ],
)
def test_declared_api_version_the_server_cannot_serve_is_refused(
    declared: tuple[int, int], why: str, triton: TritonInstallation, server_library: Path
) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            triton.python_backend_library,
            name="python",
            machine="x86_64",
            server_library=server_library,
            shipped=PYTHON_BACKEND_SHIPPED,
            declared_api_version=declared,
        )

    assert raised.value.detail == (
        f"libtriton_python.so is built for TRITONBACKEND API {declared[0]}.{declared[1]}, but the Triton that will "
        f"load it serves 1.19 ({why}; a backend needs the same major and a minor no greater than Triton's); rebuild "
        "it against TRITONBACKEND API 1.19, or against an older 1.x"
    )


def test_missing_needed_library_is_refused(triton: TritonInstallation, server_library: Path) -> None:
    # given the Python backend with nothing shipped beside it
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            triton.python_backend_library, name="python", machine="x86_64", server_library=server_library
        )

    # then only libarchive is missing: the server library (its SONAME), the CUDA runtime the server library needs
    # and the system libraries are found
    assert raised.value.detail == (
        "libtriton_python.so needs libarchive-3508abb0.so.13.6.0, which is neither in the upload nor a system "
        "library every Triton container has nor loaded with Triton's server library; put it in the upload beside "
        "libtriton_python.so, and link libtriton_python.so with `-Wl,-rpath,'$ORIGIN'` so that the loader looks "
        "there"
    )


def test_refusals_are_gathered(tmp_path: Path, triton: TritonInstallation, server_library: Path) -> None:
    # given the Python backend misnamed, nothing shipped, declaring a newer API
    library = _copy(triton.python_backend_library, tmp_path, "libtriton_py.so")

    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            library, name="python", machine="x86_64", server_library=server_library, declared_api_version=(1, 20)
        )

    # then the first is raised, carrying all three in the order checked
    details = [refusal.detail for refusal in raised.value.refusals]
    assert len(details) == 3
    assert details[0] == raised.value.detail
    assert details[0].startswith("libtriton_py.so is not named libtriton_python.so")
    assert details[1].startswith("libtriton_py.so is built for TRITONBACKEND API 1.20")
    assert details[2].startswith("libtriton_py.so needs libarchive-3508abb0.so.13.6.0,")


def test_built_backend_passes(built_backends: dict[str, Path], server_library: Path) -> None:
    # given a backend gcc built here, which calls TRITONBACKEND_ApiVersion and needs libc and its own helper
    # when it is checked with the helper shipped beside it
    report = check_backend_library(
        built_backends["plain"],
        name="tiny",
        machine="x86_64",
        server_library=server_library,
        shipped=("libtiny_helper.so", "README.md"),
    )

    # then it passes

    assert report == BackendLibraryReport(
        name="tiny",
        machine="x86_64",
        entry_points=("TRITONBACKEND_ModelInstanceExecute", "TRITONBACKEND_Initialize"),
        optional_entry_points=("TRITONBACKEND_Initialize",),
        server_functions=("TRITONBACKEND_ApiVersion",),
        needed_libraries=("libtiny_helper.so", "libc.so.6"),
        search_path=("$ORIGIN",),
        api_version=(1, 19),
        declared_api_version=None,
    )


def test_built_backend_without_its_helper_is_refused(built_backends: dict[str, Path], server_library: Path) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            built_backends["plain"], name="tiny", machine="x86_64", server_library=server_library, shipped=("x.so",)
        )

    assert raised.value.detail.startswith(
        "libtriton_tiny.so needs libtiny_helper.so, which is neither in the upload nor a system library"
    )


def test_backend_calling_a_function_the_server_lacks_is_refused(
    built_backends: dict[str, Path], server_library: Path
) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_backend_library(
            built_backends["newer_api"],
            name="tiny",
            machine="x86_64",
            server_library=server_library,
            shipped=("libtiny_helper.so",),
        )

    assert raised.value.detail == (
        "libtriton_tiny.so calls TRITONBACKEND_ModelInstanceReportLoad, which the Triton that will load it "
        "(libtritonserver-717102f0.so) does not have: it was built against a newer Triton backend API; rebuild it "
        "against this Triton's release of triton-inference-server/core (its tritonbackend.h and tritonserver.h)"
    )


def test_backend_referencing_a_missing_function_weakly_passes(
    built_backends: dict[str, Path], server_library: Path
) -> None:
    # a weak reference resolves to NULL when the server lacks the function: the library still loads
    report = check_backend_library(
        built_backends["weak_newer_api"],
        name="tiny",
        machine="x86_64",
        server_library=server_library,
        shipped=("libtiny_helper.so",),
    )

    assert report.server_functions == ("TRITONBACKEND_ApiVersion", "TRITONBACKEND_ModelInstanceReportLoad")


def test_server_library_that_is_not_triton_is_unavailable(triton: TritonInstallation, x86_extension: Path) -> None:
    with pytest.raises(Unavailable) as raised:
        check_backend_library(
            triton.python_backend_library, name="python", machine="x86_64", server_library=x86_extension
        )

    assert "does not export TRITONBACKEND_ApiVersion" in raised.value.detail


def test_callers_mistakes_are_value_errors(triton: TritonInstallation, server_library: Path) -> None:
    library = triton.python_backend_library
    with pytest.raises(ValueError, match="machine 'arm64' is not one of"):
        check_backend_library(library, name="python", machine="arm64", server_library=server_library)
    with pytest.raises(ValueError, match="backend name must not be empty"):
        check_backend_library(library, name="", machine="x86_64", server_library=server_library)
    with pytest.raises(ValueError, match="declared_api_version must be"):
        check_backend_library(
            library, name="python", machine="x86_64", server_library=server_library, declared_api_version=(1, -1)
        )


def test_find_server_library_in_a_folder_without_one(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as raised:
        find_server_library(tmp_path)

    assert raised.value.detail.startswith(f"{tmp_path} holds no libtritonserver*.so")

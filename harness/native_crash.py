"""Real packages whose shared library misbehaves when loaded: a native crash or a hang.

A ``.pt2`` is a zip holding the model's shared library. These helpers compile a
tiny C library whose ``__attribute__((constructor))`` runs at ``dlopen`` (as the
package's own static initialisers and constants upload do) and either raises
``SIGSEGV`` (or ``SIGBUS``), never returns, or ends the process with ``_exit(0)``, and swap it into a copy of a real demo package in
place of each ``.so``. The metadata stays the package's own, so every check
before the load passes and the loader itself meets the bad code: what a package
built for another GPU or from a corrupted inductor cache does to a server.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

CONSTRUCTORS = {
    "segv": (
        "#include <signal.h>\n"
        "__attribute__((constructor)) static void crash_on_load(void) { raise(SIGSEGV); }\n"
    ),
    "hang": (
        "#include <unistd.h>\n"
        "__attribute__((constructor)) static void hang_on_load(void) { for (;;) sleep(1000); }\n"
    ),
    "bus": (
        "#include <signal.h>\n"
        "__attribute__((constructor)) static void bus_error_on_load(void) { raise(SIGBUS); }\n"
    ),
    "exit0": (
        "#include <unistd.h>\n"
        "__attribute__((constructor)) static void exit_on_load(void) { _exit(0); }\n"
    ),
}
"""Behaviour name to the C source of the library's constructor."""


def native_library(behaviour: str, workdir: Path) -> Path:
    """Compiles the shared library for ``behaviour`` (a key of :data:`CONSTRUCTORS`) with ``cc``."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / f"{behaviour}.c"
    source.write_text(CONSTRUCTORS[behaviour])
    library = workdir / f"lib{behaviour}.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True
    )
    return library


def swap_library(package: Path, library: Path, dest: Path) -> Path:
    """Writes ``dest``: ``package`` with every ``.so`` member replaced by ``library``.

    Also writes ``dest``'s ``.sha256`` (the digest check passes: the file is
    what its owner meant to ship).
    """
    payload = library.read_bytes()
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            data = payload if info.filename.endswith(".so") else src.read(info)
            out.writestr(info, data)
    from predictor.packages.digest import sha256_file

    dest.with_name(dest.name + ".sha256").write_text(f"{sha256_file(dest)}  {dest.name}\n")
    return dest


def misbehaving_model_dir(package_dir: Path, behaviour: str, dest: Path) -> Path:
    """A copy of ``package_dir`` whose one ``.pt2`` misbehaves on load (:data:`CONSTRUCTORS`)."""
    dest.mkdir(parents=True, exist_ok=True)
    (package,) = sorted(package_dir.glob("*.pt2"))
    for item in package_dir.iterdir():
        if item.is_file() and item.suffix not in (".pt2", ".sha256"):
            shutil.copy2(item, dest / item.name)
    library = native_library(behaviour, dest / ".build")
    swap_library(package, library, dest / package.name)
    shutil.rmtree(dest / ".build")
    return dest

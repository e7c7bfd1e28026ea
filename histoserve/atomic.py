"""Files written whole or not at all, in folders never reached through a symlink, read without blocking.

:func:`atomic_path` yields a fresh hidden temp file beside the final name
(created exclusively, never through a symlink), and after the caller has
written it: fsync, ``os.replace`` onto the final name (which replaces a
symlink there rather than following it), fsync of the folder. A crash leaves
the old state or a temp file; readers never see half a file.

Folders: below a root (``--out``, which may itself be a symlink: users point
it at another disk on purpose) every folder a run creates, writes or unlinks
in is opened one name at a time relative to the folder above it
(``O_DIRECTORY | O_NOFOLLOW``, :func:`open_folder`), and the temp file is
created, checked, renamed and unlinked relative to that open folder. A
symlink planted at ``<out>/pt_files``, ``<out>/incomplete`` or ``<out>/qc``
is refused (:class:`UnsafeFolder`), never followed: no file outside
``--out`` is replaced or deleted.

Temp names carry a full uuid4 (:func:`temp_path`), never a PID: the pods of a
Kubernetes Job are all PID 1 and share the output volume. A killed run's temp
file is removed by the next run that claims the same slide
(:func:`remove_stale_temps`), since only the claim's holder may write it; the
temp files no claim covers (QC pictures, the report) are swept at a run's
start when no live process holds their lock (:func:`sweep_dead_temps`).

Reading what is in ``--out`` (:func:`open_regular`): opened with
``O_NONBLOCK`` (a FIFO planted at a name never hangs the run), without
following a symlink unless asked, and accepted only when it is a regular
file (:class:`NotRegularFile`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_NAME_MAX_BYTES = 255
_HASH_HEX = 16  # of the full name, in a cut temp prefix: unique per final name
_TEMP_TAG = re.compile(r"[0-9a-f]{32}\.tmp")


class UnsafeFolder(OSError):
    """A folder inside the root is a symlink or no folder: nothing is written through it."""


class NotRegularFile(OSError):
    """A name that should be a regular file is a FIFO, device, folder or (not followed) symlink."""


@contextlib.contextmanager
def atomic_path(
    final: Path,
    *,
    root: Path | None = None,
    before_replace: Callable[[], None] | None = None,
    lock: bool = True,
) -> Iterator[Path]:
    """Yields a fresh hidden temp file beside ``final``; renamed onto it (fsynced) if no error.

    The temp file (:func:`temp_path`) is created empty here, exclusively and
    without following a symlink (``O_CREAT | O_EXCL | O_NOFOLLOW``), so the
    caller (h5py, torch, PIL: they take a path) writes into a file this
    process made; it must still be that same regular file, in that same
    folder, when it is renamed. ``os.replace`` replaces whatever ``final``
    names, a symlink included, and never writes through it. ``root``: the
    folder ``final``'s folders are under (default: ``final``'s own folder);
    it may be a symlink, the folders between it and ``final`` may not
    (:func:`open_folder`; created when missing). ``before_replace`` is called
    once the temp file is whole and synced, right before the rename: what it
    raises leaves ``final`` untouched. On any error the temp file is removed
    and ``final`` is untouched (a reader sees the old file or the new, never half).
    ``lock``: hold an exclusive ``flock`` on the temp file while writing, which
    tells :func:`sweep_dead_temps` it is alive; False for HDF5, whose library
    takes that same lock on the file itself while it writes.

    Raises:
        UnsafeFolder: A folder below ``root`` is a symlink or no folder.
        OSError: The folder cannot be written, or the temp file was replaced meanwhile.
    """
    final = Path(final)
    with open_folder(final.parent if root is None else Path(root), final.parent) as dir_fd:
        name = temp_path(final).name
        fd = os.open(name, _CREATE_FLAGS, 0o666, dir_fd=dir_fd)
        try:
            if lock:  # held while alive: see sweep_dead_temps
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            created = os.fstat(fd)
            yield final.parent / name
            _sync_temp(dir_fd, name, (created.st_dev, created.st_ino), final.parent)
            if before_replace is not None:
                before_replace()
            os.replace(name, final.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise
        finally:
            os.close(fd)


@contextlib.contextmanager
def open_folder(root: Path, folder: Path, *, create: bool = True) -> Iterator[int | None]:
    """``folder`` (``root`` or below it) opened as a folder; None when missing and not ``create``.

    ``root`` is followed (it may be a symlink); each name between ``root``
    and ``folder`` is opened relative to the one above it with
    ``O_DIRECTORY | O_NOFOLLOW`` (and made first when ``create``), so what
    the descriptor names is inside ``root`` whatever is swapped meanwhile.

    Raises:
        UnsafeFolder: One of those names is a symlink or no folder.
        OSError: ``root`` cannot be opened (or made).
    """
    fd = _open_folder(Path(root), Path(folder), create)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _open_folder(root: Path, folder: Path, create: bool) -> int | None:
    parts = folder.relative_to(root).parts
    if create:
        root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root, _DIR_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        if create:
            raise
        return None
    for depth, part in enumerate(parts, 1):
        try:
            child = _open_child(fd, part, root.joinpath(*parts[:depth]), create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _open_child(dir_fd: int, name: str, path: Path, create: bool) -> int | None:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=dir_fd)
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        what = "a symbolic link" if link else f"not a folder ({exc.strerror})"
        raise UnsafeFolder(
            f"{path} is {what}: histoserve embed never writes or deletes through one "
            "inside --out (that would change files elsewhere); remove it, or give another --out"
        ) from exc


def check_folders(root: Path, folders: Iterable[Path]) -> None:
    """Raises :class:`UnsafeFolder` for the first of ``folders`` (under ``root``) reached
    through a symlink or no folder; missing ones are fine (they are made when written)."""
    for folder in folders:
        with open_folder(root, folder, create=False):
            pass


def temp_path(final: Path) -> Path:
    """A hidden name beside ``final`` nobody else picks: ``.<name>.<uuid4 hex>.tmp``.

    A full random uuid4, not the PID: the pods of a Job are all PID 1 and
    share the output volume. The name part is cut (by bytes) so that the temp
    name fits the 255-byte file name limit whenever ``final``'s does.
    """
    return final.parent / f"{_temp_prefix(final.name)}{uuid.uuid4().hex}.tmp"


def _temp_prefix(name: str) -> str:
    """``.<name>.``; a name too long for that is cut and followed by a hash of it in full.

    ``.<cut>~<16 hex of sha256(name)>.``: two names sharing their first 200
    bytes still get two prefixes, so :func:`remove_stale_temps` for one never
    takes the other's live temp file.
    """
    room = _NAME_MAX_BYTES - len(".") - len(".") - 32 - len(".tmp")
    if len(os.fsencode(name)) <= room:
        return f".{name}."
    tag = hashlib.sha256(os.fsencode(name)).hexdigest()[:_HASH_HEX]
    cut = name
    while len(os.fsencode(cut)) > room - 1 - _HASH_HEX:
        cut = cut[:-1]  # whole characters: no half of a UTF-8 sequence
    return f".{cut}~{tag}."


def remove_stale_temps(final: Path, *, root: Path | None = None) -> int:
    """Removes the temp files :func:`temp_path` made for ``final`` by runs that died.

    Call it only while holding the slide's claim: then no live process is
    writing ``final``, and a killed run's temp (gigabytes for a big slide)
    does not stay behind forever. Matches ``.<name>.<32 hex>.tmp`` exactly, so
    another slide's temp is never taken for this one's; the folder is reached
    as :func:`open_folder` does (``root``: as for :func:`atomic_path`).
    Returns how many went.

    Raises:
        UnsafeFolder: A folder below ``root`` is a symlink or no folder.
    """
    prefix = _temp_prefix(final.name)
    removed = 0
    with open_folder(final.parent if root is None else root, final.parent, create=False) as fd:
        if fd is None:
            return 0
        with os.scandir(fd) as entries:
            for entry in entries:
                tag = entry.name[len(prefix) :]
                stale = entry.name.startswith(prefix) and _TEMP_TAG.fullmatch(tag) is not None
                if stale and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=fd)
                        removed += 1
    return removed


SWEEP_MIN_AGE_S = 60.0
"""A temp file younger than this is left alone (its writer may be about to lock it)."""


def sweep_dead_temps(
    folder: Path, *, root: Path, now_s: float | None = None, final: str | None = None
) -> int:
    """Removes the temp files (:func:`temp_path`) in ``folder`` whose writer is gone.

    A writer holds an exclusive ``flock`` on its temp file from creation to
    rename (:func:`atomic_path`), so a temp file whose lock can be taken, and
    older than :data:`SWEEP_MIN_AGE_S`, belongs to a run that was killed: its
    QC pictures, report or features stay behind otherwise. A live run's temp
    files (another shard's, on a shared volume) are never touched. Returns how
    many went; a missing folder is 0. ``final``: only the temp files of that
    name (a folder that also holds features, whose HDF5 writers may run with
    the library's locking off, as on NFS, and so hold no lock).

    Raises:
        UnsafeFolder: A folder below ``root`` is a symlink or no folder.
    """
    now_s = time.time() if now_s is None else now_s
    removed = 0
    with open_folder(root, folder, create=False) as dir_fd:
        if dir_fd is None:
            return 0
        with os.scandir(dir_fd) as entries:
            prefix = "" if final is None else _temp_prefix(final)
            names = [e.name for e in entries if _is_temp_name(e.name) and e.name.startswith(prefix)]
        for name in names:
            removed += _remove_if_dead(dir_fd, name, now_s)
    return removed


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and _TEMP_TAG.fullmatch(name[-len("0" * 32 + ".tmp") :]) is not None


def _remove_if_dead(dir_fd: int, name: str, now_s: float) -> int:
    try:
        fd = os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:  # gone, or a symlink: not ours to judge
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or now_s - info.st_mtime < SWEEP_MIN_AGE_S:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a live writer holds it
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return 0
        return 1
    finally:
        os.close(fd)


def remove_file(path: Path, *, root: Path) -> bool:
    """Unlinks ``path`` (under ``root``, reached as :func:`open_folder` does); False when absent.

    Raises:
        UnsafeFolder: A folder below ``root`` is a symlink or no folder.
    """
    with open_folder(root, path.parent, create=False) as fd:
        if fd is None:
            return False
        try:
            os.unlink(path.name, dir_fd=fd)
        except FileNotFoundError:
            return False
    return True


def open_regular(path: Path, *, follow_symlinks: bool = False, dir_fd: int | None = None) -> int:
    """A read-only descriptor of the regular file at ``path``; never blocks.

    ``O_NONBLOCK``: a FIFO there never hangs the open. A symlink is followed
    only with ``follow_symlinks``. ``dir_fd``: ``path`` is a name in that folder.

    Raises:
        NotRegularFile: A FIFO, device, folder or (not followed) symlink.
        OSError: It cannot be opened (FileNotFoundError when absent).
    """
    flags = _READ_FLAGS | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFile(f"{path} is a symbolic link, not a regular file") from exc
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "special"
        raise NotRegularFile(f"{path} is {what}, not a regular file")
    return fd


def read_regular(path: Path, max_bytes: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (:func:`open_regular`, no symlink followed).

    Raises:
        NotRegularFile: Not a regular file.
        OSError: Unreadable, or over ``max_bytes``.
    """
    with open(open_regular(path, dir_fd=dir_fd), "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{path} is over {max_bytes:,} bytes, more than such a file ever has")
    return data


def _sync_temp(dir_fd: int, name: str, identity: tuple[int, int], folder: Path) -> None:
    """fsyncs the temp file ``name``: still the regular file made, in the folder written through.

    The caller wrote it by path (``folder / name``): when that path no longer
    leads to the open folder (swapped for a symlink meanwhile), what it wrote
    went elsewhere, and nothing is renamed.
    """
    fd = os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
            raise OSError(f"temporary file {folder / name} was replaced while being written")
        os.fsync(fd)
    finally:
        os.close(fd)
    here, opened = os.stat(folder), os.fstat(dir_fd)
    if (here.st_dev, here.st_ino) != (opened.st_dev, opened.st_ino):
        raise UnsafeFolder(f"{folder} was replaced while a file was written in it: not renamed")

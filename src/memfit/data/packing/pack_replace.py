"""Replacing a dataset so that a kill at any instant leaves the old one or the new one
whole (``memfit.pack(..., overwrite=True)`` over a directory that holds a pack).

The new dataset is packed into a sibling directory, ``.<name>.memfit-new`` (an ordinary
resumable pack: its state file records the finished shards), while the old one stays in
place, untouched. When the new one is complete, the files of the directory that are not
part of the old dataset (the user's own: notes, even the pack's inputs) are hard-linked
into it, and the two directories are exchanged in one step (Linux ``renameat2`` with
``RENAME_EXCHANGE``); the old one, now under the sibling name, is deleted. Where the
filesystem cannot exchange, two renames are used, the old directory going to
``.<name>.memfit-old`` in between; a pack killed between them is put back by the next
pack into that path (:func:`recover`).

The process replacing a dataset holds an ``flock`` on the sibling (and, during the swap,
on the old directory): a second pack replacing the same directory is refused while the
first runs, and the lock goes with the process however it exits.

Example:
    >>> import tempfile
    >>> parent = Path(tempfile.mkdtemp())
    >>> staging_path(parent / "train").name, holds_pack(parent / "train")
    ('.train.memfit-new', False)
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
from collections.abc import Collection
from pathlib import Path

from memfit.atomic import TMP_MARK
from memfit.data.format.arrays_format import FORMAT as ARRAYS
from memfit.data.format.arrays_format import ArraysManifest, manifest_format
from memfit.data.format.manifest import MANIFEST, is_shard_name
from memfit.data.packing.pack_output import STATE, remove, undo
from memfit.errors import DatasetError

__all__ = ["Staging", "staging_path", "old_path", "shown_name", "holds_pack",
           "check_replaceable", "recover", "remove_leftovers"]

_NEW = ".memfit-new"
_OLD = ".memfit-old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_path(out: Path) -> Path:
    """Where the new dataset replacing ``out`` is packed: ``.<name>.memfit-new`` beside it."""
    return out.with_name(f".{out.name}{_NEW}")


def shown_name(path: Path) -> str:
    """The name a user knows ``path`` by: the dataset's own name for its staging sibling
    (a progress bar that said ``pack .data.memfit-new`` named a directory the user never
    made), ``path.name`` otherwise.

    Example:
        >>> shown_name(staging_path(Path("runs/data"))), shown_name(Path("runs/data"))
        ('data', 'data')
    """
    name = path.name
    if name.startswith(".") and name.endswith(_NEW) and len(name) > len(_NEW) + 1:
        return name[1:-len(_NEW)]
    return name


def old_path(out: Path) -> Path:
    """Where the old dataset waits between the two renames of a swap without exchange."""
    return out.with_name(f".{out.name}{_OLD}")


def _ours(name: str) -> bool:
    """A top-level name that a pack writes: manifest, state, shards (named as memfit names
    them: a user's ``mine.tfrecords`` beside a pack is the user's), temporary files."""
    return name in (MANIFEST, STATE) or is_shard_name(name) or name.startswith(TMP_MARK)


def holds_pack(out: Path) -> bool:
    """Whether ``out`` holds a pack, complete or interrupted (what overwrite replaces)."""
    return out.is_dir() and any(_ours(p.name) and not p.name.startswith(TMP_MARK)
                                for p in out.iterdir())


def _real(out: Path) -> Path:
    """``out`` with symbolic links resolved: the sibling goes beside the real directory."""
    return Path(os.path.realpath(out))


def check_replaceable(out: Path) -> None:
    """Refuses, before anything is written, a dataset directory that cannot be replaced
    by a sibling: a mount point, a directory that is not writable or whose parent is not,
    the working directory (or one holding it).

    Raises:
        DatasetError: saying why and what to do instead.
    """
    real = _real(out)
    shown = str(out)
    how = ("overwrite writes the new dataset beside the old one and swaps them, so that a "
           "failure or a kill never loses both")
    if real == real.parent or os.path.ismount(real):
        raise DatasetError(f"{shown!r} is a mount point, which cannot be swapped for another "
                           f"directory ({how}). Pack into a directory under it (e.g. -o "
                           f"{str(Path(shown) / 'data')!r}), or delete the old dataset yourself "
                           f"and pack without overwrite. Received: output={shown!r}")
    if not os.access(real, os.W_OK | os.X_OK):
        raise DatasetError(f"The output directory {shown!r} is not writable. Choose another "
                           f"output directory. Received: output={shown!r}")
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise DatasetError(f"{str(real.parent)!r}, the directory holding {shown!r}, is not "
                           f"writable ({how}, there). Pack into a writable place, or delete "
                           f"the old dataset yourself and pack without overwrite. "
                           f"Received: output={shown!r}")
    cwd = Path(os.path.realpath(os.getcwd()))
    if cwd == real or real in cwd.parents:
        raise DatasetError(f"The working directory {str(cwd)!r} is inside {shown!r}, the "
                           f"dataset being replaced: overwrite swaps in a new directory, and a "
                           f"shell here would be left in the deleted old one. Run the pack "
                           f"from another directory (`cd {str(real.parent)!r}`, then "
                           f"-o {real.name!r}). Received: output={shown!r}")


def _lock(path: Path, out: Path) -> int:
    """An exclusive ``flock`` on directory ``path``: its file descriptor.

    Raises:
        DatasetError: if another process holds it (a pack replacing ``out``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatasetError(f"Another memfit pack is replacing {str(out)!r} (it holds the lock "
                           f"on {str(path)!r}): two packs into one directory would mix their "
                           f"files. Wait for it to finish, or stop it, then rerun this "
                           f"command.") from None
    return fd


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete_tree(path: Path) -> None:
    """Deletes a directory tree, read-only subdirectories too (gone already: nothing)."""
    def writable_then_retry(func, name, _exc):
        parent = os.path.dirname(name)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            func(name)
        except OSError:
            pass

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=writable_then_retry)
    elif path.is_symlink() or path.exists():
        path.unlink()


def _complete(path: Path) -> bool:
    """A finished pack (the state goes after the manifest: both there is not finished)."""
    return (path / MANIFEST).is_file() and not (path / STATE).exists()


def recover(out: Path) -> bool:
    """Cleans what a killed replacement of ``out`` left beside it, putting a dataset back
    at ``out`` if the kill came between the two renames of a swap without exchange (the
    new one if it is complete, else the old). Returns whether a replacement had been
    killed after it began swapping (its sibling ``.memfit-old`` was there)."""
    real = _real(out)
    old = old_path(real)
    if not old.is_dir() or old.is_symlink():
        return False
    fd = _lock(old, out)
    try:
        if not real.exists():
            new = staging_path(real)
            if new.is_dir() and _complete(new):
                fd_new = _lock(new, out)
                try:
                    os.rename(new, real)
                finally:
                    os.close(fd_new)
            else:
                os.rename(old, real)
                _fsync_dir(real.parent)
                return True
            _fsync_dir(real.parent)
        _delete_tree(old)
    finally:
        os.close(fd)
    return True


def remove_leftovers(out: Path) -> None:
    """Deletes the sibling of a killed replacement of ``out`` (after a pack into ``out``
    that succeeded, which makes it stale); one that a live pack holds is left to it."""
    new = staging_path(_real(out))
    if not new.is_dir() or new.is_symlink():
        return
    try:
        fd = _lock(new, out)
    except DatasetError:
        return
    try:
        _delete_tree(new)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two directories in one step; ``False`` where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _dataset_files(out: Path) -> set[str]:
    """The relative paths the manifest or the state in ``out`` list (an arrays dataset's
    ``<split>/<feature>.npy``; shard names contain ``.tfrecord`` anyway)."""
    files: set[str] = set()
    try:
        if manifest_format(out) == ARRAYS:
            m = ArraysManifest.load(out)
            files |= {a.file for s in m.splits.values() for a in s.files.values()}
    except DatasetError:
        pass
    try:
        state = json.loads((out / STATE).read_text())
        files |= set(state.get("files", {})) | set(state.get("shards", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return files


def foreign_entries(out: Path) -> list[str]:
    """What ``out`` holds that is not part of its pack, as relative paths (top-level
    names; inside an arrays dataset's split directories, their other entries)."""
    listed = _dataset_files(out)
    split_dirs = {rel.split("/")[0] for rel in listed if "/" in rel}
    found = []
    for p in sorted(out.iterdir()):
        if _ours(p.name) or p.name in listed:
            continue
        if p.name in split_dirs and p.is_dir() and not p.is_symlink():
            found += [f"{p.name}/{q.name}" for q in sorted(p.iterdir())
                      if f"{p.name}/{q.name}" not in listed and not q.name.startswith(TMP_MARK)]
        else:
            found.append(p.name)
    return found


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:                 # no hard links here (or a file not ours to link)
        shutil.copy2(src, dst, follow_symlinks=False)


def _carry(src: Path, dst: Path, taken: Collection[Path]) -> None:
    """Puts ``src`` at ``dst`` as hard links (a copy where a link cannot be made): a tree
    merges into a directory already there; what a killed carry left is redone.

    Raises:
        DatasetError: if ``dst`` is a file of the new dataset.
    """
    if src.is_dir() and not src.is_symlink():
        if dst.is_dir() and not dst.is_symlink():
            for child in sorted(src.iterdir()):
                _carry(child, dst / child.name, taken)
            return
        if dst.exists() or dst.is_symlink():
            remove(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        return
    if dst.is_symlink() or dst.exists():
        if dst in taken:
            raise DatasetError(f"{str(src)!r} is not part of the dataset being replaced, and "
                               f"the new dataset has a file of that name. Move it out of the "
                               f"directory, then rerun this command.")
        if not dst.is_symlink() and not src.is_symlink() and os.path.samefile(src, dst):
            return
        remove(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        _link_or_copy(str(src), str(dst))


class Staging:
    """The sibling directory a pack replacing ``out`` writes into, locked by this process
    until :meth:`close`.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "d"
        >>> out.mkdir()
        >>> s = Staging(out)
        >>> s.path.name, s.leftover
        ('.d.memfit-new', False)
        >>> s.close()

    Args:
        out: the dataset directory to replace (checked with :func:`check_replaceable`).
    """

    def __init__(self, out: Path):
        check_replaceable(out)
        self.out = out
        self.real = _real(out)
        self.path = staging_path(self.real)
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_dir()):
            self.path.unlink()
        self.leftover = self.path.exists()      # what a killed replacement left
        if not self.leftover:
            self.path.mkdir()
            os.chmod(self.path, stat.S_IMODE(os.stat(self.real).st_mode))
        self._fd: int | None = None
        try:
            self._fd = _lock(self.path, out)
        except DatasetError:
            if not self.leftover:
                self.path.rmdir()
            raise
        # removed if this call fails: unless it resumes a killed pack's finished shards
        self.discard_on_failure = not self.leftover
        self.resumed = False

    def resume_or_clear(self, fingerprint: str | None) -> bool:
        """Keeps what a killed pack of the same source and options left here (returns
        ``True``: it is resumed); else empties the directory."""
        self.resumed = fingerprint is not None and self.leftover and (
            _state_fingerprint(self.path) == fingerprint
            or (_complete(self.path) and _manifest_fingerprint(self.path) == fingerprint))
        if not self.resumed:
            for p in self.path.iterdir():
                remove(p)
        self.discard_on_failure = not self.resumed
        return self.resumed

    def abandon(self) -> None:
        """After a failure: deletes the sibling, unless it holds the finished shards of an
        interrupted pack (then only this process's temporary files go)."""
        if self.discard_on_failure:
            self.discard()
        elif self.resumed:
            undo(self.path, [], set(), resuming=True)

    def swap(self, new_files: Collection[str]) -> None:
        """Carries the files of ``out`` that are not its dataset's into the new dataset
        and swaps the new one in; the old one is deleted.

        Args:
            new_files: the relative paths of the new dataset's files (never overwritten
                by a carried one).
        """
        taken = {self.path / f for f in new_files} | {self.path / MANIFEST}
        for rel in foreign_entries(self.real):
            _carry(self.real / rel, self.path / rel, taken)
        _fsync_dir(self.path)
        fd_old = _lock(self.real, self.out)    # whoever locks the sibling next waits
        try:
            if _exchange(self.path, self.real):
                _fsync_dir(self.real.parent)
                self.discard_on_failure = False
                _delete_tree(self.path)         # the old dataset, under the sibling name
            else:
                old = old_path(self.real)
                _delete_tree(old)
                os.rename(self.real, old)
                os.rename(self.path, self.real)
                _fsync_dir(self.real.parent)
                self.discard_on_failure = False
                _delete_tree(old)
        finally:
            os.close(fd_old)

    def discard(self) -> None:
        """Deletes the sibling (this call's work, or a stale one)."""
        _delete_tree(self.path)

    def close(self) -> None:
        """Releases the lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _json_field(file: Path, field: str) -> object:
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return doc.get(field) if isinstance(doc, dict) else None


def _manifest_fingerprint(path: Path) -> object:
    return _json_field(path / MANIFEST, "fingerprint")


def _state_fingerprint(path: Path) -> object:
    return _json_field(path / STATE, "fingerprint")

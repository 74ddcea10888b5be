"""The output directory of a pack: made ready (:func:`prepare_output`), resumed, and left
as it was when the pack fails.

Files are written under temporary names (``.tmp-<pid>-<name>``) and renamed when
complete; the manifest comes last. A state file (``STATE``) records the finished files
with their sha256 and what was packed (its fingerprint): rerunning an interrupted pack
with the same arguments keeps the files that still match and writes the rest; a pack
that finished is verified and left alone (:func:`already_packed`). A pack that fails
removes what it wrote, and nothing else (:func:`undo`).

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> prepare_output(out, fingerprint="f00d")
    {'fingerprint': 'f00d'}
    >>> prepare_output(out, fingerprint="f00d")["resumed"]
    True
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from memfit.atomic import TMP_MARK, file_sha256, write_text_atomic
from memfit.data.format.arrays_format import FORMAT as ARRAYS
from memfit.data.format.arrays_format import ArraysManifest, manifest_format
from memfit.data.format.manifest import MANIFEST, Manifest, is_shard_name
from memfit.errors import DatasetError
from memfit.memory.process import running
from memfit.sizes import format_size

__all__ = ["STATE", "prepare_output", "save_state", "already_packed", "check_output", "undo",
           "after_interrupt", "write_failed", "remove", "clear_stale_temporaries"]

STATE = ".memfit-pack-state.json"


# A temporary name made by memfit.atomic.temporary_name: ".tmp-<pid>-<name>".
_TEMPORARY = re.compile(rf"^{re.escape(TMP_MARK)}(\d+)-")


def remove(p: Path) -> None:
    """Deletes a file or a directory tree (gone already: nothing to do)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def clear_stale_temporaries(out: Path, keep: Collection[str]) -> None:
    """Deletes the temporary files (``.tmp-<pid>-...``, in ``out`` and its split
    subdirectories) of packs that were killed: a rerun must not leave them behind.

    Raises:
        DatasetError: if one belongs to a process still running (another pack writing
            into the same directory).
    """
    dirs = [out] + [p for p in out.iterdir() if p.is_dir() and not p.is_symlink()
                    and not p.name.startswith(TMP_MARK)]
    for d in dirs:
        for p in d.iterdir():
            match = _TEMPORARY.match(p.name)
            if match is None or p.name in keep:
                continue
            pid = int(match.group(1))
            if pid != os.getpid() and running(pid):
                raise DatasetError(
                    f"{str(p)!r} is being written by another process (pid {pid}, still "
                    f"running): two packs into one directory would mix their files. Wait "
                    f"for it to finish, or stop it, then rerun this command.")
            remove(p)


def _read_state(out: Path) -> dict[str, Any] | None:
    state_file = out / STATE
    if not state_file.exists():
        return None
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        state = None
    if not isinstance(state, dict):
        raise DatasetError(f"{str(state_file)!r}, the record of an interrupted pack, is "
                           f"damaged; pass overwrite=True (--overwrite) to start over.")
    return state


def prepare_output(out: Path, fingerprint: str | None,
                   keep: Collection[str] = ()) -> dict[str, Any]:
    """Checks the output directory; returns the resumable state (shards already done).

    ``keep``: names in ``out`` that this call made and still needs (its CSV conversion).
    The state of a fresh pack is written at once, so that a pack killed at any instant
    can be finished by rerunning it; a resumed state has ``"resumed": True``.
    """
    if out.exists() and not out.is_dir():
        raise DatasetError(f"The output {str(out)!r} is a file, not a directory. Choose a "
                           f"directory (it is created if missing).")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise DatasetError(f"The output directory {str(out)!r} is not writable.")
    clear_stale_temporaries(out, keep)
    state = _read_state(out)
    if state is not None and fingerprint is not None and state.get("fingerprint") == fingerprint:
        # Interrupted, perhaps after the manifest was written (the state goes last).
        return {**state, "resumed": True}
    if (out / MANIFEST).exists():
        raise DatasetError(f"{str(out)!r} already holds a complete memfit dataset. Choose another "
                           f"output directory, or pass overwrite=True (--overwrite) to replace it.")
    if state is not None:
        raise DatasetError(f"{str(out)!r} holds an interrupted pack of different data or options; "
                           f"rerun that pack command to finish it, or pass overwrite=True "
                           f"(--overwrite) to start over.")
    names = sorted(p.name for p in out.iterdir())
    if any(is_shard_name(n) for n in names):    # an iterable's pack: nothing to resume by
        raise DatasetError(f"{str(out)!r} holds the shards of an interrupted pack that cannot "
                           f"be resumed (its source was an iterable, which may not give the "
                           f"same data again); pass overwrite=True (--overwrite) to start "
                           f"over, or choose another output directory.")
    foreign = [n for n in names if ".tfrecord" in n and not n.startswith(TMP_MARK)]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise DatasetError(f"{str(out)!r} holds TFRecord files that no memfit pack wrote "
                           f"({', '.join(foreign[:3])}{more}): "
                           f"memfit leaves them alone, and does not write its shards beside "
                           f"them, where a reader of the directory's TFRecord files would "
                           f"take both for one dataset. Choose another output directory "
                           f"(e.g. {str(out / 'packed')!r}).")
    return _start_state(out, fingerprint)


def _start_state(out: Path, fingerprint: str | None) -> dict[str, Any]:
    if fingerprint is None:         # an iterable: a rerun cannot tell it is the same data
        return {}
    state = {"fingerprint": fingerprint}
    save_state(out, state)
    return state



def save_state(out: Path, state: dict[str, Any]) -> None:
    """Records what is finished (atomically: the old record or the new, never half)."""
    write_text_atomic(out / STATE, json.dumps(state))


def already_packed(out: Path, fingerprint: str | None,
                    keep: Collection[str]) -> tuple[Manifest | ArraysManifest, int] | None:
    """The complete dataset in ``out`` when this very pack made it (same source and
    options) and every file still has its sha256, with the number of files; else ``None``."""
    if fingerprint is None or not (out / MANIFEST).is_file() or (out / STATE).exists():
        return None
    try:
        if manifest_format(out) == ARRAYS:
            m: Manifest | ArraysManifest = ArraysManifest.load(out)
            files = {a.file: a.sha256 for s in m.splits.values() for a in s.files.values()}
        else:
            m = Manifest.load(out)
            files = {sh.file: sh.sha256 for s in m.splits.values() for sh in s.shards}
    except DatasetError:
        return None
    if m.fingerprint != fingerprint or any(
            not (out / f).is_file() or file_sha256(out / f) != sha for f, sha in files.items()):
        return None
    clear_stale_temporaries(out, keep)
    return m, len(files)


def check_output(out: Path) -> list[Path]:
    """Refuses an output path that cannot be a directory, before anything is written.

    Returns:
        The directories that do not exist yet, outermost first (this call creates them,
        and removes them again if it fails).
    """
    missing = []
    p = out.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        if not missing:
            raise DatasetError(f"The output {str(out)!r} is a file, not a directory. Choose a "
                               f"directory (it is created if missing). Received: "
                               f"output={str(out)!r}")
        raise DatasetError(f"Cannot create the output directory {str(out)!r}: {str(p)!r} is a "
                           f"file, not a directory. Choose a path under a directory. Received: "
                           f"output={str(out)!r}")
    if not os.access(p, os.W_OK | os.X_OK):
        what = "output directory" if not missing else "directory that would hold the output"
        raise DatasetError(f"The {what} {str(p)!r} is not writable. Choose another output "
                           f"directory. Received: output={str(out)!r}")
    return missing[::-1]


def undo(out: Path, made: list[Path], before: set[str], resuming: bool) -> None:
    """Removes what a failed pack call wrote, and nothing else: the directories it made;
    else the files it added (a resumed pack keeps its finished shards for the next try)."""
    if made:
        remove(made[0])
        return
    if not out.is_dir():
        return
    mine = re.compile(rf"^{re.escape(TMP_MARK)}{os.getpid()}-")
    for p in out.iterdir():
        if mine.match(p.name):
            remove(p)
        elif not resuming and p.name not in before:
            remove(p)


def after_interrupt(out: Path, made: list[Path], had_state: bool) -> str:
    """Leaves ``out`` as a Ctrl-C in a pack (not a replacement) should, and says what it
    holds: the finished shards stay for a rerun of the same command to resume from;
    where none was finished, what this call made goes (a stranger's interrupted GZIP pack
    left an empty directory), so that nothing but work kept is left behind.

    Args:
        out: the output directory; made: the directories this call created
            (:func:`check_output`); had_state: ``out`` held an interrupted pack's state
            before this call (its record is the user's, kept whatever it holds).

    Returns:
        The sentence for the command's ``interrupted`` line.
    """
    if out.is_dir():
        undo(out, [], set(), resuming=True)         # this process's temporary files
    try:
        state = _read_state(out) if out.is_dir() else None
    except DatasetError:
        state = None
    finished = len((state or {}).get("shards") or (state or {}).get("files") or {})
    if finished:
        what = "shard" if (state or {}).get("shards") else "file"
        return (f"{str(out)!r} keeps the {finished} {what}{'s' if finished != 1 else ''} "
                f"finished: rerun the same command to resume there, or delete "
                f"{str(out)!r} to start over")
    if made:
        remove(made[0])
        shown = str(out) if made[0] == out.absolute() else str(made[0])
        return f"nothing was kept ({shown!r}, which it had made, is removed)"
    if not had_state and out.is_dir():
        (out / STATE).unlink(missing_ok=True)
    return f"nothing finished was kept in {str(out)!r}"


def write_failed(e: OSError, out: Path, kept: bool, replacing: bool = False) -> DatasetError:
    """The error for a pack that the disk stopped (full, over the file-size limit...).

    Args:
        e: the error; out: the output directory.
        kept: the shards finished before are kept (a rerun resumes).
        replacing: the pack was replacing the dataset in ``out`` (``overwrite=True``),
            which is untouched.
    """
    left = ("the shards finished before are kept: rerun the same command to resume"
            if kept else "nothing of this pack was kept")
    if replacing:
        left += (f"; the dataset already in {str(out)!r} is untouched (overwrite writes the "
                 f"new one beside it, so it needs room for both until the swap)")
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DatasetError(f"The disk (or quota) holding {str(out)!r} is full ({e.strerror}); "
                            f"{left}. Free space there or choose another output directory, "
                            f"then rerun.")
    if e.errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else format_size(soft)
        return DatasetError(f"A file grew past this process's file-size limit ({limit}, "
                            f"`ulimit -f`) while packing into {str(out)!r}; {left}. Raise the "
                            f"limit (`ulimit -f unlimited`) or write smaller shards "
                            f"(shard_size=..., --shard-size 64MiB), then rerun.")
    where = f" ({e.filename})" if e.filename else ""
    return DatasetError(f"Packing into {str(out)!r} failed: {e.strerror or e}{where}; {left}. "
                        f"Fix the cause or choose another output directory, then rerun.")

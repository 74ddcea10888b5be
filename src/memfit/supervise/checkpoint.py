"""The checkpoints of a supervised run, written so that a kill at any instant leaves a
loadable one.

Layout (``WORKDIR/checkpoints/``)::

    ckpt-000007/            the newest complete checkpoint
      state.json            a CheckpointState (position, seed, history, RNG states,
                            fingerprint...) with the format, every file's sha256 and its own
      model.weights.h5      weights and optimizer state (Keras ``save_weights`` format)
      arrays.npz            variables that file lacks (seed generators) and metric states
    ckpt-000006/            the one before, kept until a newer one is complete
    .tmp-4242-ckpt-000008/  a checkpoint being written (or left by a killed writer)

A checkpoint is written into a temporary directory, every file is flushed to disk, and
the directory is renamed to its final name (one atomic step), then the directory entry
is flushed too. A directory named ``ckpt-NNNNNN`` is therefore complete unless something
other than a kill changed it since: ``state.json`` records the size and sha256 of every
other file, and a checksum of itself. :meth:`CheckpointStore.recover` (what a resuming
session calls) checks the newest checkpoint; one that fails (bit rot, a copy cut short)
is renamed ``damaged-ckpt-NNNNNN`` with a warning naming the file, and the one before is
used. Older ones beyond ``keep`` are removed only after a newer one is complete. A write
that fails (disk full, file-size limit) removes its temporary directory, keeps the
previous checkpoint and raises :class:`CheckpointWriteError`. This module does not
import TensorFlow: the parent reads positions from it.

Example:
    >>> import tempfile, pathlib
    >>> store = CheckpointStore(pathlib.Path(tempfile.mkdtemp()))
    >>> ckpt = store.write(CheckpointState(epoch=1, reason="epoch"), lambda d: None)
    >>> store.latest().position, store.latest().contents.reason
    ((1, 0), 'epoch')
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memfit import checks
from memfit.atomic import TMP_MARK, file_sha256
from memfit.errors import MemfitError, write_failure
from memfit.supervise.state import CheckpointState

__all__ = ["Checkpoint", "CheckpointStore", "CheckpointError", "CheckpointWriteError",
           "FORMAT", "STATE_NAME", "WEIGHTS_NAME", "ARRAYS_NAME", "DAMAGED_PREFIX", "where"]

FORMAT = "memfit-checkpoint"
FORMAT_VERSION = 2          # 2: state.json lists every file's size and sha256
DAMAGED_PREFIX = "damaged-"
STATE_NAME = "state.json"
WEIGHTS_NAME = "model.weights.h5"
ARRAYS_NAME = "arrays.npz"
_NAME = re.compile(r"^ckpt-(\d{6,})$")


class CheckpointError(MemfitError):
    """A checkpoint cannot be used for this run (another model, another seed...)."""


class CheckpointWriteError(MemfitError):
    """A checkpoint could not be written (disk full, file-size limit...); the previous
    one is kept.

    Attributes:
        errno: the operating system's error number (``errno.ENOSPC``...), or ``None``.
    """

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_


class _Damaged(Exception):
    """A checkpoint directory that fails its checks; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint.

    Attributes:
        path: its directory.
        seq: its sequence number (``ckpt-000007`` is 7).
        state: its ``state.json`` as written (with ``format``, ``files``, ``checksum``).
        contents: the :class:`~memfit.supervise.state.CheckpointState` it holds, checked:
            what the training and its supervisor read.
    """

    path: Path
    seq: int
    state: dict
    contents: CheckpointState

    @property
    def epoch(self) -> int:
        """The epoch to resume at."""
        return self.contents.epoch

    @property
    def step(self) -> int:
        """Steps of ``epoch`` already done (0 at an epoch boundary)."""
        return self.contents.step

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: where training resumes."""
        return self.contents.position

    @property
    def weights(self) -> Path:
        return self.path / WEIGHTS_NAME

    @property
    def arrays(self) -> Path:
        return self.path / ARRAYS_NAME


def where(epoch: int, step: int) -> str:
    """A position in words, with Keras's 1-based epoch numbers: ``(2, 0)`` is "the start
    of epoch 3", ``(2, 17)`` is "epoch 3, step 17"."""
    return f"epoch {epoch + 1}, step {step}" if step else f"the start of epoch {epoch + 1}"


def _state_checksum(state: dict) -> str:
    """The checksum a state records of itself: sha256 of its canonical JSON, without it."""
    body = {k: v for k, v in state.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _record(state: CheckpointState, files: dict[str, dict]) -> dict:
    """The ``state.json`` object of ``state``: format, time, the state, every file's size
    and sha256, and a checksum of itself (in this key order, as memfit has written it)."""
    body = state.to_json()
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "time": body.pop("time"),
              **body, "files": files}
    record["checksum"] = _state_checksum(record)
    return record


def _load(path: Path) -> tuple[dict, CheckpointState]:
    """A checkpoint directory's ``state.json`` and the state it holds, after checking it
    and every file it lists.

    Raises:
        _Damaged: the state or a file fails a check (the message names the file).
        CheckpointError: it is not a memfit checkpoint at all.
    """
    state_path = path / STATE_NAME
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Damaged(f"{str(state_path)!r} cannot be read ({e})") from None
    if not isinstance(state, dict):
        raise _Damaged(f"{str(state_path)!r} cannot be read (not a JSON object)")
    if "checksum" in state and state["checksum"] != _state_checksum(state):
        raise _Damaged(f"{str(state_path)!r} does not match its own checksum")
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(state_path)!r} is not a memfit checkpoint (format "
            f"{state.get('format')!r}). Use a new workdir, or move "
            f"{str(path.parent)!r} away.")
    try:
        contents = CheckpointState.from_json(state)
    except ValueError as e:
        raise _Damaged(f"{str(state_path)!r} holds no valid checkpoint state ({e})") from None
    files = state.get("files")
    if not isinstance(files, dict):         # format 1: written before checksums
        return state, contents
    for name, expected in files.items():
        file = path / name
        try:
            size = file.stat().st_size
        except OSError:
            raise _Damaged(f"{str(file)!r} is missing") from None
        if size != expected.get("size"):
            raise _Damaged(f"{str(file)!r} has {size} bytes, not the {expected.get('size')} "
                           f"it was written with (a copy cut short?)")
        if file_sha256(file) != expected.get("sha256"):
            raise _Damaged(f"{str(file)!r} does not match its sha256 (changed on disk since "
                           f"it was written)")
    return state, contents


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    """Flushes every file of ``directory`` and the directory itself to disk."""
    for entry in directory.iterdir():
        _fsync(entry)
    _fsync(directory)


class CheckpointStore:
    """Writes and finds the checkpoints in one directory.

    Args:
        directory: ``WORKDIR/checkpoints`` (created on the first write).
        keep: complete checkpoints to keep (at least 2: the newest and the one before).
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2):
        self.directory = Path(directory)
        self.keep = checks.count("keep", keep, minimum=2, example=2,
                                 hint="It counts the newest checkpoint and those before it.")

    def complete(self) -> list[tuple[int, Path]]:
        """``(seq, path)`` of every complete checkpoint, oldest first."""
        try:
            entries = list(self.directory.iterdir())
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = _NAME.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
        return sorted(found)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that passes its checks, or ``None`` when there is none.
        Damaged ones are passed over, and left where they are (see :meth:`recover`).

        Raises:
            CheckpointError: if the newest is not a memfit checkpoint, or every
                checkpoint there is damaged.
        """
        return self._newest_good(set_aside=False)

    def recover(self) -> Checkpoint | None:
        """Like :meth:`latest`, but a damaged checkpoint newer than the good one is
        renamed ``damaged-ckpt-NNNNNN`` (kept for a look, never used again), with a
        warning on stderr naming the file that failed.

        Raises:
            CheckpointError: as :meth:`latest`.
        """
        return self._newest_good(set_aside=True)

    def _newest_good(self, set_aside: bool) -> Checkpoint | None:
        damaged: list[tuple[Path, str]] = []
        good = None
        for seq, path in reversed(self.complete()):
            try:
                good = Checkpoint(path, seq, *_load(path))
                break
            except _Damaged as e:
                damaged.append((path, str(e)))
        if good is None and damaged:
            raise CheckpointError(
                f"No usable checkpoint in {str(self.directory)!r}: "
                + "; ".join(problem for _, problem in damaged) + ". Nothing was changed: "
                "restore the directory from a copy, or move it away to start over.")
        for path, problem in damaged if set_aside else ():
            aside = path.with_name(DAMAGED_PREFIX + path.name)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(path, aside)
            print(f"memfit: checkpoint {str(path)!r} is damaged: {problem}. It was moved to "
                  f"{aside.name!r}; resuming from {good.path.name if good else 'none'}.",
                  file=sys.stderr)
        return good

    def clean(self) -> list[Path]:
        """Removes checkpoints left half written by killed writers; returns them."""
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.directory.iterdir():
                if entry.name.startswith(TMP_MARK):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    def write(self, state: CheckpointState | Mapping[str, Any],
              fill: Callable[[Path], None]) -> Checkpoint:
        """Writes a checkpoint: ``fill(directory)`` writes the files, then ``state.json``
        (the state with its time, every file's size and sha256, and its own checksum) is
        added and the whole directory is flushed and renamed into place.

        Args:
            state: the :class:`~memfit.supervise.state.CheckpointState`, or its JSON
                object (checked by :meth:`CheckpointState.from_json`).
            fill: writes the other files into the directory it is given.

        Returns:
            The new :class:`Checkpoint`.

        Raises:
            CheckpointWriteError: the disk refused a write (full, file-size limit, read
                only); the temporary directory is removed, the previous checkpoint kept.
            ValueError: ``state`` is not a valid checkpoint state.
        """
        if not isinstance(state, CheckpointState):
            state = CheckpointState.from_json(state)
        found = self.complete()
        seq = found[-1][0] + 1 if found else 0
        name = f"ckpt-{seq:06d}"
        final = self.directory / name
        tmp = self.directory / f"{TMP_MARK}{os.getpid()}-{name}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            fill(tmp)
            files = {entry.name: {"size": entry.stat().st_size, "sha256": file_sha256(entry)}
                     for entry in sorted(tmp.iterdir())}
            state = dataclasses.replace(state, time=time.time())
            record = _record(state, files)
            (tmp / STATE_NAME).write_text(json.dumps(record), encoding="utf-8")
            _fsync_tree(tmp)
            os.rename(tmp, final)
            _fsync(self.directory)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(self._write_failed(name, found, e), e.errno) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for _, old in found[: max(0, len(found) + 1 - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return Checkpoint(final, seq, record, state)

    def _write_failed(self, name: str, found: list[tuple[int, Path]], error: OSError) -> str:
        what, hint = write_failure(error)
        kept = (f"the previous checkpoint {found[-1][1].name} is kept; {hint}, then start "
                f"the run again to resume from it" if found else
                f"there was no earlier checkpoint; {hint}, then start the run again")
        return (f"Could not write checkpoint {name} in {str(self.directory)!r}: {what}"
                f". Nothing half-written was left and {kept}.")

"""The checkpoints of a supervised run, written so that a kill at any instant leaves a
loadable one.

Layout (``WORKDIR/checkpoints/``)::

    ckpt-000007/            the newest complete checkpoint
      state.json            position (epoch, step), seed, history, RNG states, fingerprint
      model.weights.h5      weights and optimizer state (Keras ``save_weights`` format)
      arrays.npz            variables that file lacks (seed generators) and metric states
    ckpt-000006/            the one before, kept until a newer one is complete
    .tmp-4242-ckpt-000008/  a checkpoint being written (or left by a killed writer)

A checkpoint is written into a temporary directory, every file is flushed to disk, and
the directory is renamed to its final name (one atomic step), then the directory entry
is flushed too. A directory named ``ckpt-NNNNNN`` is therefore always complete; the
newest is the one to resume from. Older ones beyond ``keep`` are removed only after a
newer one is complete. This module does not import TensorFlow: the parent reads
positions from it.

Example:
    >>> import tempfile, pathlib
    >>> store = CheckpointStore(pathlib.Path(tempfile.mkdtemp()))
    >>> ckpt = store.write({"epoch": 1, "step": 0}, lambda d: None)
    >>> store.latest().position
    (1, 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from memfit.atomic import TMP_MARK
from memfit.errors import MemfitError

__all__ = ["Checkpoint", "CheckpointStore", "CheckpointError", "FORMAT", "STATE_NAME",
           "WEIGHTS_NAME", "ARRAYS_NAME", "where"]

FORMAT = "memfit-checkpoint"
FORMAT_VERSION = 1
STATE_NAME = "state.json"
WEIGHTS_NAME = "model.weights.h5"
ARRAYS_NAME = "arrays.npz"
_NAME = re.compile(r"^ckpt-(\d{6,})$")


class CheckpointError(MemfitError):
    """A checkpoint cannot be used for this run (another model, another seed...)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint.

    Attributes:
        path: its directory.
        seq: its sequence number (``ckpt-000007`` is 7).
        state: the contents of its ``state.json``.
    """

    path: Path
    seq: int
    state: dict

    @property
    def epoch(self) -> int:
        """The epoch to resume at."""
        return int(self.state["epoch"])

    @property
    def step(self) -> int:
        """Steps of ``epoch`` already done (0 at an epoch boundary)."""
        return int(self.state.get("step", 0))

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: where training resumes."""
        return self.epoch, self.step

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
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            raise ValueError(f"keep must be an integer of at least 2 (the newest checkpoint "
                             f"and the one before it). Received: keep={keep!r}")
        self.directory = Path(directory)
        self.keep = keep

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
        """The newest complete checkpoint, or ``None`` when there is none.

        Raises:
            CheckpointError: if its ``state.json`` cannot be read (not written by memfit,
                or damaged by something else than a kill).
        """
        found = self.complete()
        if not found:
            return None
        seq, path = found[-1]
        try:
            state = json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(
                f"The checkpoint {str(path)!r} cannot be read ({e}). It was not written by "
                f"memfit, or was changed since: move it away to resume from the one before, "
                f"or use a new workdir.") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(
                f"{str(path / STATE_NAME)!r} is not a memfit checkpoint (format "
                f"{state.get('format') if isinstance(state, dict) else None!r}). Use a new "
                f"workdir, or move {str(self.directory)!r} away.")
        return Checkpoint(path, seq, state)

    def clean(self) -> list[Path]:
        """Removes checkpoints left half written by killed writers; returns them."""
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.directory.iterdir():
                if entry.name.startswith(TMP_MARK):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    def write(self, state: dict, fill: Callable[[Path], None]) -> Checkpoint:
        """Writes a checkpoint: ``fill(directory)`` writes the files, then ``state.json``
        is added and the whole directory is flushed and renamed into place.

        Args:
            state: the JSON-able state (``epoch`` and ``step`` at least).
            fill: writes the other files into the directory it is given.

        Returns:
            The new :class:`Checkpoint`.
        """
        found = self.complete()
        seq = found[-1][0] + 1 if found else 0
        name = f"ckpt-{seq:06d}"
        final = self.directory / name
        tmp = self.directory / f"{TMP_MARK}{os.getpid()}-{name}"
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fill(tmp)
        state = {"format": FORMAT, "format_version": FORMAT_VERSION, "time": time.time(),
                 **state}
        (tmp / STATE_NAME).write_text(json.dumps(state), encoding="utf-8")
        _fsync_tree(tmp)
        os.rename(tmp, final)
        _fsync(self.directory)
        for _, old in found[: max(0, len(found) + 1 - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return Checkpoint(final, seq, state)

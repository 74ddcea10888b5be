"""The arrays packer: ``memfit.pack(..., format="arrays")`` writes a source as a
"memfit-arrays" directory (:mod:`memfit.data.format.arrays_format`), one ``.npy`` file per split
and feature.

Samples go to splits by the same seeded permutation as the TFRecord format
(:func:`~memfit.data.packing.pack_options.split_order`), in that shuffled order when shuffling (else
in source order). Each file is written to a temporary name and renamed; ``manifest.json``
comes last. An interrupted pack rerun with the same arguments keeps the splits whose
files' sha256 still match.

Example:
    >>> import tempfile
    >>> from memfit.data.sources.opening import open_source
    >>> out = Path(tempfile.mkdtemp())
    >>> src = open_source({"x": np.arange(6, dtype="float32").reshape(3, 2)})
    >>> manifest, kept = pack_arrays(src, out, {}, PackOptions.of(format="arrays",
    ...                                                          shuffle=False),
    ...                              fingerprint=None, progress=False)
    >>> np.load(out / "train" / "x.npy").tolist(), kept
    ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], 0)
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memfit._version import __version__
from memfit.atomic import file_sha256
from memfit.data.format.arrays_format import ArrayFile, ArraysManifest, ArraysSplit
from memfit.data.packing.pack_options import CHUNK_BYTES, PackOptions, progress_bar, split_order
from memfit.data.packing.pack_output import save_state
from memfit.data.packing.pack_replace import shown_name
from memfit.data.packing.pack_writing import HashingWriter
from memfit.data.sources.columns import ArraySource
from memfit.errors import DatasetError

__all__ = ["NpyWriter", "pack_arrays"]


class NpyWriter(HashingWriter):
    """Writes one ``.npy`` file to a temporary name, hashing the bytes that land on disk."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]):
        path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(path)
        self.dtype = dtype
        header = io.BytesIO()
        meta = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": shape}
        try:
            np.lib.format.write_array_header_1_0(header, meta)
        except ValueError:                              # a header over 64 KiB
            header = io.BytesIO()
            np.lib.format.write_array_header_2_0(header, meta)
        self.write(header.getvalue())

    def close(self) -> ArrayFile:
        """Renames the file into place; its :class:`ArrayFile` (``file`` left empty)."""
        return ArrayFile(file="", bytes=self.bytes, sha256=self.commit())


def _write_split(src: ArraySource, out: Path, split: str, idx: np.ndarray,
                 report: Callable[[int], None]) -> dict[str, ArrayFile]:
    """Writes one ``.npy`` file per feature for the samples ``idx``, in one pass over the
    source (reads ~32 MiB of rows at a time in file order, then releases their pages)."""
    dtypes = {n: np.dtype(f.dtype).newbyteorder("<") for n, f in src.features.items()}
    writers = {n: NpyWriter(out / split / f"{n}.npy", dtypes[n], (len(idx), *f.shape))
               for n, f in src.features.items()}
    try:
        sample_bytes = sum(f.sample_bytes or 1 for f in src.features.values())
        chunk = max(1, getattr(src, "chunk_bytes", CHUNK_BYTES) // sample_bytes)
        for a in range(0, len(idx), chunk):
            rows = src.take(idx[a:a + chunk])
            for name, w in writers.items():
                w.write(memoryview(np.ascontiguousarray(rows[name], dtype=dtypes[name]))
                        .cast("B"))
            src.release_pages()
            report(len(idx[a:a + chunk]))
        return {n: dataclasses.replace(w.close(), file=f"{split}/{n}.npy")
                for n, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abandon()
        raise


def _refuse_theirs(src: ArraySource, out: Path, splits: list[tuple[str, np.ndarray]],
                   done: dict[str, Any], state: dict[str, Any]) -> None:
    """A file this pack would write that it did not write before is someone else's."""
    for name, _ in splits:
        for f in src.features:
            rel = f"{name}/{f}.npy"
            # A resumed pack may have renamed a file into place and been killed before
            # recording it: it is rewritten. Otherwise the file is someone else's.
            if (out / rel).exists() and rel not in done and not state.get("resumed"):
                raise DatasetError(f"{str(out / rel)!r} already exists and memfit did not write "
                                   f"it; choose an empty output directory or pass "
                                   f"overwrite=True (--overwrite).")


def _kept(src: ArraySource, out: Path, name: str,
          done: dict[str, Any]) -> dict[str, ArrayFile] | None:
    """The files of split ``name`` an interrupted run finished, when each still has its
    sha256; else ``None`` (the split is written again)."""
    files = {}
    for f in src.features:
        rel = f"{name}/{f}.npy"
        info = done.get(rel)
        if info is None or not (out / rel).is_file() \
                or file_sha256(out / rel) != info["sha256"]:
            return None
        files[f] = ArrayFile(file=rel, bytes=int(info["bytes"]), sha256=info["sha256"])
    return files


def pack_arrays(src: ArraySource, out: Path, state: dict[str, Any], options: PackOptions, *,
                fingerprint: str | None, progress: bool) -> tuple[ArraysManifest, int]:
    """Writes ``src`` as a "memfit-arrays" directory (see the module docstring).

    Args:
        src: the source (fixed-shape features); out: the output directory
            (:func:`~memfit.data.packing.pack_output.prepare_output` made it ready and returned
            ``state``).
        options: the pack's options; fingerprint: what is packed.
        progress: show a progress bar.

    Returns:
        The manifest written and the number of files kept from an interrupted run.
    """
    _, parts = split_order(src.length, options)
    done: dict[str, dict] = dict(state.get("files", {}))
    _refuse_theirs(src, out, parts, done, state)
    splits: dict[str, ArraysSplit] = {}
    reused = 0
    bar = progress_bar(src.length, progress, f"pack {shown_name(out)}")
    try:
        for name, idx in parts:
            files = _kept(src, out, name, done)
            if files is not None:
                reused += len(files)
                bar.update(len(idx))
            else:
                files = _write_split(src, out, name, idx, bar.update)
                done.update({a.file: {"bytes": a.bytes, "sha256": a.sha256}
                             for a in files.values()})
                save_state(out, {"fingerprint": fingerprint, "files": done})
            splits[name] = ArraysSplit(name, len(idx), files)
    finally:
        bar.close()
    manifest = ArraysManifest(features=dict(src.features), splits=splits, seed=options.seed,
                              shuffled=bool(options.shuffle), memfit_version=__version__,
                              source=src.description, path=out, fingerprint=fingerprint or "",
                              class_names=tuple(src.class_names))
    manifest.save(out)
    return manifest, reused

"""Parquet tables as a source: read row group by row group with pyarrow (the
``memfit[parquet]`` extra) into ``.npy`` columns, then packed as arrays, as CSV files are.

Numeric columns (integers, floats, booleans) and list columns whose every row has the same
length are read. With ``label``, the label column becomes ``y`` (int64 for integers,
else float32, as for CSV), the other scalar columns are stacked into ``x`` (float32, one
vector a row) and each list column is its own array feature of its name. Without a label
every column is its own feature, of its own dtype. Nulls, and columns of any other type
(strings, dates, nested lists, lists of varying length) are refused, naming the column.

Example:
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = Path(tempfile.mkdtemp())
    >>> pq.write_table(pa.table({"a": [1, 2], "b": [0.5, 1.5], "emb": [[1, 2], [3, 4]],
    ...                          "target": [0, 1]}), d / "t.parquet", row_group_size=1)
    >>> paths = parquet_to_npy(str(d / "t.parquet"), d / "npy", label="target")
    >>> {k: np.load(v).tolist() for k, v in paths.items()}
    {'x': [[1.0, 0.5], [2.0, 1.5]], 'emb': [[1, 2], [3, 4]], 'y': [0, 1]}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.arrays_format import open_npy
from memfit.data.format.manifest import check_dtype, check_feature_name
from memfit.data.sources.columns import ArraySource
from memfit.errors import DatasetError
from memfit.sizes import format_count

__all__ = ["ParquetSource", "open_parquet", "parquet_to_npy", "describe_parquet",
           "use_system_pool"]


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError("Packing Parquet needs pyarrow: pip install 'memfit[parquet]' "
                           "(or pip install 'pyarrow>=14').") from None
    return pa, pq


def use_system_pool() -> bool:
    """Makes pyarrow allocate from the C library's ``malloc`` (its system pool) from now
    on, in this whole process; ``False`` where pyarrow is not installed.

    pyarrow's default pool (mimalloc in its wheels) keeps the pages of freed row groups,
    so a pack's peak grew with the table (1.11-1.17× from 0.25 to 2 GB). With the system
    pool and glibc's mmap threshold fixed
    (:func:`~memfit.memory.allocator.fix_mmap_threshold`), each row group's buffers are
    returned when freed: ``memfit pack --parquet`` does both (peak 1.01× from 0.25 to
    1 GiB, and 163 MiB of anonymous memory instead of 275).

    Example:
        >>> use_system_pool()                       # doctest: +SKIP
        True
    """
    try:
        import pyarrow as pa
    except ImportError:
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def _open(path: str) -> Any:
    _, pq = _pyarrow()
    if os.path.isdir(path):
        # A Spark or pyarrow dataset is a folder of part files: "No such file" was false.
        parts = sorted(p for p in os.listdir(path) if p.endswith(".parquet"))
        hint = (f" (it holds {len(parts)} .parquet file{'s' if len(parts) != 1 else ''}, "
                f"e.g. {os.path.join(path, parts[0])!r})" if parts else "")
        raise DatasetError(f"{path!r} is a directory, not a Parquet file{hint}: memfit packs "
                           f"one Parquet file at a time; give one file, or pack each part "
                           f"file to its own output. Received: parquet={path!r}")
    if not os.path.isfile(path):
        raise DatasetError(f"No such Parquet file: {path!r}. Received: parquet={path!r}")
    try:
        return pq.ParquetFile(path)
    except Exception as e:          # pyarrow's ArrowInvalid and friends: not a Parquet file
        raise DatasetError(f"{path!r} is not a readable Parquet file ({e}).") from None


def _column_kind(path: str, name: str, typ: Any) -> tuple[str, np.dtype]:
    """``("scalar" | "list", NumPy dtype)`` of a column, or an error naming it."""
    pa, _ = _pyarrow()
    kind = "scalar"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        kind, typ = "list", typ.value_type
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
        what = "a list of " + str(typ) if kind == "list" else str(typ)
        raise DatasetError(f"Parquet file {path!r} column {name!r} is {what}, not numeric. "
                           f"memfit packs numeric columns and lists of numbers; encode "
                           f"categories as integers first, or drop the column.")
    return kind, np.dtype(typ.to_pandas_dtype())


def _plan(pf: Any, path: str, label: str | None) -> dict[str, dict[str, Any]]:
    """Feature name → its columns, dtype, and whether they are lists (lengths filled in
    from the first row group)."""
    schema = pf.schema_arrow
    names = list(schema.names)
    if label is not None and label not in names:
        raise DatasetError(f"Parquet file {path!r} has no column {label!r}; columns are "
                           f"{names}. Received: label={label!r}")
    kinds = {n: _column_kind(path, n, schema.field(n).type) for n in names}
    plan: dict[str, dict[str, Any]] = {}
    if label is None:
        for n, (kind, dt) in kinds.items():
            plan[check_feature_name(n)] = {"columns": [n], "dtype": dt, "list": kind == "list"}
    else:
        scalars = [n for n in names if n != label and kinds[n][0] == "scalar"]
        if scalars:
            plan["x"] = {"columns": scalars, "dtype": np.dtype(np.float32), "list": False}
        for n in names:
            if n != label and kinds[n][0] == "list":
                if n in ("x", "y"):
                    raise DatasetError(f"Parquet file {path!r}: list column {n!r} would clash "
                                       f"with the features x and y; rename it.")
                plan[check_feature_name(n)] = {"columns": [n], "dtype": kinds[n][1],
                                               "list": True}
        kind, dt = kinds[label]
        if kind == "list":
            plan["y"] = {"columns": [label], "dtype": dt, "list": True}
        else:
            plan["y"] = {"columns": [label], "list": False,
                         "dtype": np.dtype(np.int64 if dt.kind in "iu" else np.float32)}
    for name, f in plan.items():
        check_dtype(name, f["dtype"], f" (Parquet column {f['columns'][0]!r})")
    return plan


def _values(path: str, column: Any, name: str, start: int, width: int | None) -> np.ndarray:
    """One row group's values of a column: ``(rows,)``, or ``(rows, width)`` for a list
    column whose rows must all hold ``width`` values."""
    pa, _ = _pyarrow()
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if column.null_count:
        row = start + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise DatasetError(f"Parquet file {path!r} column {name!r} row {row} is null. memfit "
                           f"packs complete numeric columns; fill or drop the nulls first.")
    if width is None:
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(column.type):
        lengths = np.full(len(column), column.type.list_size)
    else:
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != width)
    if len(bad):
        row = start + int(bad[0])
        raise DatasetError(f"Parquet file {path!r} column {name!r} row {row} holds "
                           f"{lengths[bad[0]]} values; row 0 holds {width}. memfit packs list "
                           f"columns of one length (pad them, or pack them as an iterable "
                           f"with variable=[{name!r}]).")
    values = column.flatten()
    if values.null_count:
        raise DatasetError(f"Parquet file {path!r} column {name!r} holds null values inside "
                           f"its lists; fill or drop them first.")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), width)


def parquet_to_npy(path: str, workdir: Path, *, label: str | None = None) -> dict[str, str]:
    """Converts a Parquet file to ``.npy`` columns in ``workdir``, one row group at a
    time (what is held is one row group; the ``.npy`` files are written, not mapped).

    Returns:
        feature name → path of the ``.npy`` file written.

    Raises:
        DatasetError: for a missing or unreadable file, a column that is not numeric, a
            null, a list column whose rows differ in length, a missing label column.
    """
    pf = _open(path)
    plan = _plan(pf, path, label)
    rows = pf.metadata.num_rows
    if rows == 0:
        raise DatasetError(f"Parquet file {path!r} has no rows; nothing to pack.")
    workdir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    try:
        start = 0
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g)
            if table.num_rows == 0:
                continue
            for name, f in plan.items():
                if f["list"] and "width" not in f:          # the first row fixes the length
                    first = table.column(f["columns"][0]).slice(0, 1).to_pylist()[0]
                    f["width"] = len(first or [])
                    if f["width"] == 0:
                        raise DatasetError(f"Parquet file {path!r} column "
                                           f"{f['columns'][0]!r} row 0 is an empty list.")
                width = f["width"] if f["list"] else None
                cols = [_values(path, table.column(c), c, start, width) for c in f["columns"]]
                block = np.stack(cols, axis=1) if name == "x" else cols[0]
                block = np.ascontiguousarray(block, f["dtype"].newbyteorder("<"))
                if name not in files:
                    files[name] = _npy_writer(workdir / f"{name}.npy", f["dtype"],
                                              (rows, *block.shape[1:]))
                files[name].write(memoryview(block).cast("B"))
            start += table.num_rows
    finally:
        for fh in files.values():
            fh.close()
    return {name: str(workdir / f"{name}.npy") for name in plan}


def _npy_writer(file: Path, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """An open ``.npy`` file with its header written; the caller appends the values."""
    fh = open(file, "wb")
    np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(
        dtype.newbyteorder("<")), "fortran_order": False, "shape": shape})
    return fh


def describe_parquet(path: str, label: str | None = None) -> str:
    """What was packed, for the manifest: the file, its rows and which columns went where."""
    pf = _open(path)
    plan = _plan(pf, path, label)
    parts = []
    for name, f in plan.items():
        cols = f["columns"]
        parts.append(f"{name} = {', '.join(cols)}")          # x's columns in x's order
    return (f"parquet {path} ({format_count(pf.metadata.num_rows, 'row')} in "
            f"{format_count(pf.num_row_groups, 'row group')}; {'; '.join(parts)})")


class ParquetSource(ArraySource):
    """The ``.npy`` columns a Parquet file was converted to, identified by the Parquet
    file itself (its path, size and mtime, and the label), not by the scratch copies: a
    rerun of the same pack resumes it or finds it complete, byte for byte."""

    def __init__(self, path: str, npy: dict[str, str], label: str | None, description: str):
        super().__init__({n: open_npy(n, p) for n, p in npy.items()}, paths=npy,
                         description=description)
        self.table = path
        self.label = label

    def fingerprint(self) -> str:
        import hashlib

        st = os.stat(self.table)
        return hashlib.sha256(f"{os.path.abspath(self.table)}:{st.st_size}:{st.st_mtime_ns}:"
                              f"{self.label}:{self.description}".encode()).hexdigest()


def open_parquet(path: str | os.PathLike, scratch: Path, *,
                 label: str | None = None) -> ParquetSource:
    """A Parquet file opened as a source: its columns checked, then converted to ``.npy``
    columns in ``scratch`` (:func:`parquet_to_npy`)."""
    path = str(path)
    description = describe_parquet(path, label)         # checks the columns first
    return ParquetSource(path, parquet_to_npy(path, scratch, label=label), label, description)

"""CSV files as a source: converted to ``.npy`` columns in two streamed passes (the
first types each column, the second fills memory-mapped arrays), then packed as arrays.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.manifest import check_feature_name
from memfit.errors import DatasetError
from memfit.sizes import format_count

__all__ = ["csv_to_npy", "describe_csv"]


def csv_to_npy(path: str, workdir: Path, *, label: str | None = None,
               delimiter: str = ",") -> tuple[dict[str, str], str]:
    """Converts a CSV file to ``.npy`` columns in ``workdir`` in two streamed passes.

    Columns are typed by content: all integers → int64, otherwise numbers → float32; an
    empty or non-numeric cell is an error naming the row and column. A UTF-8 byte-order
    mark (Excel's "CSV UTF-8") is not part of the first column's name, blank lines are
    skipped, and an integer column is read as integers even beside float columns. With
    ``label``, the label column becomes feature ``y`` and the other columns are stacked into ``x``
    (float32, one vector per row); otherwise each column is its own feature.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "t.csv").write_text("a,b,target\\n1,0.5,0\\n2,1.5,1\\n")
        >>> paths, description = csv_to_npy(str(d / "t.csv"), d / "npy", label="target")
        >>> np.load(paths["x"]).tolist(), np.load(paths["y"]).tolist()
        ([[1.0, 0.5], [2.0, 1.5]], [0, 1])
        >>> description.endswith("(2 rows; x = a, b; y = target)")
        True

    Returns:
        ``(paths, description)``: feature name → path of the ``.npy`` file written, and
        what was packed, for the manifest (:func:`describe_csv`).
    """
    header, is_int, rows = _scan_csv(path, delimiter, label)
    workdir.mkdir(parents=True, exist_ok=True)
    out = {name: np.lib.format.open_memmap(workdir / f"{name}.npy", mode="w+", dtype=dt,
                                           shape=shape)
           for name, (dt, shape) in _csv_features(header, is_int, rows, label).items()}
    _fill_from_csv(out, path, delimiter, header, is_int, label)
    for arr in out.values():
        arr.flush()
    return ({name: str(workdir / f"{name}.npy") for name in out},
            describe_csv(path, header, rows, label))


def describe_csv(path: str, header: list[str], rows: int, label: str | None = None) -> str:
    """What was packed, for the manifest: the file, its rows and which columns went where
    (in order: ``x``'s columns are its values' order).

    Example:
        >>> describe_csv("t.csv", ["age", "rooms", "price"], 500, label="price")
        'csv t.csv (500 rows; x = age, rooms; y = price)'

    Args:
        path: the CSV file.
        header: its column names.
        rows: its rows.
        label: the label column, or ``None`` (each column its own feature).
    """
    if label is None:
        columns = f"{format_count(len(header), 'column')}, each a feature of its name"
    else:
        columns = f"x = {', '.join(h for h in header if h != label)}; y = {label}"
    return f"csv {path} ({format_count(rows, 'row')}; {columns})"


def _scan_csv(path: str, delimiter: str,
              label: str | None) -> tuple[list[str], list[bool], int]:
    """The first pass: the header, whether each column holds integers only, and the
    number of rows; every cell is checked to be a number."""
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise DatasetError(f"No such CSV file: {path!r}.") from None
    with f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise DatasetError(f"CSV file {path!r} is empty: it needs a header row.")
        header = [h.strip() for h in header]
        if label is not None and label not in header:
            raise DatasetError(f"CSV file {path!r} has no column {label!r}; columns are "
                               f"{header}. Received: label={label!r}")
        _check_header(path, header, label)
        is_int = [True] * len(header)
        rows = 0
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue                                    # a blank line
            if len(row) != len(header):
                raise DatasetError(f"CSV file {path!r} line {line_no} has {len(row)} cells; "
                                   f"the header has {len(header)}.")
            for j, cell in enumerate(row):
                try:
                    if is_int[j]:
                        if not -2**63 <= int(cell) < 2**63:
                            raise ValueError(cell)              # beyond int64: a float
                        continue
                except ValueError:
                    is_int[j] = False
                try:
                    float(cell)
                except ValueError:
                    if not cell.strip():
                        raise DatasetError(
                            f"CSV file {path!r} line {line_no} column {header[j]!r} is "
                            f"empty (a missing value). memfit packs numeric CSV cells; fill "
                            f"or drop missing values first (NaN is accepted).") from None
                    raise DatasetError(
                        f"CSV file {path!r} line {line_no} column {header[j]!r} is not a "
                        f"number: {cell!r}. memfit packs numeric CSV columns; encode "
                        f"categories as integers first.") from None
            rows += 1
    if rows == 0:
        raise DatasetError(f"CSV file {path!r} has a header but no rows.")
    return header, is_int, rows


def _check_header(path: str, header: list[str], label: str | None) -> None:
    """Without ``label`` each column is a feature: its name must be one, and unique."""
    if label is not None:
        names = [h for h in header if h != label]
        if len(names) != len(header) - 1:
            raise DatasetError(f"CSV file {path!r} has {len(header) - len(names)} columns "
                               f"named {label!r}, the label; rename all but one.")
        return
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise DatasetError(f"CSV file {path!r} has two columns named {h!r}; each column "
                               f"becomes a feature of its name: rename one (or pass --label "
                               f"to stack the columns into x).")
        seen.add(h)
        try:
            check_feature_name(h)
        except DatasetError:
            raise DatasetError(f"CSV file {path!r} has a column named {h!r}: a feature name "
                               f"must be non-empty and without '/'. Rename it in the header "
                               f"(or pass --label to stack the columns into x).") from None


def _csv_features(header: list[str], is_int: list[bool], rows: int,
                  label: str | None) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Feature name → (dtype, shape) of the ``.npy`` columns a CSV file becomes."""
    if label is not None:
        j_label = header.index(label)
        return {"x": (np.float32, (rows, len(header) - 1)),
                "y": (np.int64 if is_int[j_label] else np.float32, (rows,))}
    return {h: (np.int64 if is_int[j] else np.float32, (rows,)) for j, h in enumerate(header)}


def _fill_from_csv(out: dict[str, np.ndarray], path: str, delimiter: str, header: list[str],
                   is_int: list[bool], label: str | None) -> None:
    """The second pass: the rows, 65,536 at a time, into the ``.npy`` columns."""
    if label is not None:
        j_label = header.index(label)
        x_cols = [j for j in range(len(header)) if j != j_label]
    chunk = 65536
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = (row for row in csv.reader(f, delimiter=delimiter) if row)
        next(reader)
        start = 0
        while True:
            block = list(itertools.islice(reader, chunk))
            if not block:
                break
            cells = np.array(block, dtype=str)
            # int64 from the text itself: through float64, 2**53 + 1 became 2**53
            cols = [cells[:, j].astype(np.int64 if is_int[j] else np.float64)
                    for j in range(len(header))]
            stop = start + len(block)
            if label is not None:
                for k, j in enumerate(x_cols):
                    out["x"][start:stop, k] = cols[j]
                out["y"][start:stop] = cols[j_label]
            else:
                for j, h in enumerate(header):
                    out[h][start:stop] = cols[j]
            start = stop

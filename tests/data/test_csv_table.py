"""CSV files a user exports: Excel's byte-order mark, blank lines, large integer ids,
duplicate or unusable column names, missing values."""

import numpy as np
import pytest

from memfit.data.sources.csv_table import csv_to_npy
from memfit.errors import DatasetError


def _columns(tmp_path, text, label=None, encoding="utf-8"):
    (tmp_path / "t.csv").write_text(text, encoding=encoding)
    paths, _ = csv_to_npy(str(tmp_path / "t.csv"), tmp_path / "npy", label=label)
    return {name: np.load(p) for name, p in paths.items()}


def test_a_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    cols = _columns(tmp_path, "target,a\n0,1\n1,2\n", label="target", encoding="utf-8-sig")
    assert cols["y"].tolist() == [0, 1] and cols["x"].tolist() == [[1.0], [2.0]]
    cols = _columns(tmp_path, "a,b\n1,2\n3,4\n", encoding="utf-8-sig")
    assert sorted(cols) == ["a", "b"]


def test_blank_lines_are_skipped(tmp_path):
    cols = _columns(tmp_path, "a,b\n1,2\n\n3,4\n\n")
    assert cols["a"].tolist() == [1, 3] and cols["b"].tolist() == [2, 4]


def test_an_integer_column_beside_a_float_column_keeps_its_values(tmp_path):
    cols = _columns(tmp_path, "id,a\n9007199254740993,1.5\n2,2.5\n")
    assert cols["id"].dtype == np.int64 and cols["id"].tolist() == [9007199254740993, 2]
    cols = _columns(tmp_path, "a,b\n99999999999999999999,1\n2,2\n")    # beyond int64: float
    assert cols["a"].dtype == np.float32 and cols["a"][0] == np.float32(1e20)


@pytest.mark.parametrize("header, label, words", [
    ("a,a,b", None, "two columns named 'a'"),
    ("a,,b", None, "a column named ''"),
    ("a,b/lengths,c", None, "a column named 'b/lengths'"),
    ("target,a,target", "target", "2 columns named 'target'"),
])
def test_column_names_that_cannot_be_features_are_refused(tmp_path, header, label, words):
    with pytest.raises(DatasetError, match=words):
        _columns(tmp_path, header + "\n1,2,3\n", label=label)


def test_an_empty_cell_is_named_a_missing_value(tmp_path):
    with pytest.raises(DatasetError, match="line 3 column 'b' is empty .a missing value"):
        _columns(tmp_path, "a,b\n1,2\n3,\n")


def test_the_manifest_says_which_column_is_which_value_of_x(tmp_path):
    # x stacks the columns: without their names in order, nobody could tell x[:, 1].
    import memfit
    from memfit.data.format.manifest import Manifest

    (tmp_path / "t.csv").write_text("age,income,target,rooms\n30,1.5,0,3\n41,2.5,1,4\n")
    memfit.pack(csv=str(tmp_path / "t.csv"), label="target", output=tmp_path / "ds",
                progress=False)
    source = Manifest.load(tmp_path / "ds").source
    assert source == f"csv {tmp_path / 't.csv'} (2 rows; x = age, income, rooms; y = target)"
    memfit.pack(csv=str(tmp_path / "t.csv"), output=tmp_path / "each", progress=False)
    assert Manifest.load(tmp_path / "each").source.endswith(
        "(2 rows; 4 columns, each a feature of its name)")


def test_an_interrupted_csv_pack_resumes_when_the_same_command_is_run_again(tmp_path,
                                                                           monkeypatch):
    """The CSV file is converted to .npy columns in a scratch directory of a new name on
    every run; the pack's fingerprint named those files (path, mtime), so the rerun the
    error message asks for was refused as "an interrupted pack of different data"."""
    import memfit
    from memfit.data.packing import pack_shards

    rows = "\n".join(f"{i},{i * 0.5},{i % 3}" for i in range(1600))
    (tmp_path / "t.csv").write_text("a,b,target\n" + rows + "\n")
    args = dict(csv=str(tmp_path / "t.csv"), label="target", shards=8, samples_per_record=16,
                progress=False)
    reference = memfit.pack(output=tmp_path / "ref", **args)
    real, calls = pack_shards.write_shard, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(pack_shards, "write_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        memfit.pack(output=tmp_path / "d", **args)
    monkeypatch.setattr(pack_shards, "write_shard", real)
    resumed = memfit.pack(output=tmp_path / "d", **args)
    assert resumed.kept_shards == 3
    assert [s.sha256 for s in resumed.manifest.splits["train"].shards] == \
           [s.sha256 for s in reference.manifest.splits["train"].shards]
    # a changed file is other data: refused, not resumed
    with pytest.raises(KeyboardInterrupt):
        monkeypatch.setattr(pack_shards, "write_shard", flaky)
        calls.clear()
        memfit.pack(output=tmp_path / "e", **args)
    monkeypatch.setattr(pack_shards, "write_shard", real)
    (tmp_path / "t.csv").write_text("a,b,target\n" + rows.replace("7,3.5", "7,9.5") + "\n")
    with pytest.raises(DatasetError, match="different data"):
        memfit.pack(output=tmp_path / "e", **args)

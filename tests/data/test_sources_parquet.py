"""Parquet tables as a pack source (pyarrow, the memfit[parquet] extra)."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memfit
from memfit.data.format.manifest import Manifest
from memfit.errors import DatasetError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _table(n=157, seed=0):
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, 4)).astype(np.float32)
    return {"a": rng.integers(-50, 50, n), "b": rng.random(n).astype(np.float32),
            "flag": rng.integers(0, 2, n).astype(bool),
            "emb": pa.array(list(emb), type=pa.list_(pa.float32())),
            "fixed": pa.array(list(rng.integers(0, 9, (n, 3)).astype(np.int32)),
                              type=pa.list_(pa.int32(), 3)),
            "target": np.arange(n)}, emb


def _read(path, split=None):
    ds = memfit.dataset(path, 32, shuffle=False, epochs=1, split=split)
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_label_scalars_and_list_columns_round_trip(tmp_path):
    cols, emb = _table()
    pq.write_table(pa.table(cols), tmp_path / "t.parquet", row_group_size=40)
    memfit.pack(parquet=tmp_path / "t.parquet", label="target", output=tmp_path / "ds",
                progress=False)
    m = Manifest.load(tmp_path / "ds")
    assert {n: (f.dtype, f.shape) for n, f in m.features.items()} == {
        "x": ("float32", (3,)), "emb": ("float32", (4,)), "fixed": ("int32", (3,)),
        "y": ("int64", ())}
    assert "4 row groups" in m.source and "x = a, b, flag" in m.source
    got = _read(tmp_path / "ds")
    order = np.argsort(got["y"])
    assert got["y"][order].tolist() == list(range(157))         # every row once
    np.testing.assert_array_equal(got["emb"][order], emb)
    expect_x = np.stack([cols["a"], cols["b"], cols["flag"]], axis=1).astype(np.float32)
    np.testing.assert_array_equal(got["x"][order], expect_x)
    np.testing.assert_array_equal(got["fixed"][order],
                                  np.stack(cols["fixed"].to_numpy(zero_copy_only=False)))


def test_without_label_every_column_is_a_feature_and_reruns_are_identical(tmp_path):
    n = 64
    pq.write_table(pa.table({"u": np.arange(n, dtype=np.uint16),
                             "v": np.linspace(0, 1, n)}), tmp_path / "t.parquet",
                   row_group_size=10)
    for out in ("a", "b"):
        memfit.pack(parquet=str(tmp_path / "t.parquet"), output=tmp_path / out,
                    split="train=0.75,val=0.25", progress=False)
    digest = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted((tmp_path / out).iterdir())} for out in ("a", "b")]
    assert digest[0] == digest[1]
    m = Manifest.load(tmp_path / "a")
    assert (m.features["u"].dtype, m.features["v"].dtype) == ("uint16", "float64")
    u = np.concatenate([_read(tmp_path / "a", s)["u"] for s in ("train", "val")])
    assert sorted(u.tolist()) == list(range(n))


def test_bad_columns_are_refused_naming_the_column(tmp_path):
    cases = {
        "text": ({"name": ["a", "b"], "target": [0, 1]}, r"column 'name' is string, not numeric"),
        "null": ({"a": [1.0, None, 3.0], "target": [0, 1, 2]}, r"column 'a' row 1 is null"),
        "ragged": ({"emb": [[1, 2], [3], [4, 5]], "target": [0, 1, 2]},
                   r"column 'emb' row 1 holds 1 values; row 0 holds 2"),
    }
    for name, (columns, message) in cases.items():
        pq.write_table(pa.table(columns), tmp_path / f"{name}.parquet")
        with pytest.raises(DatasetError, match=message):
            memfit.pack(parquet=tmp_path / f"{name}.parquet", label="target",
                        output=tmp_path / "ds", progress=False)
        assert not (tmp_path / "ds").exists()
    with pytest.raises(DatasetError, match=r"no column 'nope'"):
        memfit.pack(parquet=tmp_path / "null.parquet", label="nope", output=tmp_path / "ds",
                    progress=False)


def test_cli_pack_and_bad_input(tmp_path):
    pq.write_table(pa.table({"a": [1, 2, 3], "target": [0, 1, 0]}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"when": pa.array([1, 2], pa.timestamp("s"))}),
                   tmp_path / "dates.parquet")
    (tmp_path / "not.parquet").write_text("a,b\n1,2\n")
    (tmp_path / "spark.parquet").mkdir()            # a folder of part files ("No such file")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "spark.parquet" / "part-0.parquet")
    before = set(os.listdir(tmp_path))
    for args, words in [(["--parquet", "missing.parquet"], "No such Parquet file"),
                        (["--parquet", "spark.parquet"],
                         "'spark.parquet' is a directory, not a Parquet file (it holds 1 "
                         ".parquet file, e.g. 'spark.parquet/part-0.parquet'): memfit packs "
                         "one Parquet file at a time"),
                        (["--parquet", "not.parquet"], "is not a readable Parquet file"),
                        (["--parquet", "dates.parquet"], "column 'when' is timestamp")]:
        r = subprocess.run([sys.executable, "-m", "memfit", "pack", *args, "-o", "out"],
                           cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit")]
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(lines) == 1 and words in lines[0], r.stderr
    assert set(os.listdir(tmp_path)) == before
    r = subprocess.run([sys.executable, "-m", "memfit", "pack", "--parquet", "t.parquet",
                        "--label", "target", "-o", "out", "--quiet"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "packed 3 samples" in r.stdout, r.stderr
    assert sorted(os.listdir(Path(tmp_path) / "out")) == ["manifest.json",
                                                          "train-00000-of-00001.tfrecord"]


def test_the_cli_packs_parquet_with_buffers_returned_when_freed(tmp_path):
    """memfit pack --parquet reads row groups into large buffers freed at once; the
    command fixes glibc's mmap threshold and puts pyarrow on malloc, so that each is
    returned when freed and the pack's peak does not grow with the table. Packs of
    images (which trim the heap after each chunk instead: mapping every decoded photo
    anew was slow) and of arrays leave the allocator as it was."""
    from PIL import Image

    pq.write_table(pa.table(_table()[0]), tmp_path / "t.parquet", row_group_size=50)
    for cls in ("a", "b"):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        Image.new("RGB", (6, 4), (9, 9, 9)).save(tmp_path / "photos" / cls / "x.png")
    np.save(tmp_path / "x.npy", np.zeros((4, 2), np.float32))
    probe = ("import sys, pyarrow as pa; from memfit.cli import main; "
             "from memfit.memory.allocator import current_policy; "
             "assert main(sys.argv[1:]) == 0; "
             "print('policy', current_policy(), pa.default_memory_pool().backend_name)")
    seen = {}
    for name, args in {"parquet": ["--parquet", "t.parquet", "--label", "target"],
                       "images": ["--images", "photos", "--image-size", "4,4"],
                       "arrays": ["x=x.npy"]}.items():
        r = subprocess.run([sys.executable, "-c", probe, "pack", *args, "-o", name,
                            "--quiet"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert r.returncode == 0, r.stderr
        seen[name] = r.stdout.split("policy ")[1].split()
    assert seen["parquet"] == ["fixed", "system"]
    assert seen["images"][0] == "default" and seen["images"][1] != "system"
    assert seen["arrays"][0] == "default" and seen["arrays"][1] != "system"


def test_the_manifest_names_every_column_of_x_in_order(tmp_path):
    # It said "x = 6 columns" beyond four: which value of x is which column was lost.
    names = [f"f{i}" for i in range(6)]
    table = {n: np.arange(10, dtype=np.float32) + i for i, n in enumerate(names)}
    pq.write_table(pa.table({**table, "target": np.arange(10)}), tmp_path / "w.parquet")
    memfit.pack(parquet=tmp_path / "w.parquet", label="target", output=tmp_path / "ds",
                progress=False)
    assert "x = f0, f1, f2, f3, f4, f5; y = target" in Manifest.load(tmp_path / "ds").source

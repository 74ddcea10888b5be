"""TFRecord files of tf.train.Example records as a pack source, on files written exactly
by the recipe memfit was born from: each sample one Example, `data` =
tf.io.serialize_tensor(x).numpy() as bytes, `label` a float list, written with
tf.io.TFRecordWriter into path1.tfrecords ... path4.tfrecords."""

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

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _example(data, label):
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "data": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[tf.io.serialize_tensor(data).numpy()])),
        "label": tf.train.Feature(float_list=tf.train.FloatList(value=label)),
    })).SerializeToString()


def write_recipe(directory: Path, x: np.ndarray, y: np.ndarray, files: int = 4,
                 compression: str | None = None) -> list[Path]:
    """The recipe: one Example a sample, written with tf.io.TFRecordWriter."""
    import tensorflow as tf

    paths = []
    per = -(-len(x) // files)
    for f in range(files):
        path = directory / f"path{f + 1}.tfrecords"
        with tf.io.TFRecordWriter(str(path), options=compression) as w:
            for i in range(f * per, min(len(x), (f + 1) * per)):
                w.write(_example(x[i], y[i]))
        paths.append(path)
    return paths


def _recipe_data(n=203, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 6, 5, 3)).astype(np.float32),
            rng.random((n, 2)).astype(np.float32))


def _read_all(path, **kw):
    ds = memfit.dataset(path, 32, shuffle=False, epochs=1, **kw)
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _as_rows(x, y):
    return sorted(zip((r.tobytes() for r in x), (r.tobytes() for r in y), strict=True))


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_recipe_files_pack_and_stream_back_every_sample_once(tmp_path, compression):
    x, y = _recipe_data()
    write_recipe(tmp_path, x, y, compression=compression)
    result = memfit.pack(tfrecord=str(tmp_path / "path*.tfrecords"), output=tmp_path / "ds",
                         progress=False)
    assert result.samples == len(x)
    m = Manifest.load(tmp_path / "ds")
    assert m.features["data"].dtype == "float32" and m.features["data"].shape == (6, 5, 3)
    assert m.features["label"].dtype == "float32" and m.features["label"].shape == (2,)
    assert "serialized tensor" in m.source and "4 files, 203 records" in m.source
    got = _read_all(tmp_path / "ds")
    assert got["data"].shape == x.shape
    assert _as_rows(got["data"], got["label"]) == _as_rows(x, y)     # values, each once
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "ds").iterdir())


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


def test_rerun_is_byte_identical_and_a_scalar_label_stays_scalar(tmp_path):
    x, _ = _recipe_data(n=97)
    y = np.arange(97, dtype=np.float32)[:, None]       # a float list of one value
    write_recipe(tmp_path, x, y, files=2)
    for out in ("a", "b"):
        memfit.pack(tfrecord=[tmp_path / "path1.tfrecords", tmp_path / "path2.tfrecords"],
                    output=tmp_path / out, split="train=0.8,val=0.2", progress=False)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    m = Manifest.load(tmp_path / "a")
    assert m.features["label"].shape == ()
    labels = np.concatenate([_read_all(tmp_path / "a", split=s)["label"]
                             for s in ("train", "val")])
    assert sorted(labels.tolist()) == list(range(97))
    again = memfit.pack(tfrecord=[tmp_path / "path1.tfrecords", tmp_path / "path2.tfrecords"],
                        output=tmp_path / "a", split="train=0.8,val=0.2", progress=False)
    assert again.kept_shards == sum(len(s.shards) for s in m.splits.values())


def test_int64_lists_images_and_other_bytes_are_inferred(tmp_path):
    import tensorflow as tf

    png = tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()
    with tf.io.TFRecordWriter(str(tmp_path / "a.tfrecords")) as w:
        for i in range(5):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -i, 2**40])),
                "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"ab" * i + b"z"])),
                "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=range(i + 1))),
            })).SerializeToString())
    memfit.pack(tfrecord=str(tmp_path / "a.tfrecords"), output=tmp_path / "ds",
                variable=["tokens"], shuffle=False, progress=False)
    m = Manifest.load(tmp_path / "ds")
    assert (m.features["ids"].dtype, m.features["ids"].shape) == ("int64", (3,))
    assert (m.features["img"].dtype, m.features["img"].shape) == ("uint8", (None,))
    # the format of the first record only: a file may mix them (a stranger's JPEG and PNG)
    assert "encoded image (bytes; png in the first record)" in m.source
    assert "blob: bytes" in m.source
    ds = memfit.dataset(tmp_path / "ds", 5, shuffle=False, epochs=1)
    batch = next(iter(ds))
    assert batch["ids"].numpy().tolist() == [[i, -i, 2**40] for i in range(5)]
    assert [t.numpy().tolist() for t in batch["tokens"]] == [list(range(i + 1)) for i in range(5)]
    assert bytes(batch["img"][0].numpy()) == png
    assert bytes(batch["blob"][2].numpy()) == b"abab" + b"z"


def test_disagreeing_records_name_file_record_and_both_specs(tmp_path):
    x, y = _recipe_data(n=8)
    write_recipe(tmp_path, x, y, files=1)
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(tmp_path / "path2.tfrecords")) as w:
        w.write(_example(x[0], y[0]))
        w.write(_example(np.zeros((6, 5, 4), np.float32), y[0]))
    with pytest.raises(DatasetError) as e:
        memfit.pack(tfrecord=str(tmp_path / "path*.tfrecords"), output=tmp_path / "ds",
                    progress=False)
    text = str(e.value)
    assert "path2.tfrecords' record 1" in text and "path1.tfrecords' record 0" in text
    assert "(6, 5, 4)" in text and "(6, 5, 3)" in text
    assert not (tmp_path / "ds").exists()


def test_a_missing_feature_and_a_longer_list_are_refused(tmp_path):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(tmp_path / "a.tfrecords")) as w:
        w.write(_example(np.zeros(3, np.float32), [1.0]))
        w.write(_example(np.zeros(3, np.float32), [1.0, 2.0]))
    with pytest.raises(DatasetError, match=r"record 1: feature 'label' .*variable"):
        memfit.pack(tfrecord=str(tmp_path / "a.tfrecords"), output=tmp_path / "ds",
                    progress=False)
    with tf.io.TFRecordWriter(str(tmp_path / "b.tfrecords")) as w:
        w.write(_example(np.zeros(3, np.float32), [1.0]))
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "label": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))}))
            .SerializeToString())
    missing = r"record 1 has features \['label'\].*missing: \['data'\]"
    with pytest.raises(DatasetError, match=missing):
        memfit.pack(tfrecord=str(tmp_path / "b.tfrecords"), output=tmp_path / "ds",
                    progress=False)
    assert not (tmp_path / "ds").exists()


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def test_cli_bad_input_is_one_line_exit_2_and_nothing_left(tmp_path):
    x, y = _recipe_data(n=20)
    write_recipe(tmp_path, x, y, files=2)
    data = bytearray((tmp_path / "path2.tfrecords").read_bytes())
    data[len(data) // 2] ^= 0xFF                        # a flipped byte: a corrupt record
    (tmp_path / "bad.tfrecords").write_bytes(bytes(data))
    (tmp_path / "cut.tfrecords").write_bytes(bytes(data[: len(data) // 3]))
    (tmp_path / "shards.tfrecords").mkdir()            # a directory with the files' suffix
    (tmp_path / "text.tfrecords").write_text("hello world this is text\n")
    before = set(os.listdir(tmp_path))
    for pattern, words in [("nothing*.tfrecords", "No TFRecord file matches 'nothing*"),
                           ("shards.tfrecords", "'shards.tfrecords' is a directory, not a "
                                                "TFRecord file: give its files (a quoted glob "
                                                "such as 'shards.tfrecords/*.tfrecords')"),
                           # not "damaged, write it again": it never was one (a stranger)
                           ("text.tfrecords", "text.tfrecords' is not a TFRecord file, or "
                                              "is damaged from its first byte"),
                           ("bad.tfrecords", "bad.tfrecords' is damaged: corrupt"),
                           ("cut.tfrecords", "cut.tfrecords' is damaged: truncated")]:
        r = _run("pack", "--tfrecord", pattern, "-o", "out", cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit")]
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(lines) == 1 and words in lines[0], r.stderr
    assert set(os.listdir(tmp_path)) == before


def test_an_unreadable_file_is_said_by_pack_inspect_and_the_reader(tmp_path, monkeypatch,
                                                                    capsys):
    """A file memfit may not read gave a PermissionError traceback in pack, inspect and
    memfit.dataset (a stranger, as a user without root). Each now says which file and what
    to do. (Tests run as root, whom chmod does not stop: the refusal is played.)"""
    from memfit.cli import main
    from memfit.data.sources import tfrecord_source

    x, y = _recipe_data(n=20)
    paths = write_recipe(tmp_path, x, y, files=2)

    def refuse(path, *args, **kwargs):
        if Path(path) == paths[1]:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(tfrecord_source, "open", refuse, raising=False)
    words = f"TFRecord file {str(paths[1])!r} cannot be read (Permission denied): give"
    pattern = str(tmp_path / "path*.tfrecords")
    for attempt in (lambda: memfit.pack(tfrecord=pattern, output=tmp_path / "out",
                                        progress=False),
                    lambda: _read_all(pattern)):
        with pytest.raises(DatasetError, match="cannot be read") as e:
            attempt()
        assert words in str(e.value)
    assert not (tmp_path / "out").exists()
    assert main(["inspect", pattern]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_cli_pack_and_inspect_show_the_spec(tmp_path):
    x, y = _recipe_data(n=20)
    write_recipe(tmp_path, x, y, compression="GZIP")
    r = _run("inspect", "path*.tfrecords", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "data   serialized tensor → float32 (6, 5, 3)" in r.stdout
    assert "label  float_list of 2 values → float32 (2,)" in r.stdout
    assert "compression: GZIP" in r.stdout and "20 records in 4 files" in r.stdout
    r = _run("pack", "--tfrecord", "path*.tfrecords", "-o", "ds", "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and "packed 20 samples" in r.stdout, r.stderr
    r = _run("inspect", "ds", cwd=tmp_path)
    assert "source: tfrecord path*.tfrecords (4 files, 20 records; data: serialized " \
           "tensor → float32 (6, 5, 3)" in r.stdout
    # the GZIP files' decompressed copies (the pack's scratch) are gone
    assert sorted(os.listdir(tmp_path / "ds")) == ["manifest.json", "train-00000-of-00001.tfrecord"]


# -- a TensorProto whose values are in its typed fields (float_val...), not tensor_content --

# dtype → the TensorProto field tf.make_tensor_proto and TensorFlow's own writers use for it.
TYPED_FIELDS = {"float32": "float_val", "float64": "double_val", "int32": "int_val",
                "uint8": "int_val", "int16": "int_val", "int8": "int_val",
                "uint16": "int_val", "complex64": "scomplex_val", "int64": "int64_val",
                "bool": "bool_val", "complex128": "dcomplex_val", "float16": "half_val",
                "uint32": "uint32_val", "uint64": "uint64_val"}


def _typed_tensor(values: np.ndarray, shape: tuple[int, ...]) -> bytes:
    """A serialised TensorProto of ``shape`` holding ``values`` in its typed field."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

    dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape]
    proto = tensor_pb2.TensorProto(dtype=tf.as_dtype(values.dtype).as_datatype_enum,
                                   tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=dims))
    field = TYPED_FIELDS[values.dtype.name]
    if values.dtype == np.float16:
        wire = values.view(np.uint16)                   # half_val holds the bits
    elif values.dtype.kind == "c":
        wire = values.view(values.real.dtype)           # real, imaginary, real...
    else:
        wire = values
    getattr(proto, field).extend(wire.tolist())
    return proto.SerializeToString()


@pytest.mark.parametrize("dtype", list(TYPED_FIELDS))
def test_typed_field_tensors_decode_as_tensorflow_decodes_them(dtype):
    import tensorflow as tf

    from memfit.data.sources.example_proto import TensorHeader, parse_tensor_header

    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    for shape in [(2, 3), (), (0, 2)]:
        size = int(np.prod(shape))
        # no values at all in a non-empty shape: memfit does not take the bytes for a tensor
        for count in sorted({1, max(size - 2, 1), size, size + 3} | ({0} if not size else set())):
            if info is not None:
                values = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
            elif dtype == "bool":
                values = rng.integers(0, 2, count).astype(bool)
            else:
                values = (rng.standard_normal(count) * 100).astype(dtype)
                if np.dtype(dtype).kind == "c":
                    values = values + 1j * rng.standard_normal(count).astype(dtype)
            proto = b"--" + _typed_tensor(values, shape)
            header = parse_tensor_header(proto, 2)
            assert isinstance(header, TensorHeader) and header.content is None
            got = header.array(proto)
            want = tf.io.parse_tensor(proto[2:], getattr(tf, dtype)).numpy()
            # too few values: the last repeated; too many: the first ones
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (shape, count)
            assert got.tobytes() == want.tobytes(), (shape, count, got, want)


def test_an_unpacked_float_val_and_an_int_val_that_wraps_decode_as_tensorflow_does():
    import struct

    import tensorflow as tf

    from memfit.data.sources.example_proto import parse_tensor_header

    shape3 = bytes([18, 4, 18, 2, 8, 3])                 # tensor_shape [3]
    floats = (bytes([8, 1]) + shape3                     # DT_FLOAT, float_val unpacked
              + b"".join(bytes([45]) + struct.pack("<f", v) for v in (1.5, -2.0))
              + bytes([42, 4]) + struct.pack("<f", 7.0))  # ... then one packed piece
    ints = bytes([8, 6]) + shape3 + bytes([56, 172, 2, 56]) + bytes([0xFF] * 9 + [1])
    for proto, dtype in [(floats, tf.float32), (ints, tf.int8)]:   # int_val [300, -1]
        got = parse_tensor_header(proto).array(proto)
        assert got.tobytes() == tf.io.parse_tensor(proto, dtype).numpy().tobytes()
    assert parse_tensor_header(floats).array(floats).tolist() == [1.5, -2.0, 7.0]
    assert parse_tensor_header(ints).array(ints).tolist() == [44, -1, -1]


def test_cli_pack_of_typed_field_tensors_prints_no_tensorflow_line(tmp_path):
    # Records whose tensor keeps its values in float_val (as tf.make_tensor_proto may
    # write them) were decoded by importing TensorFlow: its start-up lines reached the
    # user of `memfit pack`, which promises to leave them out.
    import tensorflow as tf

    from .helpers import tensorflow_lines, user_env

    x = np.arange(60, dtype=np.float32).reshape(20, 3) / 4
    with tf.io.TFRecordWriter(str(tmp_path / "typed.tfrecords")) as w:
        for i in range(20):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "data": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[_typed_tensor(x[i], (3,))])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            })).SerializeToString())
    r = subprocess.run([sys.executable, "-m", "memfit", "pack", "--tfrecord",
                        "typed.tfrecords", "-o", "out/typed"], cwd=tmp_path, env=user_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "packed 20 samples" in r.stdout, r.stderr
    assert tensorflow_lines(r.stderr) == [] and r.stderr == "", r.stderr
    got = _read_all(tmp_path / "out" / "typed")
    order = np.argsort(got["label"])                    # shuffled at pack time
    assert got["label"][order].tolist() == list(range(20))
    assert got["data"][order].tolist() == x.tolist()

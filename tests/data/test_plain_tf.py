"""No lock-in: the shards read with nothing but tf.data and the manifest's spec."""

import json

import numpy as np
import tensorflow as tf

import memfit
from tests.data.helpers import small_arrays


def test_plain_tfrecorddataset_reads_the_shards(tmp_path):
    arrays = small_arrays(250)
    memfit.pack(arrays, tmp_path / "ds", shards=3, samples_per_record=16, progress=False)
    doc = json.loads((tmp_path / "ds" / "manifest.json").read_text())

    # Only what the manifest documents: file names, feature dtypes and shapes.
    files = [str(tmp_path / "ds" / s["file"]) for s in doc["splits"]["train"]["shards"]]
    spec = {name: tf.io.FixedLenFeature([], tf.string) for name in doc["features"]}
    got = {name: [] for name in doc["features"]}
    for batch in tf.data.TFRecordDataset(files).batch(4).map(
            lambda r: tf.io.parse_example(r, spec)):
        for name, f in doc["features"].items():
            for block in batch[name].numpy():
                values = np.frombuffer(block, dtype=np.dtype(f["dtype"]).newbyteorder("<"))
                got[name].append(values.reshape(-1, *f["shape"]))
    got = {k: np.concatenate(v) for k, v in got.items()}
    order = np.argsort(got["id"])
    for name in arrays:
        np.testing.assert_array_equal(got[name][order], arrays[name])


def test_manifest_helper_spec_matches(tmp_path):
    memfit.pack(small_arrays(20), tmp_path / "ds", progress=False)
    m = memfit.Manifest.load(tmp_path / "ds")
    ds = tf.data.TFRecordDataset(m.files()).map(lambda r: tf.io.parse_single_example(
        r, m.tf_feature_spec()))
    first = next(iter(ds))
    assert set(first) == {"x", "y", "id"}

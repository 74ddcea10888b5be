"""``pack(images=..., keep_encoded=True)``: shards hold the files' bytes, the stream
decodes them, and gives what a pack without it gives."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import memfit
from memfit.data.format.manifest import Manifest
from memfit.errors import DatasetError

from .test_sources_images import ENV, make_folder, make_png16_folder


def _stream(path, **kw):
    ds = memfit.dataset(path, 64, shuffle=False, epochs=1, **kw)
    batches = list(ds)
    return (np.concatenate([b["image"].numpy() for b in batches]),
            np.concatenate([b["label"].numpy() for b in batches]), ds.memfit_plan)


def _both(tmp_path, root, size, crop=False):
    out = {}
    for keep in (False, True):
        d = tmp_path / f"ds-{keep}"
        memfit.pack(images=root, image_size=size, crop_to_aspect_ratio=crop, output=d,
                    shuffle=False, progress=False, keep_encoded=keep)
        out[keep] = _stream(d)
    return out


@pytest.mark.parametrize("crop", [False, True])
def test_encoded_stream_equals_the_decoded_pack_for_png_and_bmp(tmp_path, crop):
    root = make_folder(tmp_path / "photos", formats=("png", "bmp", "gif"))
    out = _both(tmp_path, root, (16, 12), crop)
    (plain, labels, _), (streamed, labels2, plan) = out[False], out[True]
    assert streamed.shape == plain.shape and streamed.dtype == np.uint8
    assert labels2.tolist() == labels.tolist()
    assert np.abs(streamed.astype(int) - plain.astype(int)).max() <= 1
    assert plan.decode_calls >= 1 and "decodes image (encoded → 16x12x3" in str(plan)
    m = Manifest.load(tmp_path / "ds-True")
    doc = json.loads((tmp_path / "ds-True" / "manifest.json").read_text())
    assert doc["format_version"] == 2 and "kept encoded" in m.source
    assert doc["features"]["image"]["shape"] == [None]
    assert doc["features"]["image"]["decode"]["size"] == [16, 12]
    assert doc["features"]["image"]["decode"]["crop_to_aspect_ratio"] is crop
    assert m.features["image"].decode.largest[0] * m.features["image"].decode.largest[1] \
        == max(Image.open(p).height * Image.open(p).width
               for p in root.rglob("*") if p.suffix.lower() in (".png", ".bmp", ".gif"))


def test_encoded_16_bit_pngs_equal_the_decoded_pack(tmp_path):
    """The stream's tf.io.decode_image and the packer's Pillow decode keep the same high
    byte of every 16-bit value (gray, gray + alpha, RGB, RGBA)."""
    make_png16_folder(tmp_path / "p16")
    out = _both(tmp_path, tmp_path / "p16", (16, 12))
    assert np.abs(out[True][0].astype(int) - out[False][0].astype(int)).max() <= 1


def test_encoded_jpeg_is_close_to_the_decoded_pack(tmp_path):
    root = make_folder(tmp_path / "photos", formats=("jpg",))
    out = _both(tmp_path, root, (20, 20))
    diff = np.abs(out[True][0].astype(np.float32) - out[False][0])
    # TensorFlow's and Pillow's JPEG decoders differ (chroma upsampling): measured on
    # these noise images (quality 95) mean 1.31, max 7 of 255
    assert diff.mean() < 1.5 and diff.max() <= 8


def test_shards_hold_the_files_bytes_and_plain_tf_reads_them(tmp_path):
    import tensorflow as tf

    root = make_folder(tmp_path / "photos", per_class=3, formats=("png", "jpg"))
    memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds", shuffle=False,
                progress=False, keep_encoded=True, samples_per_record=2)
    m = Manifest.load(tmp_path / "ds")
    files = sorted(p.read_bytes() for p in root.rglob("*")
                   if p.suffix.lower() in (".png", ".jpg"))
    got = []
    for rec in tf.data.TFRecordDataset(m.files()):
        ex = tf.io.parse_example(rec[None], m.tf_feature_spec())
        block = ex["image"].numpy()[0]
        lengths = tf.sparse.to_dense(ex["image/lengths"]).numpy()[0]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        got += [block[a:a + n] for a, n in zip(starts, lengths, strict=True)]
    assert sorted(got) == files


def test_a_file_that_does_not_decode_stops_or_is_skipped(tmp_path):
    root = make_folder(tmp_path / "photos", per_class=2, formats=("png",))
    bad = root / "dog" / "broken.png"
    bad.write_bytes(Image.new("RGB", (4, 4)).tobytes()[:7] + b"\x89PNG garbage")
    with pytest.raises(DatasetError, match="broken.png' does not decode"):
        memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds",
                    keep_encoded=True, progress=False)
    assert not (tmp_path / "ds").exists()
    r = memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds",
                    keep_encoded=True, progress=False, on_corrupt="skip")
    assert r.manifest.samples == 6 and "broken.png" in r.manifest.source


def test_cli_keep_encoded_and_its_bad_input(tmp_path):
    root = make_folder(tmp_path / "photos", per_class=2, formats=("png",))
    cmd = [sys.executable, "-m", "memfit", "pack"]
    ok = subprocess.run(cmd + ["--images", str(root), "--image-size", "8,8", "--keep-encoded",
                               "-o", str(tmp_path / "ds")], capture_output=True, text=True,
                        env=ENV)
    assert ok.returncode == 0, ok.stderr
    assert Manifest.load(tmp_path / "ds").features["image"].decode is not None
    np.save(tmp_path / "x.npy", np.zeros(3))
    bad = subprocess.run(cmd + [f"x={tmp_path / 'x.npy'}", "--keep-encoded", "-o",
                                str(tmp_path / "ds2")], capture_output=True, text=True, env=ENV)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "--keep-encoded applies to --images" in bad.stderr
    assert not (tmp_path / "ds2").exists()
    with pytest.raises(DatasetError, match="keep_encoded applies to images only"):
        memfit.pack({"x": np.zeros(3)}, tmp_path / "ds3", keep_encoded=True)


def test_the_decoded_batch_counts_against_the_budget(tmp_path):
    root = make_folder(tmp_path / "photos", per_class=4, formats=("png",))
    memfit.pack(images=root, image_size=(64, 64), output=tmp_path / "ds", progress=False,
                keep_encoded=True)
    small = memfit.dataset(tmp_path / "ds", 4, memory_budget="4MiB").memfit_plan
    # encoded samples are ~2 KiB; 64 decoded 64x64x3 images are 768 KiB a batch
    with pytest.raises(DatasetError, match=r"\(decoded: \d+\.\d KiB\)"):
        memfit.dataset(tmp_path / "ds", 2048, memory_budget="8MiB")
    assert small.estimated_bytes <= small.memory_budget


def test_on_jax_without_tensorflow_it_says_to_pack_without_keep_encoded(tmp_path):
    from .test_jax_feed import run_jax

    root = make_folder(tmp_path / "photos", per_class=2, formats=("png",))
    memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds", progress=False,
                keep_encoded=True)
    out = run_jax(tmp_path, """
        import memfit
        from memfit.errors import FrameworkMissingError
        try:
            memfit.dataset("ds", 4)
        except FrameworkMissingError as e:
            print(e)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = out.stdout.strip().splitlines()
    assert "pack the folder without --keep-encoded" in line, line


def test_on_jax_with_tensorflow_the_import_it_needs_prints_no_startup_lines(tmp_path):
    """A stranger on JAX saw absl's and cudart_stub's lines when memfit.dataset imported
    TensorFlow to decode images kept encoded: memfit's doing, so dropped; TensorFlow's
    warnings and errors, and the user's output, are not."""
    from memfit.quiet import is_noise

    from .test_jax_feed import run_jax

    root = make_folder(tmp_path / "photos", per_class=2, formats=("png",))
    memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds", progress=False,
                keep_encoded=True)
    env = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = run_jax(tmp_path, """
        import sys
        import memfit
        ds = memfit.dataset("ds", 4, shuffle=False, epochs=1)
        print("tensorflow imported:", "tensorflow" in sys.modules)
        print("batches:", sum(1 for _ in ds))
        print("the user's own line", file=sys.stderr)
    """, absent=(), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["tensorflow", "imported:", "True", "batches:", "2"], out.stdout
    assert out.stderr.strip() == "the user's own line", out.stderr
    assert not [ln for ln in out.stderr.splitlines() if is_noise(ln)]


def test_decode_image_is_the_packers_decode(tmp_path):
    from memfit.data.sources.image_source import decode_image, load_image

    path = Path(make_folder(tmp_path / "p", per_class=1, formats=("bmp",)) / "dog" / "img0.bmp")
    assert np.array_equal(decode_image(np.fromfile(path, np.uint8), (5, 7), True),
                          load_image(str(path), (5, 7), True))

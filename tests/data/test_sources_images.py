"""A folder of images in class sub-folders as a pack source, compared with
keras.utils.image_dataset_from_directory on small generated folders."""

import hashlib
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import memfit
from memfit.data.format.manifest import Manifest
from memfit.errors import DatasetError

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def make_folder(root: Path, per_class=5, seed=0, formats=("png", "bmp", "gif", "jpg")):
    """Classes named so that sorting matters; images of several sizes and modes."""
    rng = np.random.default_rng(seed)
    for c, cls in enumerate(["zebra", "Cat", "dog"]):
        (root / cls / "sub").mkdir(parents=True)
        for i in range(per_class):
            h, w = int(rng.integers(9, 40)), int(rng.integers(9, 40))
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            img = Image.fromarray(pixels)
            if i == 1:
                img = img.convert("L")                     # grayscale → RGB
            fmt = formats[(c + i) % len(formats)]
            suffix = fmt.upper() if i == 3 else fmt
            where = root / cls / ("sub" if i == 2 else "") / f"img{i}.{suffix}"
            img.save(where, quality=95) if fmt == "jpg" else img.save(where)
    (root / "zebra" / "notes.txt").write_text("not an image")
    return root


def write_png16(path: Path, values: np.ndarray) -> None:
    """A 16-bit PNG of ``values`` (uint16, height x width x channels: 1 gray, 2 gray +
    alpha, 3 RGB, 4 RGBA), written with zlib: Pillow writes 16-bit gray only."""
    h, w, c = values.shape
    rows = values.astype(">u2").reshape(h, w * c)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)      # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I",
                                                                       zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, {1: 0, 2: 4, 3: 2, 4: 6}[c], 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# 16-bit values where the candidates v >> 8 and round(v / 257) differ, then noise
EDGES = np.array([0, 1, 127, 128, 255, 256, 257, 383, 384, 32767, 32768, 32895, 32896,
                  65279, 65280, 65535], np.uint16)


def make_png16_folder(root: Path, h: int = 13, w: int = 17) -> list[tuple[str, np.ndarray]]:
    """16-bit PNGs of every colour type (gray also as Pillow writes it) in class ``a``,
    an 8-bit one in ``b``: ``[(file name, the values written)]`` in Keras's order."""
    rng = np.random.default_rng(3)
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    written = []
    for name, c in [("g16.png", 1), ("g16_pillow.png", 1), ("ga16.png", 2), ("rgb16.png", 3),
                    ("rgba16.png", 4)]:
        values = rng.integers(0, 2**16, (h, w, c), dtype=np.uint16)
        values[0, :len(EDGES)] = EDGES[:, None]
        if name == "g16_pillow.png":
            image = Image.fromarray(values[..., 0])
            assert image.mode == "I;16"
            image.save(root / "a" / name)
        else:
            write_png16(root / "a" / name, values)
        written.append((name, values))
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "b" / "x.png")
    return written


def test_16_bit_pngs_are_packed_as_keras_reads_them(tmp_path):
    """TensorFlow decodes a 16-bit PNG to uint8 keeping each value's high byte (v >> 8);
    Pillow opened 16-bit gray as mode I;16 and its RGB conversion clipped every value
    above 255 to 255. Gray, gray + alpha, RGB and RGBA, at their own size and resized."""
    written = make_png16_folder(tmp_path / "p16")
    for size in [(13, 17), (16, 12)]:
        _, k_images, _, k_files = _keras(tmp_path / "p16", size, False)
        out = tmp_path / f"ds{size[0]}"
        memfit.pack(images=tmp_path / "p16", image_size=size, output=out, shuffle=False,
                    progress=False)
        images = next(iter(memfit.dataset(out, 64, shuffle=False, epochs=1)))["image"].numpy()
        assert [Path(f).name for f in k_files[:5]] == [n for n, _ in written]
        for row, (name, values) in enumerate(written):
            diff = np.abs(images[row].astype(np.float32) - k_images[row]).max()
            assert diff <= 0.5 + 1e-3, (name, size, diff)
            if size == (13, 17):                    # not resized: exactly the high bytes
                gray_or_rgb = values[..., :1].repeat(3, -1) if values.shape[-1] <= 2 \
                    else values[..., :3]
                assert np.array_equal(images[row], (gray_or_rgb >> 8).astype(np.uint8)), name


def _keras(root, size, crop, **kw):
    import keras

    ds = keras.utils.image_dataset_from_directory(root, image_size=size, shuffle=False,
                                                  batch_size=64, crop_to_aspect_ratio=crop,
                                                  label_mode="int", **kw)
    images, labels = [], []
    for x, y in ds:
        images.append(x.numpy())
        labels.append(y.numpy())
    return ds.class_names, np.concatenate(images), np.concatenate(labels), ds.file_paths


@pytest.mark.parametrize("crop", [False, True])
def test_same_labels_class_order_and_pixels_as_keras(tmp_path, crop):
    root = make_folder(tmp_path / "photos", formats=("png", "bmp", "gif"))
    size = (16, 12)
    names, k_images, k_labels, k_files = _keras(root, size, crop)
    memfit.pack(images=root, image_size=size, crop_to_aspect_ratio=crop,
                output=tmp_path / "ds", shuffle=False, progress=False)
    m = Manifest.load(tmp_path / "ds")
    assert '["Cat", "dog", "zebra"]' in m.source and names == ["Cat", "dog", "zebra"]
    assert m.features["image"].shape == (16, 12, 3) and m.features["image"].dtype == "uint8"
    ds = memfit.dataset(tmp_path / "ds", 64, shuffle=False, epochs=1)
    # class names as data, as Keras gives them: they were only inside the free-text source
    assert m.class_names == ("Cat", "dog", "zebra") and ds.class_names == names
    batch = next(iter(ds))
    images, labels = batch["image"].numpy(), batch["label"].numpy()
    assert labels.dtype == np.int64 and labels.tolist() == k_labels.tolist()
    # lossless formats: Keras keeps float32, memfit rounds it to uint8
    assert np.abs(images.astype(np.float32) - k_images).max() <= 0.5 + 1e-3


def test_jpeg_decodes_close_to_tensorflow(tmp_path):
    root = make_folder(tmp_path / "photos", formats=("jpg",))
    _, k_images, _, _ = _keras(root, (20, 20), False)
    memfit.pack(images=root, image_size="20,20", output=tmp_path / "ds", shuffle=False,
                progress=False)
    images = next(iter(memfit.dataset(tmp_path / "ds", 64, shuffle=False, epochs=1)))["image"]
    diff = np.abs(images.numpy().astype(np.float32) - k_images)
    # Pillow's and TensorFlow's JPEG decoders differ (chroma upsampling); on these noise
    # images: mean 1.33, max 6.75 of 255
    assert diff.mean() < 1.5 and diff.max() <= 8


@pytest.mark.parametrize("shape, size", [((480, 640, 3), (128, 128)),
                                         ((333, 517, 3), (128, 96)),
                                         ((37, 21, 1), (128, 96)), ((1, 5, 3), (3, 3))])
def test_resize_is_tensorflows_bilinear_bit_for_bit(shape, size):
    import tensorflow as tf

    from memfit.data.sources.image_source import resize_bilinear

    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    ours = resize_bilinear(image, size)
    theirs = tf.image.resize(image, size, "bilinear").numpy()
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs)
    strided = image[::2, ::3]                                 # a view, not contiguous
    assert np.array_equal(resize_bilinear(strided, size),
                          tf.image.resize(strided, size, "bilinear").numpy())


def test_the_resize_extension_is_built_where_a_compiler_is():
    import shutil
    import sysconfig

    from memfit.data.sources import image_source

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: NumPy resizes a copy instead")
    assert image_source.cresize is not None, "memfit.data.sources.cresize did not build"


@pytest.mark.parametrize("mode, fmt", [("RGB", "PNG"), ("RGB", "JPEG"), ("L", "PNG"),
                                       ("RGBA", "PNG"), ("P", "GIF"), ("CMYK", "JPEG")])
def test_the_c_resize_from_pillow_s_memory_gives_the_numpy_resize_s_bytes(mode, fmt,
                                                                         monkeypatch):
    """load_image reads the decoded image from Pillow's memory in C (no copy, no GIL);
    without the extension it copies the image out and resizes it with NumPy. The bytes
    must be the same: shrinking and growing, crops, odd sizes, every mode Pillow opens."""
    import io

    from memfit.data.sources import image_source

    if image_source.cresize is None:
        pytest.skip("memfit.data.sources.cresize was not built (no C compiler at install)")
    rng = np.random.default_rng(7)
    used = []
    fast = image_source._resize_from_pillow

    def counted(*args):
        out = fast(*args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(image_source, "_resize_from_pillow", counted)
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(1, 260, 2))
        size = tuple(int(v) for v in rng.integers(1, 160, 2))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buf, fmt)
        for crop in (False, True):
            with_c = image_source.load_image(io.BytesIO(buf.getvalue()), size, crop)
            monkeypatch.setattr(image_source, "cresize", None)
            with_numpy = image_source.load_image(io.BytesIO(buf.getvalue()), size, crop)
            monkeypatch.undo()
            monkeypatch.setattr(image_source, "_resize_from_pillow", counted)
            assert with_c.dtype == np.uint8 and with_c.shape == (*size, 3)
            assert np.array_equal(with_c, with_numpy), (h, w, size, crop)
    assert used.count(True) == 80 and used.count(False) == 80


def test_an_image_pillow_keeps_in_several_blocks_is_resized_by_numpy():
    """Pillow exports only an image whose rows are one block of memory; a larger one
    (here 3000 x 2000) is copied out and resized by NumPy, the same way."""
    from memfit.data.sources import image_source

    pixels = np.random.default_rng(0).integers(0, 256, (3000, 2000, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    assert image_source._resize_from_pillow(image, (64, 64), False) is None
    expected = np.clip(np.rint(image_source.resize_bilinear(pixels, (64, 64))), 0, 255)
    import io
    buf = io.BytesIO()
    image.save(buf, "BMP")
    assert np.array_equal(image_source.load_image(io.BytesIO(buf.getvalue()), (64, 64), False),
                          expected.astype(np.uint8))


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


def test_shuffled_pack_has_every_image_once_and_reruns_byte_identical(tmp_path):
    root = make_folder(tmp_path / "photos", per_class=7)
    for out in ("a", "b"):
        memfit.pack(images=root, image_size=(8, 8), output=tmp_path / out,
                    split="train=0.7,val=0.3", progress=False)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    labels = []
    for split in ("train", "val"):
        for b in memfit.dataset(tmp_path / "a", 8, split=split, shuffle=False, epochs=1):
            labels += b["label"].numpy().tolist()
    assert sorted(labels) == [0] * 7 + [1] * 7 + [2] * 7


def _corrupt(root: Path) -> Path:
    bad = root / "dog" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    return bad


def test_a_file_that_does_not_decode_stops_the_pack_or_is_skipped(tmp_path, capsys):
    root = make_folder(tmp_path / "photos")
    bad = _corrupt(root)
    with pytest.raises(DatasetError, match=r"broken\.jpg.*does not decode.*on_corrupt"):
        memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
    result = memfit.pack(images=root, image_size=(8, 8), output=tmp_path / "ds",
                         on_corrupt="skip", progress=False)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "WARNING" in ln]
    assert len(err) == 1 and str(bad) in err[0] and "skipped 1 of 16" in err[0]
    assert result.samples == 15
    assert "skipped 1 file that does not decode" in Manifest.load(tmp_path / "ds").source


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def test_cli_bad_input_is_one_line_exit_2_and_nothing_left(tmp_path):
    make_folder(tmp_path / "photos", per_class=2)
    _corrupt(tmp_path / "photos")
    (tmp_path / "empty").mkdir()
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "flat" / "a.png")
    (tmp_path / "noimages" / "cat").mkdir(parents=True)
    before = set(os.listdir(tmp_path))
    cases = [(["--images", "nowhere", "--image-size", "8,8"], "No such folder of images"),
             (["--images", "empty", "--image-size", "8,8"], "no class sub-folders"),
             (["--images", "flat", "--image-size", "8,8"], "1 images but no class sub-folders"),
             (["--images", "noimages", "--image-size", "8,8"], "hold no images"),
             (["--images", "photos", "--image-size", "8x0"], "--image-size must be two positive"),
             (["--images", "photos"], "--images photos/ --image-size 128,128 "
                                      "(images='photos/', image_size=(128, 128) in Python)"),
             (["--images", "photos", "--image-size", "8,8"], "broken.jpg' does not decode")]
    for args, words in cases:
        r = _run("pack", *args, "-o", "out", "--quiet", cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit")]
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(lines) == 1 and words in lines[0], r.stderr
    assert set(os.listdir(tmp_path)) == before
    r = _run("pack", "--images", "photos", "--image-size", "8,8", "--on-corrupt", "skip",
             "-o", "out", "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and "packed 6 samples" in r.stdout, r.stderr
    assert r.stderr.count("WARNING") == 1


def test_cli_an_image_size_too_large_for_memory_is_one_line_exit_2(tmp_path):
    """100000x100000 is 27.9 GiB an image: refused before anything is decoded or written
    (by the memory check, or where over 112 GiB is available, by the record limit)."""
    make_folder(tmp_path / "photos", per_class=2, formats=("jpg",))
    before = set(os.listdir(tmp_path))
    r = _run("pack", "--images", "photos", "--image-size", "100000,100000", "-o", "out",
             "--quiet", cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("memfit")]
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert "too large" in lines[0] and "100000" in lines[0], lines[0]
    assert set(os.listdir(tmp_path)) == before


def test_the_memory_check_names_the_bytes_and_a_size_that_fits(tmp_path, monkeypatch):
    from memfit.data.sources import image_source

    root = make_folder(tmp_path / "photos", per_class=2, formats=("png",))
    copies = 4 if image_source.cresize is not None else 36
    available = 64 * 48 * 3 * copies - 1                 # one byte short of 64x48
    monkeypatch.setattr(image_source, "system_memory", lambda: (2**40, available))
    with pytest.raises(DatasetError) as e:
        memfit.pack(images=root, image_size="64,48", output=tmp_path / "ds", progress=False)
    message = str(e.value)
    assert message.startswith("image_size 64x48 is too large for this machine's memory")
    assert "9.0 KiB decoded (64 x 48 x 3 = 9,216 bytes)" in message
    assert f"holds about {copies} at once" in message and "at most about 63,47" in message
    assert not (tmp_path / "ds").exists()
    h, w = (int(v) for v in re.search(r"at most about (\d+),(\d+)", message).groups())
    assert h * w * 3 * copies <= available
    memfit.pack(images=root, image_size=(h, w), output=tmp_path / "ds", progress=False)
    assert Manifest.load(tmp_path / "ds").features["image"].shape == (h, w, 3)
    # kept encoded, the pack decodes nothing at that size: no memory check
    memfit.pack(images=root, image_size="64,48", output=tmp_path / "enc", progress=False,
                keep_encoded=True)


def test_a_record_over_protobufs_2_gib_is_refused_before_anything_is_written(tmp_path,
                                                                            monkeypatch):
    from memfit.data.sources import image_source

    root = make_folder(tmp_path / "photos", per_class=1, formats=("png",))
    monkeypatch.setattr(image_source, "system_memory", lambda: (2**50, 2**50))
    # 26755 x 26755 x 3 = 2,147,490,075 bytes: one image is over 2**31 - 1
    with pytest.raises(DatasetError, match=r"A record of 1 sample \(a sample: image uint8 "
                       r"\(26755, 26755, 3\) 2,147,490,075 bytes, label int64 \(\) 8 bytes\)"
                       r".*too large for the shards' format.*2,147,483,647 bytes.*"
                       r"format='arrays'"):
        memfit.pack(images=root, image_size=(26755, 26755), output=tmp_path / "ds",
                    progress=False)
    # one row less fits (2,147,409,810 bytes, and the record's 60 of tags and label)
    from memfit.data.packing.pack_options import PackOptions, check_record_size

    check_record_size(image_source.open_images(root, (26754, 26755)), PackOptions.of())
    with pytest.raises(DatasetError, match="too large for the shards' format"):
        check_record_size(image_source.open_images(root, (26755, 26755)), PackOptions.of())
    check_record_size(image_source.open_images(root, (26755, 26755)),
                      PackOptions.of(format="arrays"))
    # 1000 x 1000 x 3 bytes fits a record; 800 of them do not
    with pytest.raises(DatasetError, match=r"A record of 800 samples.*2\.2 GiB.*Give a "
                       r"smaller samples_per_record.*Received: samples_per_record=800"):
        memfit.pack(images=root, image_size=(1000, 1000), output=tmp_path / "ds",
                    samples_per_record=800, progress=False)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("size", [(16.5, 16), (True, 16), "16.5,16", (16, 16, 3), (0, 4)])
def test_an_image_size_that_is_not_two_whole_numbers_is_refused(size):
    """A stranger's pack(images=..., image_size=(16.5, 16)) packed at 16x16, and (True, 16)
    at 1x16: a size is two positive whole numbers, or it is refused."""
    from memfit.data.sources.image_source import parse_image_size

    with pytest.raises(DatasetError, match="image_size must be two positive integers"):
        parse_image_size(size)
    assert parse_image_size((16.0, 24)) == (16, 24) and parse_image_size("16x24") == (16, 24)
    assert parse_image_size("16X24") == (16, 24)       # a stranger's 64X64 was refused


def test_an_image_memfit_may_not_read_is_not_called_damaged(tmp_path, monkeypatch):
    """A stranger's image of mode 000 was said to 'not decode ... Delete or replace it'.
    (Tests run as root, whom chmod does not stop: the refusal is played.)"""
    from PIL import Image

    from memfit.data.sources import image_source

    for c in ("a", "b"):
        (tmp_path / "p" / c).mkdir(parents=True)
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "p" / c / "x.png")
    load = image_source.load_image

    def refuse(path, *args, **kwargs):
        if path.endswith(f"b{os.sep}x.png"):
            raise PermissionError(13, "Permission denied", path)
        return load(path, *args, **kwargs)

    monkeypatch.setattr(image_source, "load_image", refuse)
    with pytest.raises(DatasetError, match=r"x.png' cannot be read \(Permission denied\): "
                                           r"give memfit read access") as e:
        memfit.pack(images=tmp_path / "p", image_size=(8, 8), output=tmp_path / "out",
                    progress=False)
    assert "does not decode" not in str(e.value) and not (tmp_path / "out").exists()


def test_class_names_are_kept_with_every_format_and_only_for_images(tmp_path):
    """A stranger: `memfit inspect` printed "z\\u00e8bre" and nothing but the free-text
    source held the class names. The manifest keeps them as a list; the dataset has them as
    ``class_names``, in both formats and with the files kept encoded, with a structure of
    features too; arrays packed from NumPy have none."""
    from memfit.cli import main

    root = make_folder(tmp_path / "photos", formats=("png",))
    (root / "zebra").rename(root / "zèbre")
    for kind, kw in (("blocks", {}), ("arrays", {"format": "arrays"}),
                     ("encoded", {"keep_encoded": True})):
        out = tmp_path / kind
        r = memfit.pack(images=root, image_size=(8, 8), output=out, progress=False, **kw)
        assert r.manifest.class_names == ("Cat", "dog", "zèbre"), kind
        ds = memfit.dataset(out, 4, features=("image", "label"), epochs=1)
        assert ds.class_names == ["Cat", "dog", "zèbre"], kind
    assert main(["inspect", str(tmp_path / "blocks")]) == 0
    memfit.pack({"x": np.zeros((8, 2), np.float32)}, tmp_path / "plain", progress=False)
    assert Manifest.load(tmp_path / "plain").class_names == ()
    assert "class_names" not in (tmp_path / "plain" / "manifest.json").read_text()
    assert not hasattr(memfit.dataset(tmp_path / "plain", 4), "class_names")

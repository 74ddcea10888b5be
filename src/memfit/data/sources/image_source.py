"""A folder of images in class sub-folders (``photos/cat/*.jpg``, ``photos/dog/*.jpg``,
what ``keras.utils.image_dataset_from_directory`` reads) as a source.

Files are listed as Keras lists them: the class names are the sorted sub-folder names
(hidden ones left out), each class's files are found by walking its folder (sorted, links
not followed) and kept when their name ends in ``.bmp``, ``.gif``, ``.jpeg``, ``.jpg`` or
``.png`` (any case). The features are ``image`` (uint8, height × width × 3) and ``label``
(int64, the class's index). Images are decoded with Pillow (RGB, an animation's first
frame; a 16-bit PNG's high bytes, as TensorFlow decodes it) on a thread per core and
resized as Keras resizes them: TensorFlow's bilinear ``tf.image.resize`` (half-pixel
centres, no antialiasing), reproduced in NumPy (and in C, reading Pillow's memory without
the GIL, where the extension is built), after a centred crop to the target's aspect
ratio with ``crop_to_aspect_ratio``. Keras keeps the float32 result; memfit rounds it to
uint8. An ``image_size`` whose decoded images the pack could not hold in the memory
available is refused when the source opens (:func:`check_image_memory`).

With ``keep_encoded`` the ``image`` feature is each file's bytes as they are on disk (a
variable uint8 feature whose :class:`~memfit.data.format.encoded_image.EncodedImage` says how
the stream decodes it): every file is decoded once before anything is written, only to
check that it decodes and to find the largest image, and :func:`decode_image` is the
decode + resize a reader without TensorFlow would use.

Example:
    >>> import tempfile
    >>> from PIL import Image
    >>> d = Path(tempfile.mkdtemp())
    >>> for cls in ("cat", "dog"):
    ...     (d / cls).mkdir()
    ...     Image.new("RGB", (8, 6), (200, 10, 10)).save(d / cls / "a.png")
    >>> src = open_images(d, (4, 4))
    >>> src.class_names, src.length, src.features["image"].shape
    (['cat', 'dog'], 2, (4, 4, 3))
    >>> rows = src.take(np.array([1, 0]))
    >>> rows["label"].tolist(), rows["image"][0, 0, 0].tolist()
    ([1, 0], [200, 10, 10])
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memfit.data.format.encoded_image import EncodedImage
from memfit.data.format.manifest import Feature
from memfit.data.sources.columns import ArraySource, Columns
from memfit.errors import DatasetError
from memfit.memory.allocator import malloc_trim
from memfit.memory.probe import system_memory
from memfit.sizes import format_count, format_size

try:                        # the resize from Pillow's memory, without the GIL (setup.py)
    from memfit.data.sources import cresize
except ImportError:         # built without a C compiler: NumPy resizes a copy, same bytes
    cresize = None

__all__ = ["ImageFolderSource", "open_images", "list_images", "resize_bilinear",
           "parse_image_size", "load_image", "decode_image", "check_image", "check_image_memory",
           "IMAGE_FORMATS"]

IMAGE_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")     # Keras's allow-list
# What tf.io.decode_image reads, as Pillow names it: a kept file must be one of them.
ENCODED_FORMATS = ("BMP", "GIF", "JPEG", "PNG")


# Pillow's modes of a 16-bit grayscale image (see _to_rgb).
_GRAY16 = ("I;16", "I;16B", "I;16L", "I;16N")

_CHECK_CHUNK = 512          # files checked at once (see ImageSource._decodable)

# What a pack holds at once above its start, in decoded images at the target size (a
# chunk is one image once an image passes the source's chunk_bytes; the write pipe holds
# up to three chunks): measured packing 8x6 JPEGs at 3000x3000 (25.7 MiB an image), peak
# RSS above the start 3.24 images (TFRecord) and 3.40 (arrays) with the C resize, 34.3
# and 35.4 with the NumPy resize (its four float32 neighbours and their sums).
_PACK_IMAGES = 4
_PACK_IMAGES_NUMPY = 36


def parse_image_size(value: Any) -> tuple[int, int]:
    """``(height, width)`` from ``"128,128"`` (or ``"128x128"``, ``"128X128"``) or a pair of
    positive integers.

    Example:
        >>> parse_image_size("128,96")
        (128, 96)
    """
    parts = value.lower().replace("x", ",").split(",") if isinstance(value, str) else value
    try:
        parts = list(parts)
        # 16.5 is not truncated to 16, nor True taken for 1 (a stranger packed 1x16)
        if any(isinstance(p, bool) or isinstance(p, float) and not p.is_integer()
               for p in parts):
            raise ValueError
        h, w = (int(p) for p in parts)
        if h < 1 or w < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise DatasetError(f"image_size must be two positive integers, height and width "
                           f"(e.g. '128,128' or '128x128'). Received: image_size={value!r}"
                           ) from None
    return h, w


def check_image_memory(size: tuple[int, int]) -> None:
    """Refuses an ``image_size`` whose decoded images a pack cannot hold in the memory
    available now (``_PACK_IMAGES`` of them at once, ``_PACK_IMAGES_NUMPY`` without the C
    resize), before anything is decoded or written.

    Raises:
        DatasetError: naming the size, the bytes of one image at that size, what the pack
            would hold and what is available, and the largest size that fits.
    """
    h, w = size
    one = h * w * 3
    copies = _PACK_IMAGES if cresize is not None else _PACK_IMAGES_NUMPY
    need, available = one * copies, system_memory()[1]
    if need <= available:
        return
    scale = math.sqrt(available / need)
    fits = f"{max(1, int(h * scale))},{max(1, int(w * scale))}"
    raise DatasetError(f"image_size {h}x{w} is too large for this machine's memory: one image "
                       f"at that size is {format_size(one)} decoded ({h} x {w} x 3 = {one:,} "
                       f"bytes) and the pack holds about {copies} at once "
                       f"({format_size(need)}), more than the {format_size(available)} "
                       f"available now. Give a smaller image_size (at most about {fits} at "
                       f"this aspect ratio), or pack on a machine with more memory. "
                       f"Received: image_size=({h}, {w})")


def list_images(folder: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """The class names and ``(path, label)`` of every image, in Keras's order.

    Raises:
        DatasetError: for a folder that does not exist, holds no class sub-folders, or
            no images in them.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DatasetError(f"No such folder of images: {str(root)!r}. Give a folder with "
                           f"one sub-folder of images per class. Received: images={str(root)!r}")
    classes = [d for d in sorted(os.listdir(root))
               if (root / d).is_dir() and not d.startswith(".")]
    if not classes:
        loose = [f for f in os.listdir(root) if f.lower().endswith(IMAGE_FORMATS)]
        what = f"{len(loose)} images but no class sub-folders" if loose else "no class " \
            "sub-folders"
        raise DatasetError(f"The folder {str(root)!r} holds {what}: memfit (like "
                           f"keras.utils.image_dataset_from_directory) takes the labels from "
                           f"sub-folders, one per class (e.g. {str(root)}/cat/*.jpg, "
                           f"{str(root)}/dog/*.jpg).")
    files = []
    for label, name in enumerate(classes):
        walk = sorted(os.walk(root / name), key=lambda x: x[0])
        for directory, _, names in walk:
            files += [(os.path.join(directory, f), label) for f in sorted(names)
                      if f.lower().endswith(IMAGE_FORMATS)]
    if not files:
        raise DatasetError(f"The class sub-folders of {str(root)!r} ({', '.join(classes[:5])}"
                           f"{' ...' if len(classes) > 5 else ''}) hold no images: memfit "
                           f"reads files ending in {', '.join(IMAGE_FORMATS)}.")
    return classes, files


def _axis_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TensorFlow's bilinear sampling along one axis: lower and upper source index and
    the weight of the upper one (half-pixel centres)."""
    scale = n_in / n_out
    x = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * np.float32(scale) \
        - np.float32(0.5)
    floor = np.floor(x)
    lower = np.maximum(floor, 0).astype(np.intp)
    upper = np.minimum(np.ceil(x), n_in - 1).astype(np.intp)
    return lower, upper, (x - floor).astype(np.float32)


def resize_bilinear(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``tf.image.resize(image, size, "bilinear")`` in NumPy: float32 ``(h, w, c)``.

    Example:
        >>> resize_bilinear(np.array([[[0], [10]]], np.uint8), (1, 4))[0, :, 0].tolist()
        [0.0, 2.5, 7.5, 10.0]
    """
    h, w = size
    y0, y1, wy = _axis_weights(image.shape[0], h)
    x0, x1, wx = _axis_weights(image.shape[1], w)
    # The four neighbours gathered first (in the input's dtype), only then made float32:
    # the same values and operations as converting the whole image first, at the
    # output's size instead of the input's (a 640x480 photo to 128x128: ~7x less work).
    rows0, rows1 = image.take(y0, axis=0), image.take(y1, axis=0)
    a, b = rows0.take(x0, axis=1).astype(np.float32), rows0.take(x1, axis=1).astype(np.float32)
    c, d = rows1.take(x0, axis=1).astype(np.float32), rows1.take(x1, axis=1).astype(np.float32)
    wx = wx[None, :, None]
    top = a + (b - a) * wx
    bottom = c + (d - c) * wx
    return top + (bottom - top) * wy[:, None, None]


def _crop_box(height: int, width: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Keras's ``smart_resize`` crop: the largest centred box of the target's aspect."""
    th, tw = size
    ch = max(min(height, int(float(width * th) / tw)), 1)
    cw = max(min(width, int(float(height * tw) / th)), 1)
    return int(float(height - ch) / 2), int(float(width - cw) / 2), ch, cw


def load_image(path: Any, size: tuple[int, int], crop: bool) -> np.ndarray:
    """One image file (a path or a binary file object) decoded (RGB), cropped if asked and
    resized: uint8 ``(h, w, 3)``.

    Raises:
        OSError, ValueError: Pillow's error for a file that does not decode.
    """
    from PIL import Image

    with Image.open(path) as im:
        im.seek(0)
        image = _to_rgb(im)                     # a file that does not decode raises here
        resized = _resize_from_pillow(image, size, crop)
        if resized is not None:
            return resized
        rgb = np.asarray(image)
    if crop:
        top, left, ch, cw = _crop_box(rgb.shape[0], rgb.shape[1], size)
        rgb = rgb[top:top + ch, left:left + cw]
    if rgb.shape[:2] == tuple(size):
        return np.ascontiguousarray(rgb)
    out = resize_bilinear(rgb, size)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _to_rgb(im: Any) -> Any:
    """The open image ``im`` decoded and converted to RGB as ``tf.io.decode_image(channels=3)``
    converts it. A 16-bit grayscale PNG (Pillow's mode ``I;16``, ``I`` before Pillow 10)
    keeps each value's high byte, ``v >> 8``, what TensorFlow's libpng
    (``png_set_strip_16``) gives for uint8: Pillow's own conversion clips it to 255
    instead. (Pillow reads 16-bit gray + alpha, RGB and RGBA PNGs as 8-bit modes, keeping
    the high byte already.)"""
    from PIL import Image

    if im.mode == "RGB":
        im.load()
        return im
    if im.mode in _GRAY16 or (im.mode == "I" and im.format == "PNG"):
        im.load()
        gray = np.asarray(im).astype(np.int64)
        high = (np.clip(gray, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(high).convert("RGB")
    image = im.convert("RGB")
    image.load()
    return image


def _resize_from_pillow(image: Any, size: tuple[int, int], crop: bool) -> np.ndarray | None:
    """:func:`load_image`'s crop and resize read straight from the decoded RGB ``image``'s
    own memory, exported by Pillow through the Arrow C data interface, by the C extension
    (``cresize``) without the GIL: the same bytes as :func:`resize_bilinear` rounded to
    uint8, without copying the image out first. ``None`` where it cannot: no extension,
    a Pillow older than 11.2, or an image Pillow keeps in several blocks of memory."""
    if cresize is None:
        return None
    try:
        schema, array = image.__arrow_c_array__()
    except (AttributeError, ValueError):
        return None
    height, width = image.height, image.width
    top, left, ch, cw = _crop_box(height, width, size) if crop else (0, 0, height, width)
    y0, y1, wy = _axis_weights(ch, size[0])
    x0, x1, wx = _axis_weights(cw, size[1])
    out = np.empty((*size, 3), np.uint8)
    cresize.resize_rgbx(schema, array, height, width, top, left, y0, y1, wy, x0, x1, wx, out)
    return out


def decode_image(encoded: bytes | np.ndarray, size: tuple[int, int], crop: bool) -> np.ndarray:
    """An encoded image file's bytes decoded and resized as the packer does
    (:func:`load_image`): uint8 ``(h, w, 3)``.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (8, 6), (1, 2, 3)).save(buf, "PNG")
        >>> decode_image(buf.getvalue(), (2, 2), False)[1, 1].tolist()
        [1, 2, 3]
    """
    import io

    return load_image(io.BytesIO(memoryview(encoded).cast("B")), size, crop)


def check_image(path: str, encoded: bool) -> tuple[int, int]:
    """Decodes a file once (the first frame), only to check it: its ``(height, width)``.

    Raises:
        OSError, ValueError: for a file that does not decode, or (``encoded``) one that
            ``tf.io.decode_image`` would not read.
    """
    from PIL import Image

    with Image.open(path) as im:
        im.seek(0)
        im.load()
        if encoded and im.format not in ENCODED_FORMATS:
            raise ValueError(f"a {im.format} file, which tf.io.decode_image does not read: "
                             f"pack without keep_encoded (--keep-encoded)")
        return im.height, im.width


class ImageFolderSource(ArraySource):
    """Images in class sub-folders, decoded and resized when the packer reads them.

    It has the members of :class:`~memfit.data.sources.columns.ArraySource` (random
    access, known length), so either packer writes it.

    Args:
        folder: the folder of class sub-folders.
        image_size: ``(height, width)`` of the packed images.
        crop_to_aspect_ratio: crop each image to the target's aspect ratio (centred)
            before resizing, as Keras's option of that name; else it is stretched.
        on_corrupt: ``"raise"``: a file that does not decode stops the pack (naming it);
            ``"skip"``: every file is decoded once ahead, those that do not decode are
            left out, named in one warning line and counted in the manifest.
        workers: decoding threads (default: one per core).
        keep_encoded: keep each file's bytes as they are (``image`` is then a variable
            uint8 feature, decoded in the stream); every file is decoded once ahead,
            only to check it (a file that does not decode stops the pack before anything
            is written, or is skipped with ``on_corrupt="skip"``).
    """

    random_access = True
    #: Rows decoded at once by the packer (~21 images of 128x128): the chunks in flight
    #: are most of what a pack holds beyond the interpreter. With 2 MiB staging buffers,
    #: 1 MiB chunks pack 2 GiB of PNGs at the peak RSS of 0.25 GiB (58.7 MiB, 1.00 in
    #: two runs; 1.15 at 2 MiB chunks, 1.18 at 4 MiB) and cost ~7 % of the speed (pack ÷
    #: the decode limit 0.96 against 0.99-1.05): the decode threads wait at the end of
    #: each chunk.
    chunk_bytes = 2**20

    def __init__(self, folder: str | os.PathLike, image_size: Any, *,
                 crop_to_aspect_ratio: bool = False, on_corrupt: str = "raise",
                 workers: int | None = None, keep_encoded: bool = False):
        if on_corrupt not in ("raise", "skip"):
            raise DatasetError(f"on_corrupt must be 'raise' or 'skip'. "
                               f"Received: on_corrupt={on_corrupt!r}")
        self.folder = str(folder)
        self.size = parse_image_size(image_size)
        self.crop = bool(crop_to_aspect_ratio)
        self.workers = workers or os.cpu_count() or 1
        self.class_names, files = list_images(folder)
        self.keep_encoded = bool(keep_encoded)
        if not self.keep_encoded:           # kept encoded, the pack decodes no image at size
            check_image_memory(self.size)
        self.skipped: list[str] = []
        self.largest = (0, 0)
        if on_corrupt == "skip" or self.keep_encoded:
            files = self._decodable(files, skip=on_corrupt == "skip")
        self.files = [p for p, _ in files]
        self.labels = np.array([label for _, label in files], np.int64)
        self.length = len(self.files)
        self.paths: dict[str, str] = {}                       # nothing to memory-map
        image = Feature("image", "uint8", (*self.size, 3))
        if self.keep_encoded:
            image = Feature("image", "uint8", (None,),
                            EncodedImage(*self.size, self.crop, self.largest))
        self.features = {"image": image, "label": Feature("label", "int64", ())}
        self.columns: Columns = dict.fromkeys(self.features)  # names only: see take
        crop = ", crop_to_aspect_ratio" if self.crop else ""
        n = len(self.skipped)
        skipped = f"; skipped {format_count(n, 'file')} that do{'es' if n == 1 else ''} " \
            f"not decode: {json.dumps(self.skipped, ensure_ascii=False)}" if self.skipped else ""
        self.description = (f"images {self.folder} ({format_count(self.length, 'file')}, classes "
                            f"{json.dumps(self.class_names, ensure_ascii=False)} → label 0..."
                            f"{len(self.class_names) - 1}; image_size {self.size[0]}x"
                            f"{self.size[1]}, bilinear{crop}"
                            f"{', kept encoded' if self.keep_encoded else ''}{skipped})")

    def _decodable(self, files: list[tuple[str, int]], skip: bool) -> list[tuple[str, int]]:
        """The files that decode (each decoded once, in parallel; the largest's size kept);
        the others stop the pack (naming the first), or with ``skip`` are named in one
        warning line."""
        sizes = []

        def ok(path: str) -> tuple[str, str] | None:
            try:
                if self.keep_encoded:
                    sizes.append(check_image(path, True))
                else:
                    load_image(path, (1, 1), False)
                return None
            except (OSError, ValueError, SyntaxError) as e:
                return path, str(e)

        paths = [p for p, _ in files]
        problems: list[tuple[str, str] | None] = []
        with cf.ThreadPoolExecutor(self.workers) as pool:
            # A chunk at a time: pool.map submits every item at once, a future a file, so
            # the check's memory would grow with the folder.
            for start in range(0, len(paths), _CHECK_CHUNK):
                problems += pool.map(ok, paths[start:start + _CHECK_CHUNK])
        self.largest = max(sizes, key=lambda hw: (hw[0] * hw[1], hw), default=(1, 1))
        if not skip and any(problems):
            raise self._undecodable(*next(b for b in problems if b))
        self.skipped = [p for (p, _), bad in zip(files, problems, strict=True) if bad]
        if not self.skipped:
            return files
        kept = [f for f, bad in zip(files, problems, strict=True) if not bad]
        shown = "; ".join(f"{b[0]} ({b[1]})" for b in problems if b)
        if len(shown) > 500:
            shown = shown[:497] + "..."
        print(f"memfit: WARNING: skipped {len(self.skipped)} of "
              f"{format_count(len(files), 'image')} that do not decode (on_corrupt='skip'): "
              f"{shown}", file=sys.stderr, flush=True)
        if not kept:
            raise DatasetError(f"None of the {len(files)} images in {self.folder!r} "
                               f"decodes; nothing to pack.")
        return kept

    def take(self, indices: np.ndarray) -> Columns:
        """The images at ``indices``, decoded and resized on ``workers`` threads."""
        indices = np.asarray(indices, np.int64)

        if self.keep_encoded:                       # the files' bytes, as they are
            with cf.ThreadPoolExecutor(self.workers) as pool:
                images = list(pool.map(lambda i: np.fromfile(self.files[i], np.uint8),
                                       indices.tolist()))
            return {"image": images, "label": self.labels[indices]}

        def one(i: int) -> np.ndarray:
            try:
                return load_image(self.files[i], self.size, self.crop)
            except (OSError, ValueError, SyntaxError) as e:
                raise self._undecodable(self.files[i], str(e)) from None

        images = np.empty((len(indices), *self.size, 3), np.uint8)
        with cf.ThreadPoolExecutor(self.workers) as pool:
            for row, img in enumerate(pool.map(one, indices.tolist())):
                images[row] = img
        return {"image": images, "label": self.labels[indices]}

    @staticmethod
    def _undecodable(path: str, why: str) -> DatasetError:
        if "Permission denied" in why:          # not damage: say what to do about it
            return DatasetError(f"Image {path!r} cannot be read (Permission denied): give "
                                f"memfit read access to it (chmod), or move it out of the "
                                f"folder. Received: images folder holding {path!r}")
        return DatasetError(f"Image {path!r} does not decode ({why}). Delete or replace it, "
                            f"or pack with on_corrupt='skip' (--on-corrupt skip) to leave it "
                            f"out.")

    def release_pages(self) -> None:
        """Gives the C heap's free pages back (``malloc_trim``), after each chunk: the
        decode threads free large buffers (a photo decoded, its resize) that glibc serves
        from its heaps, which otherwise kept them and grew with the folder. A fixed mmap
        threshold kept the peak flat too, but mapping every decoded photo anew took the
        pack from 5.6 to 10 s for 3,000 photos."""
        malloc_trim()

    def fingerprint(self) -> str:
        """The files (path, size, mtime), their labels and the options."""
        h = hashlib.sha256(self.description.encode())
        for path in self.files:
            st = os.stat(path)
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        return h.hexdigest()


def open_images(folder: str | os.PathLike, image_size: Sequence[int] | str, *,
                crop_to_aspect_ratio: bool = False, on_corrupt: str = "raise",
                workers: int | None = None, keep_encoded: bool = False) -> ImageFolderSource:
    """A folder of images in class sub-folders opened as a source (see the module
    docstring); the arguments are :class:`ImageFolderSource`'s."""
    return ImageFolderSource(folder, image_size, crop_to_aspect_ratio=crop_to_aspect_ratio,
                             on_corrupt=on_corrupt, workers=workers,
                             keep_encoded=keep_encoded)

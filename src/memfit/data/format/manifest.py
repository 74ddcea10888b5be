"""``manifest.json``: what a packed dataset holds, and proof that it is complete.

The manifest is written last, after every shard has been renamed into place, so its
presence means the dataset is whole. It documents the feature spec well enough to read
the shards with plain TensorFlow (see :meth:`Manifest.tf_feature_spec`):

    >>> import tempfile, tensorflow as tf
    >>> from memfit.data.packing.packer import pack
    >>> out = tempfile.mkdtemp() + "/d"
    >>> _ = pack({"x": np.arange(8, dtype="float32").reshape(4, 2)}, out,
    ...          samples_per_record=2, progress=False)
    >>> m = Manifest.load(out)
    >>> ds = tf.data.TFRecordDataset(m.files("train"))
    >>> ds = ds.batch(8).map(lambda r: tf.io.parse_example(r, m.tf_feature_spec()))
    >>> x = tf.reshape(tf.io.decode_raw(next(iter(ds))["x"], tf.float32), [-1, 2])
    >>> sorted(x.numpy().tolist())                  # packed in a shuffled order
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]

Layout of one record: a block of up to ``samples_per_record`` consecutive samples; each
feature is one ``bytes_list`` value with the block's values (C order, little-endian) —
decode with ``tf.io.decode_raw`` and reshape to ``[-1, *shape]``. A variable-shape
feature (``shape[0]`` is ``null``) also has ``"<name>/lengths"`` (``int64_list``), the
first-dimension length of each sample in the block.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from memfit import checks
from memfit.atomic import write_text_atomic
from memfit.data.format.encoded_image import EncodedImage
from memfit.data.format.records import LENGTHS_SUFFIX
from memfit.errors import DatasetError

__all__ = ["Feature", "Shard", "Split", "Manifest", "ManifestBase",
           "ManifestSchema", "MANIFEST", "FORMAT", "FORMAT_VERSION", "SUPPORTED_DTYPES",
           "check_dtype", "check_feature_name", "manifest_file", "shard_name", "is_shard_name",
           "class_names_of"]

MANIFEST = "manifest.json"
FORMAT = "memfit-tfrecord-blocks"
FORMAT_VERSION = 2             # the newest this memfit reads; 2 = a feature has "decode"
# Dtypes that tf.io.decode_raw can turn back into tensors.
SUPPORTED_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                    "int64", "float16", "float32", "float64", "complex64", "complex128")


def check_dtype(name: str, dtype: Any, where: str = "") -> str:
    """The name of ``dtype`` when memfit can store it, else an error naming the feature.

    Example:
        >>> check_dtype("x", np.float32)
        'float32'

    Args:
        name: the feature; dtype: its dtype; where: said after the name (e.g. its file).
    """
    dtype = np.dtype(dtype)
    if dtype.name not in SUPPORTED_DTYPES:
        kind = {"O": "Python objects", "U": "unicode strings", "S": "byte strings",
                "V": "structured records", "M": "datetimes", "m": "timedeltas"}.get(dtype.kind)
        what = f" ({kind})" if kind else ""
        raise DatasetError(
            f"Feature {name!r}{where} has dtype {dtype}{what}, which memfit cannot store. "
            f"Convert it to one of {', '.join(SUPPORTED_DTYPES)} (e.g. encode strings as "
            f"integer ids). Received: {name}.dtype={dtype}")
    return dtype.name


def check_feature_name(name: Any) -> str:
    """A feature's name: a non-empty string without ``/`` (it names files and the
    ``<name>/lengths`` entry of a variable feature).

    Example:
        >>> check_feature_name("x/y")                               # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memfit.errors.DatasetError: Feature names must be ... Received: 'x/y'
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise DatasetError(f"Feature names must be non-empty strings without '/'. "
                           f"Received: {name!r}")
    return name


def manifest_file(path: str | os.PathLike) -> Path:
    """``PATH/manifest.json``, or ``PATH`` itself when it names the manifest."""
    p = Path(path)
    return p if p.name == MANIFEST else p / MANIFEST


def class_names_of(path: Any) -> tuple[str, ...]:
    """The label's class names the dataset at ``path`` records (``()`` where it has none,
    or ``path`` is not a dataset directory): what ``memfit.dataset`` gives its result as
    ``class_names``, as Keras's ``image_dataset_from_directory`` does.

    Example:
        >>> class_names_of("no/such/directory")
        ()
    """
    if not isinstance(path, str | os.PathLike) or not manifest_file(path).is_file():
        return ()
    file = manifest_file(path)
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return ()
    return ManifestSchema(file).names(doc, "class_names") if isinstance(doc, dict) else ()


def shard_name(split: str, index: int, count: int, compression: str | None) -> str:
    """``train-00003-of-00016.tfrecord`` (``.gz``/``.zz`` appended when compressed)."""
    suffix = {None: "", "GZIP": ".gz", "ZLIB": ".zz"}[compression]
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord{suffix}"


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a pack's shard name (:func:`shard_name`; ``mine.tfrecords`` isn't)."""
    return re.fullmatch(r".+-\d{5,}-of-\d{5,}\.tfrecord(\.gz|\.zz)?", name) is not None


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a sample: its dtype, per-sample shape and on-disk encoding.

    ``shape`` is the shape of one sample; a ``None`` first dimension marks a
    variable-shape feature, stored with its per-sample lengths. ``decode`` (an
    :class:`EncodedImage`) marks a variable uint8 feature whose samples are encoded
    image files, decoded and resized in the stream.
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    decode: EncodedImage | None = None

    @property
    def variable(self) -> bool:
        return bool(self.shape) and self.shape[0] is None

    @property
    def encoding(self) -> str:
        return "raw+lengths" if self.variable else "raw"

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """The fixed dimensions: the whole shape, or all but the first when variable."""
        return tuple(self.shape[1:] if self.variable else self.shape)  # type: ignore[arg-type]

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def sample_bytes(self) -> int | None:
        """Bytes of one sample (``None`` when variable)."""
        return None if self.variable else self.itemsize * math.prod(self.inner_shape)

    def to_json(self) -> dict[str, Any]:
        doc = {"dtype": self.dtype, "shape": list(self.shape), "encoding": self.encoding}
        return doc if self.decode is None else {**doc, "decode": self.decode.to_json()}


@dataclasses.dataclass(frozen=True)
class Shard:
    file: str
    samples: int
    records: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Split:
    name: str
    samples: int
    records: int
    raw_bytes: int
    shards: tuple[Shard, ...]

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


S = TypeVar("S")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManifestBase(Generic[S]):
    """What both manifest formats (TFRecord shards, :class:`Manifest`; ``.npy`` arrays,
    :class:`~memfit.data.format.arrays_format.ArraysManifest`) share: their common fields,
    splits by name, their totals, and saving (the subclass writes ``to_json()``).

    Attributes:
        features: name → :class:`Feature`; splits: name → split.
        seed: the seed of the pack's order; shuffled: written in a shuffled order.
        memfit_version: the memfit that wrote it; source: what was packed.
        path: the dataset directory (set when loaded or written).
        fingerprint: what ``memfit.pack`` packed (the source's identity and the options):
            a rerun of the same pack finds its dataset complete instead of refusing it.
        class_names: the label's classes, label ``i`` is ``class_names[i]`` (an image
            folder's sub-folders, as Keras's ``image_dataset_from_directory``; else empty).
    """

    features: dict[str, Feature]
    splits: dict[str, S]
    seed: int
    shuffled: bool
    memfit_version: str
    source: str = ""
    path: Path | None = None
    fingerprint: str = ""
    class_names: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def common_json(self, fmt: str, version: int, **extra: Any) -> dict[str, Any]:
        """The fields every manifest writes first, in order (``extra`` after
        ``shuffled``): what :meth:`ManifestSchema.common` reads back."""
        classes = {"class_names": list(self.class_names)} if self.class_names else {}
        return {"format": fmt, "format_version": version,
                "memfit_version": self.memfit_version, "seed": self.seed,
                "shuffled": self.shuffled, **extra, "source": self.source, **classes,
                "fingerprint": self.fingerprint}

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.splits.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())

    def split(self, name: str | None) -> S:
        """The split called ``name``; ``None`` means the only split there is."""
        if name is None:
            if len(self.splits) == 1:
                return next(iter(self.splits.values()))
            raise ValueError(f"This dataset has several splits; choose one with "
                             f"split=... from {sorted(self.splits)}. Received: split=None")
        if name not in self.splits:
            raise ValueError(f"No split {name!r} in {self.path}: it has {sorted(self.splits)}. "
                             f"Received: split={name!r}")
        return self.splits[name]

    def save(self, directory: str | os.PathLike) -> None:
        """Writes ``DIRECTORY/manifest.json`` (atomically: whole or not at all)."""
        write_text_atomic(Path(directory) / MANIFEST, json.dumps(self.to_json(), indent=1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest(ManifestBase[Split]):
    """The description of a packed dataset (see the module docstring for the layout).

    Attributes:
        samples_per_record: samples a record (the last record of a shard may hold fewer).
        compression: ``None``, ``"GZIP"`` or ``"ZLIB"``.
        (and those of :class:`ManifestBase`)
    """

    samples_per_record: int
    compression: str | None

    # -- reading -------------------------------------------------------------------------
    def files(self, split: str | None = None) -> list[str]:
        """Absolute paths of the shards of a split, in their stored order."""
        base = self.path or Path(".")
        return [str(base / s.file) for s in self.split(split).shards]

    def sample_bytes(self, split: str | None = None) -> float:
        """Mean decoded bytes of one sample (all features) in a split."""
        sp = self.split(split)
        return max(sp.raw_bytes / max(sp.samples, 1), 1.0)

    def tf_feature_spec(self) -> dict:
        """The ``tf.io.parse_example`` spec of one record (imports TensorFlow)."""
        import tensorflow as tf

        spec: dict = {}
        for f in self.features.values():
            spec[f.name] = tf.io.FixedLenFeature([], tf.string)
            if f.variable:
                spec[f.name + LENGTHS_SUFFIX] = tf.io.VarLenFeature(tf.int64)
        return spec

    # -- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            **self.common_json(FORMAT, 2 if any(f.decode for f in self.features.values())
                               else 1,
                               samples_per_record=self.samples_per_record,
                               compression=self.compression),
            "features": {n: f.to_json() for n, f in self.features.items()},
            "splits": {n: {"samples": s.samples, "records": s.records,
                           "raw_bytes": s.raw_bytes,
                           "shards": [dataclasses.asdict(sh) for sh in s.shards]}
                       for n, s in self.splits.items()},
            "totals": {"samples": self.samples, "bytes": self.bytes,
                       "records": sum(s.records for s in self.splits.values()),
                       "shards": sum(len(s.shards) for s in self.splits.values())},
            "layout": ("Each record is a tf.train.Example holding up to samples_per_record "
                       "consecutive samples. A feature is one bytes_list value: the block's "
                       "values in C order, little-endian (tf.io.decode_raw, then reshape to "
                       "[-1, *shape]). A feature whose shape starts with null is variable: "
                       "'<name>/lengths' (int64_list) gives each sample's first dimension. "
                       "A feature with 'decode' (kind image) holds each sample's encoded "
                       "image file (JPEG/PNG/GIF/BMP) as its bytes: decode it with "
                       "tf.io.decode_image(channels=3, expand_animations=False) and resize "
                       "it with tf.image.resize(size, 'bilinear') (after the centred crop "
                       "when crop_to_aspect_ratio), rounded to uint8."),
        }

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Manifest:
        """Reads ``DIRECTORY/manifest.json`` (or a path to the manifest itself).

        Every field is checked (:class:`ManifestSchema`): a manifest with a negative or
        non-numeric count, a split whose counts do not add up, or a document that is not
        a JSON object is refused, naming the field and the value.

        Raises:
            DatasetError: if there is no complete memfit dataset there.
        """
        schema, doc = ManifestSchema.open(directory, FORMAT, FORMAT_VERSION, hint=_interrupted)
        features = schema.features(doc)
        splits = {}
        listed = schema.mapping(schema.field(doc, "splits"), "splits", nonempty=True)
        for name, s in listed.items():
            where = f"splits.{name}"
            s = schema.mapping(s, where)
            shards = []
            raw = schema.field(s, "shards", where)
            if not isinstance(raw, list) or not raw:
                raise schema.error(f"{where}.shards", raw, "a non-empty list of shards")
            for i, sh in enumerate(raw):
                at = f"{where}.shards[{i}]"
                sh = schema.mapping(sh, at)
                shards.append(Shard(file=schema.file_name(schema.field(sh, "file", at),
                                                          f"{at}.file"),
                                    samples=schema.count(sh, "samples", at, positive=True),
                                    records=schema.count(sh, "records", at, positive=True),
                                    bytes=schema.count(sh, "bytes", at),
                                    sha256=schema.sha256(schema.field(sh, "sha256", at),
                                                         f"{at}.sha256")))
            split = Split(name, schema.count(s, "samples", where),
                          schema.count(s, "records", where),
                          schema.count(s, "raw_bytes", where), tuple(shards))
            for what in ("samples", "records"):
                total = sum(getattr(sh, what) for sh in shards)
                if getattr(split, what) != total:
                    raise schema.error(f"{where}.{what}", getattr(split, what),
                                       f"the sum over its shards ({total})")
            splits[name] = split
        compression = schema.field(doc, "compression")
        if compression not in (None, "GZIP", "ZLIB"):
            raise schema.error("compression", compression, "null, \"GZIP\" or \"ZLIB\"")
        return cls(features=features, splits=splits,
                   samples_per_record=schema.count(doc, "samples_per_record", positive=True),
                   compression=compression, **schema.common(doc))


_PACK_STATE = ".memfit-pack-state.json"     # what an unfinished pack leaves (pack_output.STATE)


def _interrupted(path: Path) -> str:
    """What to do about a path with no manifest: missing, an interrupted pack (state file
    or :func:`shard_name` shards), another program's TFRecord files, or nothing of memfit."""
    todo = ("give the directory memfit pack wrote (its -o DIR), or pack your data first "
            "(memfit pack ... -o DIR; memfit.pack in Python).")
    if not path.exists():
        return f" Check the path: {todo}"
    if not path.is_dir() or not any(path.glob("*.tfrecord*")):
        return f" No memfit pack wrote it: {todo}"
    if (path / _PACK_STATE).exists() or any(is_shard_name(p.name) for p in path.iterdir()):
        return (" It holds shards but no manifest: the pack was interrupted; rerun the "
                "same pack command to finish it.")
    return (f" It holds TFRecord files but no manifest, so no memfit pack wrote it: to read "
            f"the files in place give memfit.dataset the files "
            f"(memfit.dataset('{path}/*.tfrecord*', ...)), or pack them "
            f"(memfit pack --tfrecord '{path}/*.tfrecord*' -o data/train).")


class ManifestSchema:
    """Reads a ``manifest.json`` field by field, each checked: the one place where both
    manifest formats (TFRecord shards and ``.npy`` arrays) are validated, so that every
    error names the file, the field and the value, and says what to do.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / MANIFEST
        >>> _ = file.write_text('{"format": "memfit-tfrecord-blocks", "format_version": 1, '
        ...                     '"seed": -1}')
        >>> schema = ManifestSchema(file)
        >>> doc = schema.document(FORMAT, FORMAT_VERSION)
        >>> schema.count(doc, "seed")                                   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memfit.errors.DatasetError: ...: seed is -1, not a non-negative integer. ...
    """

    def __init__(self, file: str | os.PathLike):
        self.file = Path(file)

    @classmethod
    def open(cls, directory: str | os.PathLike, fmt: str, version: int, *,
             hint: Callable[[Path], str] | None = None) -> tuple[ManifestSchema, dict[str, Any]]:
        """The schema of ``DIRECTORY/manifest.json`` (or of that file) and its document.

        Args:
            directory: the dataset directory, or its manifest.
            fmt, version: the format this memfit reads, and its newest version.
            hint: what to add to the error when the manifest is missing, from the path.

        Raises:
            DatasetError: if there is no manifest of that format there.
        """
        path = Path(directory)
        file = manifest_file(path)
        if not file.exists():
            why = f"{MANIFEST} is missing" if path.exists() else "no such file or directory"
            raise DatasetError(f"No memfit dataset at {str(path)!r}: {why}."
                               f"{hint(path) if hint is not None else ''}")
        schema = cls(file)
        return schema, schema.document(fmt, version)

    def common(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The fields every manifest has besides its features and splits, checked, as
        keyword arguments of the manifest (its ``path`` too)."""
        return dict(seed=self.count(doc, "seed"), shuffled=self.flag(doc, "shuffled"),
                    memfit_version=self.text(doc, "memfit_version"),
                    source=self.text(doc, "source", default=""), path=self.file.parent,
                    fingerprint=self.text(doc, "fingerprint", default=""),
                    class_names=self.names(doc, "class_names"))

    def names(self, doc: dict[str, Any], key: str) -> tuple[str, ...]:
        """An optional list of strings (``[]`` when absent)."""
        value = self.field(doc, key, default=[])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, value, "a list of strings")
        return tuple(value)

    def error(self, where: str, value: Any, want: str) -> DatasetError:
        """The error for field ``where`` holding ``value`` instead of ``want``."""
        shown = json.dumps(value) if _jsonable(value) else repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return DatasetError(f"{self.file} is damaged: {where} is {shown}, not {want}. Pack the "
                            f"dataset again (memfit pack) or restore {MANIFEST} from a copy.")

    def document(self, fmt: str, version: int) -> dict[str, Any]:
        """The parsed JSON object, checked to be a manifest of ``fmt`` this memfit reads."""
        try:
            doc = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DatasetError(f"{self.file} is damaged or not a memfit manifest ({e}). Pack "
                               f"the dataset again (memfit pack) or restore {MANIFEST} from a "
                               f"copy.") from None
        if not isinstance(doc, dict):
            raise DatasetError(f"{self.file} is not a memfit manifest: it holds a JSON "
                               f"{type(doc).__name__} ({json.dumps(doc)[:40]}), not an object. "
                               f"Pack the dataset again (memfit pack) or restore {MANIFEST} "
                               f"from a copy.")
        if doc.get("format") != fmt:
            raise DatasetError(f"{self.file} is not a {fmt} manifest "
                               f"(format={doc.get('format')!r}).")
        got = self.count(doc, "format_version", positive=True)
        if got > version:
            raise DatasetError(f"{self.file} has format_version={got}, newer than this memfit "
                               f"reads ({version}); upgrade memfit.")
        return doc

    def field(self, doc: dict[str, Any], key: str, where: str = "", default: Any = ...) -> Any:
        """``doc[key]``; a missing key is an error (unless ``default`` is given)."""
        if key not in doc:
            if default is not ...:
                return default
            name = f"{where}.{key}" if where else key
            raise DatasetError(f"{self.file} is damaged: {name} is missing. Pack the dataset "
                               f"again (memfit pack) or restore {MANIFEST} from a copy.")
        return doc[key]

    def mapping(self, value: Any, where: str, *, nonempty: bool = False) -> dict[str, Any]:
        """``value`` (field ``where``) checked to be a JSON object."""
        if not isinstance(value, dict) or (nonempty and not value):
            raise self.error(where, value, "a non-empty object" if nonempty else "an object")
        return value

    def count(self, doc: dict[str, Any], key: str, where: str = "", *,
              positive: bool = False) -> int:
        """``doc[key]`` checked to be a non-negative (or positive) integer."""
        value = self.field(doc, key, where)
        if not _passes(checks.count, value, minimum=int(positive)):
            name = f"{where}.{key}" if where else key
            raise self.error(name, value, "a positive integer" if positive
                             else "a non-negative integer")
        return value

    def text(self, doc: dict[str, Any], key: str, where: str = "", default: Any = ...) -> str:
        value = self.field(doc, key, where, default)
        if not isinstance(value, str):
            raise self.error(f"{where}.{key}" if where else key, value, "a string")
        return value

    def flag(self, doc: dict[str, Any], key: str, where: str = "") -> bool:
        value = self.field(doc, key, where)
        if not _passes(checks.flag, value):
            raise self.error(f"{where}.{key}" if where else key, value, "true or false")
        return value

    def file_name(self, value: Any, where: str) -> str:
        """A data file's path relative to the dataset directory (no ``..``, not absolute)."""
        if not isinstance(value, str) or not value or value.startswith("/") \
                or ".." in Path(value).parts:
            raise self.error(where, value, "a file name inside the dataset directory")
        return value

    def sha256(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or len(value) != 64 \
                or any(c not in "0123456789abcdef" for c in value):
            raise self.error(where, value, "a sha256 (64 lowercase hex digits)")
        return value

    def features(self, doc: dict[str, Any], *, variable: bool = True) -> dict[str, Feature]:
        """The ``features`` object: names → supported dtype and a shape of non-negative
        integers (a ``null`` first dimension, variable, only where ``variable``)."""
        out = {}
        for name, f in self.mapping(self.field(doc, "features"), "features",
                                          nonempty=True).items():
            where = f"features.{name}"
            f = self.mapping(f, where)
            dtype = self.field(f, "dtype", where)
            if dtype not in SUPPORTED_DTYPES:
                raise self.error(f"{where}.dtype", dtype, f"one of {', '.join(SUPPORTED_DTYPES)}")
            shape = self.field(f, "shape", where)
            ok = isinstance(shape, list) and all(
                (d is None and i == 0 and variable)
                or _passes(checks.count, d)
                for i, d in enumerate(shape))
            if not ok:
                raise self.error(f"{where}.shape", shape,
                                 "a list of positive integers"
                                 + (" (the first may be null)" if variable else ""))
            out[name] = Feature(name, dtype, tuple(shape), self.decoding(f, where))
        return out

    def decoding(self, f: dict[str, Any], where: str) -> EncodedImage | None:
        """A feature's ``decode`` object (encoded images), checked; ``None`` if absent."""
        doc = f.get("decode")
        if doc is None:
            return None
        try:
            if doc.get("kind") != "image" or f.get("dtype") != "uint8" \
                    or f.get("shape") != [None]:
                raise ValueError
            e = EncodedImage.from_json(doc)
            if min(e.height, e.width, *e.largest) < 1:
                raise ValueError
            return e
        except (AttributeError, KeyError, TypeError, ValueError):
            raise self.error(f"{where}.decode", doc, "an encoded image's decoding "
                             "({\"kind\": \"image\", \"size\": [h, w], ...}) of a "
                             "uint8 feature of shape [null]") from None


def _passes(check: Callable[..., Any], value: Any, **rules: Any) -> bool:
    """Whether ``value`` passes one of :mod:`memfit.checks` (the rule for that kind of
    value everywhere in memfit); the schema words its own error, naming the field."""
    try:
        check("value", value, **rules)
    except ValueError:
        return False
    return True


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True

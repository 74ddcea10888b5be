"""``manifest.json``: what a packed dataset holds, and proof that it is complete.

The manifest is written last, after every shard has been renamed into place, so its
presence means the dataset is whole. It documents the feature spec well enough to read
the shards with plain TensorFlow (see :meth:`Manifest.tf_feature_spec`):

    >>> import json, tensorflow as tf                               # doctest: +SKIP
    >>> m = Manifest.load("data/train")                             # doctest: +SKIP
    >>> ds = tf.data.TFRecordDataset(m.files("train"))              # doctest: +SKIP
    >>> ds = ds.batch(8).map(lambda r: tf.io.parse_example(r, m.tf_feature_spec()))

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
from pathlib import Path
from typing import Any

import numpy as np

from memfit.atomic import write_text_atomic
from memfit.data.records import LENGTHS_SUFFIX
from memfit.errors import DatasetError

__all__ = ["Feature", "Shard", "Split", "Manifest", "MANIFEST", "FORMAT", "FORMAT_VERSION",
           "SUPPORTED_DTYPES", "shard_name"]

MANIFEST = "manifest.json"
FORMAT = "memfit-tfrecord-blocks"
FORMAT_VERSION = 1
# Dtypes that tf.io.decode_raw can turn back into tensors.
SUPPORTED_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                    "int64", "float16", "float32", "float64", "complex64", "complex128")


def shard_name(split: str, index: int, count: int, compression: str | None) -> str:
    """``train-00003-of-00016.tfrecord`` (``.gz``/``.zz`` appended when compressed)."""
    suffix = {None: "", "GZIP": ".gz", "ZLIB": ".zz"}[compression]
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord{suffix}"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a sample: its dtype, per-sample shape and on-disk encoding.

    ``shape`` is the shape of one sample; a ``None`` first dimension marks a
    variable-shape feature, stored with its per-sample lengths.
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]

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
        return {"dtype": self.dtype, "shape": list(self.shape), "encoding": self.encoding}


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


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The description of a packed dataset (see the module docstring for the layout)."""

    features: dict[str, Feature]
    splits: dict[str, Split]
    samples_per_record: int
    compression: str | None
    seed: int
    shuffled: bool
    memfit_version: str
    source: str = ""
    path: Path | None = None

    # -- reading -------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.splits.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())

    def split(self, name: str | None) -> Split:
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
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "memfit_version": self.memfit_version,
            "seed": self.seed,
            "shuffled": self.shuffled,
            "samples_per_record": self.samples_per_record,
            "compression": self.compression,
            "source": self.source,
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
                       "'<name>/lengths' (int64_list) gives each sample's first dimension."),
        }

    def save(self, directory: str | os.PathLike) -> None:
        write_text_atomic(Path(directory) / MANIFEST, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Manifest:
        """Reads ``DIRECTORY/manifest.json`` (or a path to the manifest itself).

        Raises:
            DatasetError: if there is no complete memfit dataset there.
        """
        path = Path(directory)
        file = path if path.name == MANIFEST else path / MANIFEST
        if not file.exists():
            hint = (" It holds shards but no manifest: the pack was interrupted; rerun the "
                    "same pack command to finish it." if path.is_dir()
                    and any(path.glob("*.tfrecord*")) else "")
            raise DatasetError(f"No memfit dataset at {str(path)!r}: {MANIFEST} is missing."
                               f"{hint}")
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
            if doc.get("format") != FORMAT:
                raise DatasetError(f"{file} is not a memfit manifest "
                                   f"(format={doc.get('format')!r}).")
            if doc["format_version"] > FORMAT_VERSION:
                raise DatasetError(f"{file} has format_version={doc['format_version']}, newer "
                                   f"than this memfit reads ({FORMAT_VERSION}); upgrade memfit.")
            features = {n: Feature(n, f["dtype"], tuple(f["shape"]))
                        for n, f in doc["features"].items()}
            splits = {n: Split(n, s["samples"], s["records"], s["raw_bytes"],
                               tuple(Shard(**sh) for sh in s["shards"]))
                      for n, s in doc["splits"].items()}
            return cls(features=features, splits=splits,
                       samples_per_record=int(doc["samples_per_record"]),
                       compression=doc["compression"], seed=int(doc["seed"]),
                       shuffled=bool(doc["shuffled"]), memfit_version=doc["memfit_version"],
                       source=doc.get("source", ""), path=file.parent)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, DatasetError):
                raise
            raise DatasetError(f"{file} is damaged or not a memfit manifest: {e!r}") from e

"""Data: pack sources into checksummed TFRecord shards (or ``.npy`` files), stream them
under a byte budget; ``.npy`` sources are read memory-mapped with a global shuffle.

The rooms, each with its map in its ``__init__``:

- :mod:`memfit.data.format`: what is on disk (TFRecord framing, ``manifest.json``, the
  "memfit-arrays" directory, the C extension).
- :mod:`memfit.data.sources`: what ``memfit.pack`` reads (arrays, ``.npz``, CSV, an
  iterable of samples), each opened as columns a packer writes.
- :mod:`memfit.data.packing`: ``memfit.pack``, its options, packers and output.
- :mod:`memfit.data.read`: ``memfit.dataset``, its plan and its readers, with the block
  reader in :mod:`memfit.data.read.blocks`.
- :mod:`memfit.data.verification`: ``memfit inspect``, ``memfit verify``.

Every room imports ``format``, which imports nothing of data; ``packing`` imports
``sources``. ``memfit.data.read.dispatch`` imports TensorFlow on Keras's TensorFlow backend
(on the others it feeds Keras a ``PyDataset``, :mod:`memfit.data.read.feeds`); it is loaded
on first use so that packing and the command line start fast.
"""

from typing import Any

from memfit.data.format.arrays_format import ArraysManifest
from memfit.data.format.manifest import Feature, Manifest
from memfit.data.packing.packer import PackResult, pack
from memfit.data.read.arrays_reader import ArraysPlan
from memfit.data.read.plan import DatasetPlan
from memfit.data.verification import inspect, verify
from memfit.frameworks import require_for_data

__all__ = ["ArraysManifest", "ArraysPlan", "Feature", "Manifest", "PackResult", "dataset",
           "DatasetPlan", "inspect", "pack", "verify"]


def __getattr__(name: str) -> Any:
    if name == "dataset":
        require_for_data("memfit.dataset")   # TensorFlow on its backend, else Keras
        from memfit.data.read import dispatch as stream

        return stream.dataset
    raise AttributeError(f"module 'memfit.data' has no attribute {name!r}")

"""Data: pack sources into checksummed TFRecord shards (or ``.npy`` files), stream them
under a byte budget; ``.npy`` sources are read memory-mapped with a global shuffle
(:mod:`memfit.data.arrays`).

``memfit.data.stream`` imports TensorFlow; it is loaded on first use so that packing and
the command line start fast.
"""

from typing import Any

from memfit.data.arrays import ArraysManifest, ArraysPlan
from memfit.data.manifest import Feature, Manifest
from memfit.data.pack import PackResult, pack
from memfit.data.verify import inspect, verify

__all__ = ["ArraysManifest", "ArraysPlan", "Feature", "Manifest", "PackResult", "dataset",
           "DatasetPlan", "inspect", "pack", "verify"]


def __getattr__(name: str) -> Any:
    if name in ("dataset", "DatasetPlan"):
        from memfit.data import stream

        return getattr(stream, name)
    raise AttributeError(f"module 'memfit.data' has no attribute {name!r}")

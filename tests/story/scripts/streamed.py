"""The clean script: the data packed once into shards (memfit.pack), streamed with
memfit.dataset (batch 256, 256 MiB budget, as in the README); nothing to change."""

import sys
import tempfile
from pathlib import Path

import numpy as np
from common import callbacks, epochs, model

import memfit


def pack(work):
    """Packs the data once (no TensorFlow needed): 96 MiB of x, 32 KiB of y."""
    rng = np.random.default_rng(0)
    memfit.pack({"x": rng.random((8192, 48, 64), dtype=np.float32),
                 "y": rng.random((8192, 1), dtype=np.float32)}, work / "data", progress=False)


work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
if not (work / "data" / "manifest.json").exists():
    pack(work)
train = memfit.dataset(work / "data", 256, features=("x", "y"), memory_budget="256MiB")
m = model((48, 64))
for _ in epochs():
    m.fit(train, epochs=1, verbose=0, callbacks=callbacks())
print("streamed: trained")

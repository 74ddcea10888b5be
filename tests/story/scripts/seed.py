"""The seed story: each epoch builds a Python list of 6,000 (x, y) NumPy tuples (about
70 MiB), stacks it, trains one epoch, then del + gc.collect(). Memory stays high after
the del: glibc keeps the freed chunks of the list in its arenas (allocator retention)."""

import gc

import numpy as np
from common import callbacks, epochs, model

m = model((48, 64))
for epoch in epochs():
    rng = np.random.default_rng(epoch)
    samples = []
    for i in range(6000):
        samples.append((rng.random((48, 64), dtype=np.float32),
                        np.array([i % 7], np.int32)))
    x_train = np.stack([s[0] for s in samples])
    y_train = np.stack([s[1] for s in samples])
    m.fit(x_train, y_train, batch_size=256, epochs=1, verbose=0, callbacks=callbacks())
    del samples, x_train, y_train
    gc.collect()
print("seed: trained")

"""A true leak: a global list keeps 24 MiB more of the data every epoch."""

import numpy as np
from common import callbacks, epochs, model

KEPT = []
m = model((64,))
x = np.random.default_rng(0).random((16384, 64), dtype=np.float32)   # 512 steps an epoch
y = x.sum(axis=1, keepdims=True)
for epoch in epochs():
    KEPT.append(np.random.default_rng(epoch).random((3 * 2**20,)) + epoch)   # 24 MiB
    m.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks())
print("leak: trained")

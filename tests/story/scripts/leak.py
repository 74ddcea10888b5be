"""A true leak: a global list keeps 24 MiB more of the data every epoch.

At least 18 epochs: from outside the leak is a staircase, one step an epoch, and the
last epoch and the interpreter's exit are flat. With 6 steps, on a machine so busy that
an epoch took 6 s and the exit 17 s, the flat end was a third of what watch judged, and
it read as a level: from outside the growth had stopped."""

import numpy as np
from common import EPOCHS, callbacks, epochs, model

KEPT = []
m = model((64,))
x = np.random.default_rng(0).random((16384, 64), dtype=np.float32)   # 512 steps an epoch
y = x.sum(axis=1, keepdims=True)
for epoch in epochs(3 * EPOCHS):
    KEPT.append(np.random.default_rng(epoch).random((3 * 2**20,)) + epoch)   # 24 MiB
    m.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks())
print("leak: trained")

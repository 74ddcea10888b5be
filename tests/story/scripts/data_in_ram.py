"""A large array held in RAM: fit() is given 160 MiB of NumPy arrays, every epoch."""

import numpy as np
from common import EPOCHS, callbacks, epochs, model

x_train = np.random.default_rng(0).random((10240, 4096), dtype=np.float32)   # 160 MiB
y_train = np.zeros((10240, 1), np.float32)
m = model((4096,))
for _ in epochs(3 * EPOCHS):      # long enough after the copy for a level to show
    m.fit(x_train, y_train, batch_size=256, epochs=1, verbose=0, callbacks=callbacks())
print("data_in_ram: trained")

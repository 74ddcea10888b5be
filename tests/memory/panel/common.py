"""Runs one panel scenario in this (child) process: N epochs of `step(epoch)` under a
MemoryMonitor driven by hand, then prints the verdict as one JSON line."""

import gc
import json
import sys

import memfit


def run(step, epochs=7, trim=None, warmup_epochs=1):
    monitor = memfit.MemoryMonitor(sys.argv[1], every_n_batches=0, warmup_epochs=warmup_epochs,
                                   trim=trim, verbose=0)
    monitor.on_train_begin()
    for epoch in range(epochs):
        step(epoch)
        gc.collect()
        monitor.on_epoch_end(epoch)
    monitor.on_train_end()
    v = monitor.verdict
    print(json.dumps({"verdict": v.kind, "slope": v.slope, "growth": v.growth,
                      "released": v.released, "values": monitor.epoch_values}))

"""The block reader: shards of fixed-shape features read straight into batches.

- :mod:`~memfit.data.read.blocks.block_layout`: where everything is in a record, and
  whether a set of shards can be read this way.
- :mod:`~memfit.data.read.blocks.block_plan`: the window, parallelism and prefetch depth
  chosen from the byte budget, and the memory model behind them.
- :mod:`~memfit.data.read.blocks.block_reader`: the reader, ``tf.data`` over the plan.
- :mod:`~memfit.data.read.blocks.block_io`: each window's records read into place, their
  frames and CRC32C checked.
"""

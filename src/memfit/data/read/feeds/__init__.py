"""Feeds without TensorFlow: ``memfit.dataset`` on Keras's other backends (JAX, PyTorch).

On those backends ``memfit.dataset`` returns a ``keras.utils.PyDataset`` over the same
readers, with the same plan, byte budget, order and errors as the ``tf.data`` pipelines:

- :mod:`~memfit.data.read.feeds.keras_feed`: the ``PyDataset`` (which epoch each pass
  reads, batches handed to Keras, memfit's one-line error for a damaged shard), and the
  arrays reader's feed.
- :mod:`~memfit.data.read.feeds.block_feed`: the block reader's windows cut into batches
  (whole batches as the ``tf.data`` rebatch cuts them; ``on_corrupt="skip"``: a stream of
  the samples that survive).
"""

"""Reading: ``memfit.dataset`` streams a packed dataset under a byte budget.

Read top-down, as a ``memory_budget`` travels:

- :mod:`~memfit.data.read.dispatch`: ``memfit.dataset``, the dispatcher. It checks the
  arguments (:mod:`~memfit.data.read.arguments`), opens the manifest and picks a reader.
- :mod:`~memfit.data.read.plan`: the :class:`~memfit.data.read.plan.DatasetPlan` every
  reader returns as ``ds.memfit_plan`` and the steps every plan goes through.
- the readers: the block reader (:mod:`memfit.data.read.blocks`, shards of fixed-shape
  features), :mod:`~memfit.data.read.tf_reader` (``tf.data``'s own reader for every other
  shard) and :mod:`~memfit.data.read.arrays_reader` (``.npy`` arrays memory-mapped, with
  :mod:`~memfit.data.read.arrays_input` opening them).
- what the readers share: :mod:`~memfit.data.read.feeder` (the order of a pass, a pure
  function of ``(seed, epoch)``, and the windows built ahead in it),
  :mod:`~memfit.data.read.buffers` (memory reused instead of taken anew),
  :mod:`~memfit.data.read.pipeline_tail` (the common end of every ``tf.data`` pipeline)
  and :mod:`~memfit.data.read.translate_errors` (TensorFlow's error for a damaged shard
  turned into memfit's :class:`~memfit.errors.CorruptShardError`).

- :mod:`memfit.data.read.feeds`: the same readers fed to Keras as a
  ``keras.utils.PyDataset`` on its other backends (JAX, PyTorch), without TensorFlow. It
  is a sub-package of its own (``keras_feed``, ``block_feed``) because this room holds the
  ten modules a room may hold, and a feed is one concept: how batches reach a framework
  other than ``tf.data``.

``dispatch`` imports TensorFlow only on its backend (and for the TF reader);
:mod:`memfit.data` loads it on first use.
"""

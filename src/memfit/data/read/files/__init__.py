"""TFRecord files of ``tf.train.Example`` records streamed in place: ``memfit.dataset``
given a list of files (or a glob) rather than a packed directory.

- :mod:`~memfit.data.read.files.tfrecord_files`: the files opened without TensorFlow:
  compression told from their first bytes, records counted, the spec inferred and checked
  with the pack's own check (:class:`~memfit.data.sources.tfrecord_source.SpecCheck`).
- :mod:`~memfit.data.read.files.files_plan`: the
  :class:`~memfit.data.read.files.files_plan.FilesPlan`
  the budget buys (the window permuted whole, readers, decoding in parallel, prefetch).
- :mod:`~memfit.data.read.files.files_reader`: the ``tf.data`` pipeline
  (``TFRecordDataset``, seeded windows permuted whole, decoding a batch at a time).

A sub-package of its own because :mod:`memfit.data.read` holds the ten modules a room may
hold, and reading files memfit did not write is one concept.
"""

"""Sources: what ``memfit.pack`` can read, each turned into columns a packer writes.

- :mod:`~memfit.data.sources.columns`: the two kinds of source every packer reads,
  random-access columns (:class:`~memfit.data.sources.columns.ArraySource`) and an
  iterable of samples (:class:`~memfit.data.sources.columns.StreamSource`), validated
  before a byte is written.
- :mod:`~memfit.data.sources.opening`: ``pack``'s ``source`` argument (a dict of arrays or
  ``.npy`` paths, an ``.npz`` or ``.npy`` file, an iterable) opened as one of them.
- :mod:`~memfit.data.sources.csv_table`: a CSV file converted to ``.npy`` columns.
- :mod:`~memfit.data.sources.tfrecord_source`: TFRecord files of ``tf.train.Example``
  records (plain, GZIP, ZLIB), their spec inferred and every record checked by a first
  pass, then read record by record (an ``ArraySource`` with the same members).
- :mod:`~memfit.data.sources.example_proto`: the ``tf.train.Example`` and
  ``TensorProto`` bytes of other programs' records, decoded without TensorFlow.

- :mod:`~memfit.data.sources.image_source`: a folder of images in class sub-folders,
  listed, decoded (Pillow, a thread per core) and resized as Keras does.

- :mod:`~memfit.data.sources.parquet_source`: a Parquet table (pyarrow, the
  ``memfit[parquet]`` extra) converted row group by row group to ``.npy`` columns.

A new kind of input is a module here that gives an
``ArraySource`` or a ``StreamSource`` (or a class with the same members); the packers do
not change.
"""

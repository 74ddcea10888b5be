"""Sources: what ``memfit.pack`` can read, each turned into columns a packer writes.

- :mod:`~memfit.data.sources.columns`: the two kinds of source every packer reads,
  random-access columns (:class:`~memfit.data.sources.columns.ArraySource`) and an
  iterable of samples (:class:`~memfit.data.sources.columns.StreamSource`), validated
  before a byte is written.
- :mod:`~memfit.data.sources.opening`: ``pack``'s ``source`` argument (a dict of arrays or
  ``.npy`` paths, an ``.npz`` or ``.npy`` file, an iterable) opened as one of them.
- :mod:`~memfit.data.sources.csv_table`: a CSV file converted to ``.npy`` columns.

A new kind of input (TFRecord files, a folder of images, a Parquet table) is a module
here that gives an ``ArraySource`` or a ``StreamSource``; the packers do not change.
"""

"""The formats memfit writes and reads, with no TensorFlow import.

- :mod:`~memfit.data.format.records`: TFRecord framing and ``tf.train.Example`` encoding;
  it owns memfit's optional C extension, ``memfit.data.format.cwindow`` (``cwindow.c``).
- :mod:`~memfit.data.format.manifest`: a packed dataset's ``manifest.json`` (its
  features, splits and shards with their checksums, the label's class names).
- :mod:`~memfit.data.format.encoded_image`: how a feature of image files kept encoded
  is decoded (the manifest's ``decode`` object).
- :mod:`~memfit.data.format.arrays_format`: the "memfit-arrays" directory (one ``.npy``
  file per split and feature) and its manifest.

A change to what is on disk starts here; packers (:mod:`memfit.data.packing`) and
readers (:mod:`memfit.data.read`) import these modules and nothing imports upward.
"""

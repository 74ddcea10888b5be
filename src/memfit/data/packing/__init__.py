"""Packing: ``memfit.pack`` writes a source into checksummed shards plus a manifest.

Read in this order:

- :mod:`~memfit.data.packing.packer`: ``memfit.pack`` itself, the one entry; it checks
  the input, prepares the output and hands the work to a packer.
- what can be packed is the room next door, :mod:`memfit.data.sources`.
- :mod:`~memfit.data.packing.pack_options`: the options both packers share
  (:class:`~memfit.data.packing.pack_options.PackOptions`), the seeded split order,
  the rows gathered from a source, the progress bar; and
  :mod:`~memfit.data.packing.pack_writing`: files written under a temporary name with
  their sha256, written and committed (fsync, rename) in background threads.
- the packers: :mod:`~memfit.data.packing.pack_shards` (TFRecord shards, the default)
  and :mod:`~memfit.data.packing.arrays_pack` (``format="arrays"``).
- the output directory: :mod:`~memfit.data.packing.pack_output` (made ready, resumed,
  undone on failure) and :mod:`~memfit.data.packing.pack_replace` (``overwrite=True``:
  the old dataset or the new one, whole, at every instant).

A new source goes into :mod:`memfit.data.sources`; a new way to write goes beside the two
packers.
"""

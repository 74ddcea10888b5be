"""Builds memfit's two C extensions; everything else about the package is in pyproject.toml.

``memfit.data.format.cwindow`` runs the block reader's inner loops over a window in C (see its
source). It is optional: where no C compiler is found the install goes on without it and
the block reader falls back to reading each record into a scratch buffer and gathering
its samples with NumPy (about a third slower on the development machine).

``memfit.data.sources.cresize`` resizes a decoded image from Pillow's own memory without
the GIL, for the image packer; optional too: without it (or with a Pillow older than
11.2) the packer copies each image out and resizes it with NumPy, the same bytes, slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("memfit.data.format.cwindow", ["src/memfit/data/format/cwindow.c"],
              optional=True),
    # No fused multiply-add: the resize must round as NumPy's float32 operations do.
    Extension("memfit.data.sources.cresize", ["src/memfit/data/sources/cresize.c"],
              extra_compile_args=["-ffp-contract=off"], optional=True),
])

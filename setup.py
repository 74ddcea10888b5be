"""Builds memfit's one C extension; everything else about the package is in pyproject.toml.

``memfit.data.format.cwindow`` runs the block reader's inner loops over a window in C (see its
source). It is optional: where no C compiler is found the install goes on without it and
the block reader falls back to reading each record into a scratch buffer and gathering
its samples with NumPy (about a third slower on the development machine).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("memfit.data.format.cwindow", ["src/memfit/data/format/cwindow.c"],
                           optional=True)])

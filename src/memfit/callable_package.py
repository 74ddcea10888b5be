"""A package that can still be called as the function whose old name it shares.

``memfit.estimate``, ``memfit.share`` and ``memfit.doctor`` were once functions bound over
the packages of the same name, so ``import memfit.estimate as e`` gave a function and the
package could only be reached with ``from memfit.estimate import ...``. The names now mean
the packages; the functions are :func:`memfit.estimate_memory`, :func:`memfit.share_jobs`
and :func:`memfit.run_doctor`. For one release a call of the package still runs the
function, with a :class:`DeprecationWarning` that names the new spelling.

Why a class swap: a module object cannot be called, and the plain ways do not serve: a
function under the old name hides the package again, and a module ``__getattr__`` is never
asked for a name the module has. Python supports giving a module a ``ModuleType``
subclass as its ``__class__`` (since 3.5), and ``tests/test_api.py`` fails if that stops
working or if a package loses its call.

Example:
    >>> import memfit.estimate
    >>> callable(memfit.estimate), memfit.estimate.__name__
    (True, 'memfit.estimate')
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

__all__ = ["make_callable"]

_CALL = "__memfit_call__"        # (module:function, new public name), kept on the package


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target, new_name = self.__dict__[_CALL]
        warnings.warn(
            f"calling {self.__name__}(...) is deprecated and stops working in the next "
            f"release: call memfit.{new_name}(...) instead ({self.__name__} is the package)",
            DeprecationWarning, stacklevel=2)
        module, function = target.split(":")
        return getattr(importlib.import_module(module), function)(*args, **kwargs)


def make_callable(package: str, target: str, new_name: str) -> None:
    """Let the (imported) ``package`` be called as ``target`` for one more release.

    Args:
        package: the package's name, as in ``sys.modules`` (its ``__init__`` passes
            ``__name__``).
        target: ``"module:function"`` that a call runs, imported on the first call.
        new_name: the function's public name under ``memfit``, named in the warning.

    Example:
        >>> make_callable("memfit.estimate", "memfit.estimate.estimator:estimate",
        ...               "estimate_memory")                              # doctest: +SKIP
    """
    module = sys.modules[package]
    module.__dict__[_CALL] = (target, new_name)
    module.__class__ = _CallablePackage

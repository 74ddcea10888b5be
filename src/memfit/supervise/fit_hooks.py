"""Hooks around ``fit``'s callback list: run before and after *all* callbacks, and hide a
resumed epoch's replayed calls from the callbacks whose state was restored.

Why a plain callback does not serve: a callback sees only its own turn in the list.
Saving the other callbacks' state needs the moment after all of them have run
(``ReduceLROnPlateau`` placed after the session's callback sets the rate in its own
``on_epoch_end``); putting it back needs the moment after all of their
``on_train_begin`` (each resets its state there), and ``CSVLogger`` must be told to
append *before* its ``on_train_begin`` opens the file. Keras gives a callback no handle
on its :class:`keras.callbacks.CallbackList`, so :func:`find_list` looks for it in the
caller's frame while the list runs ``set_model`` on its callbacks (``fit`` builds the
list, and the list calls ``set_model`` on each callback, before any other hook).
:func:`install` then shadows the list's hook methods on that one instance (the class is
untouched; ``fit`` drops the list when it returns). ``tests/supervise/test_callbacks.py``
fails if a Keras release changes either step.

Example:
    >>> import keras
    >>> class Owner(keras.callbacks.Callback):
    ...     def set_model(self, model):
    ...         super().set_model(model)
    ...         self.found = find_list(self)
    >>> owner = Owner()
    >>> callbacks = keras.callbacks.CallbackList([owner], model=keras.Sequential())
    >>> owner.found is callbacks
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

import keras

__all__ = ["find_list", "install", "Owner"]

_MARK = "_memfit_hooks"


class Owner(Protocol):
    """What :func:`install` calls: the session's callback."""

    def before_train_begin(self, callbacks: Any) -> None: ...

    def after_train_begin(self, callbacks: Any) -> None: ...

    def after_train_batch_end(self, batch: int) -> None: ...

    def after_epoch_end(self, epoch: int) -> None: ...

    def replaying(self, hook: str) -> bool: ...

    def hidden(self, callback: Any) -> bool: ...


def find_list(callback: Any, depth: int = 6) -> Any:
    """The :class:`keras.callbacks.CallbackList` that holds ``callback`` and is calling
    it now (from its ``set_model`` or another hook), or ``None``."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, keras.callbacks.CallbackList) and \
                any(c is callback for c in candidate.callbacks):
            return candidate
        frame = frame.f_back
    return None


def install(callbacks: Any, owner: Owner) -> bool:
    """Shadows ``callbacks``' hook methods (once per list) so that ``owner`` runs around
    them. Returns whether it did (``False``: already installed)."""
    if getattr(callbacks, _MARK, None) is owner:
        return False
    plain = {name: getattr(type(callbacks), name).__get__(callbacks)
             for name in ("on_train_begin", "on_epoch_begin", "on_train_batch_begin",
                          "on_train_batch_end", "on_epoch_end")}

    def visible(hook: str, call: Callable[[], None]) -> None:
        """Runs ``call`` with the restored callbacks left out while ``hook`` replays."""
        if not owner.replaying(hook):
            call()
            return
        everyone = callbacks.callbacks
        callbacks.callbacks = [c for c in everyone if not owner.hidden(c)]
        try:
            call()
        finally:
            callbacks.callbacks = everyone

    def on_train_begin(logs: dict | None = None) -> None:
        owner.before_train_begin(callbacks)
        plain["on_train_begin"](logs)
        owner.after_train_begin(callbacks)

    def on_epoch_begin(epoch: int, logs: dict | None = None) -> None:
        visible("epoch_begin", lambda: plain["on_epoch_begin"](epoch, logs))

    def on_train_batch_begin(batch: int, logs: dict | None = None) -> None:
        visible("batch_begin", lambda: plain["on_train_batch_begin"](batch, logs))

    def on_train_batch_end(batch: int, logs: dict | None = None) -> None:
        visible("batch_end", lambda: plain["on_train_batch_end"](batch, logs))
        owner.after_train_batch_end(batch)

    def on_epoch_end(epoch: int, logs: dict | None = None) -> None:
        plain["on_epoch_end"](epoch, logs)
        owner.after_epoch_end(epoch)

    for name, hook in (("on_train_begin", on_train_begin), ("on_epoch_begin", on_epoch_begin),
                       ("on_train_batch_begin", on_train_batch_begin),
                       ("on_train_batch_end", on_train_batch_end),
                       ("on_epoch_end", on_epoch_end)):
        setattr(callbacks, name, hook)
    setattr(callbacks, _MARK, owner)
    return True

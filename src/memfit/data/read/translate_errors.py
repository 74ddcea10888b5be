"""TensorFlow's error for a damaged shard, turned into memfit's :class:`CorruptShardError`.

memfit's readers report a damaged, truncated or missing shard inside ``tf.data`` as an
assertion whose text is memfit's one-line message (:func:`assert_clean`). TensorFlow turns
that into an ``InvalidArgumentError`` of 10 to 30 lines. :func:`install` makes such an error
an instance of :class:`~memfit.errors.CorruptShardError` as well. Its ``str()`` is
memfit's message, naming the file and the record, and it has ``.file`` and ``.record``.
It is still the TensorFlow error it was: ``except tf.errors.InvalidArgumentError`` still
catches it, and ``.message`` still holds TensorFlow's full text. This works the same in
``model.fit``/``evaluate``/``predict``, in ``for batch in ds`` and on datasets derived
from memfit's (``ds.map(...)``, ``ds.take(n)``). An uncaught one ends a script with a short
traceback whose last line is ``memfit.errors.CorruptShardError: memfit: shard FILE ...``.
:func:`short_iteration` also cuts TensorFlow's five frames out of that traceback when a
dataset memfit returned is iterated in Python (``for batch in ds``, Keras's ``predict``).

Why the trick, and why a plain way does not serve. The error is raised in the reader's
Python (the block and arrays readers run inside a ``numpy_function``) or by an in-graph
assertion (the TF reader). Either way TensorFlow carries it across C++ as a status (a code
and a text). When the op or function returns to Python, TensorFlow builds a new exception
of the class registered for the code. It does that in C++ for a function (``model.fit``
runs one per step) and in ``core._status_to_exception`` for an eager op (``next(it)``).
The Python class and traceback are gone by then. ``model.fit`` runs the pipeline inside a
``tf.function``, so no memfit frame is on the stack when the error reaches Python, and
memfit has nowhere to catch it and raise its own. An earlier version swapped the
``__class__`` of the dataset memfit returned, so that its iterator re-raised. That served
``for batch in ds`` only: not ``fit``, ``evaluate``, ``predict``, nor a dataset made from
memfit's with ``.map``/``.take``. TensorFlow has no public hook from a status to an
exception. Every such exception is built by the public constructor
``tf.errors.OpError.__init__``, so :func:`install` wraps it. The wrapper calls it, then
swaps the new error's ``__class__`` when its text is memfit's message. Nothing changes for
any other error. If a TensorFlow release builds its errors some other way, memfit's message
is still in TensorFlow's text, and ``tests/data/test_fit_errors.py`` fails: its
``test_the_hook_turns_*`` tests are the canary.

:func:`short_iteration` keeps the earlier trick for the traceback alone. It swaps the
``__class__`` of the dataset for a subclass whose iterators re-raise memfit's error from
one memfit frame. There is no public way to give a ``tf.data`` iterator a method. A
dataset made from memfit's by ``.map``/``.take`` is a new object without the swap: its
error is memfit's all the same, with TensorFlow's frames above it.

Example:
    >>> e = corrupt_shard_error("assertion failed: [memfit: shard /d/a.tfrecord is corrupt "
    ...                         "or truncated: record 3 of 9 cannot be read (bad CRC32C).]")
    >>> e.file, e.record
    ('/d/a.tfrecord', 3)
"""

from __future__ import annotations

import functools
import os
import re
import threading
from typing import TYPE_CHECKING, Any

from memfit.errors import CorruptShardError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["install", "installed", "short_iteration", "corrupt_shard_error",
           "assert_clean", "what_to_do", "promise"]

MARKER = "memfit: "
# memfit's message in TensorFlow's text: what tf.debugging.Assert prints of one string
# ("assertion failed: [MESSAGE]", C-escaped), or the text of a Python exception raised in
# a numpy_function ("ShardReadError: MESSAGE").
_ASSERTED = re.compile(r"assertion failed: \[(memfit: (?:shard|array file|TFRecord file) "
                       r"[^\n]*)\]")
_RAISED = re.compile(r"(?:ShardReadError|CorruptShardError): (memfit: (?:shard|array file|"
                     r"TFRecord file) "
                     r"[^\n]*)")
_FILE = re.compile(r"^memfit: (?:shard|array file|TFRecord file) (.+?) (?:is|was) ")
_RECORD = re.compile(r": (?:record|sample) (\d+)[ ,.)]")
# tf.data's assert_cardinality, when the input ends before the count it was given.
_ENDED_EARLY = re.compile(r"Input dataset was expected to contain (\d+) elements but "
                          r"contained (only|at least) (\d+) elements")
# The batches each memfit dataset of this process promised (its manifest's counts), and
# the directory it reads: a dataset that ends early is the pack's fault, said as such.
_PROMISED: dict[int, str] = {}
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)")
_SIMPLE = {b"n": b"\n", b"t": b"\t", b"r": b"\r"}


def what_to_do(directory: str | os.PathLike) -> str:
    """The advice that ends memfit's message about a damaged shard of ``directory``.

    Example:
        >>> what_to_do("data/train")[:29]
        'Run `memfit verify data/train'
    """
    return (f"Run `memfit verify {directory}`, then repack or restore the file; or pass "
            f"on_corrupt='skip' to train without the damaged records.")


def _unescape(text: str) -> str:
    """Undoes the C escaping tf.debugging.Assert applies to a string (``\\'``, ``\\303``)."""
    def one(m: re.Match) -> bytes:
        code = m[1]
        if code[:1] == b"x":
            return bytes([int(code[1:], 16)])
        if code[:1].isdigit():
            return bytes([int(code, 8) & 0xFF])
        return _SIMPLE.get(code, code)
    raw = text.encode("utf-8", "surrogateescape")
    return _ESCAPE.sub(one, raw).decode("utf-8", "replace")


def corrupt_shard_error(text: str) -> CorruptShardError | None:
    """memfit's error for a TensorFlow error text that carries memfit's message about a
    damaged shard (``None`` for any other text).

    Example:
        >>> corrupt_shard_error("Graph execution error: shape mismatch") is None
        True
    """
    found = _ASSERTED.search(text)
    if found is not None:
        message = _unescape(found[1])
    else:
        found = _RAISED.search(text)
        if found is None:
            return None
        message = found[1].strip()
    file = _FILE.search(message)
    record = _RECORD.search(message)
    return CorruptShardError(message, file[1] if file else "?",
                             int(record[1]) if record else None)


def assert_clean(error: tf.Tensor) -> tf.Operation:
    """An op that fails, with ``error`` (memfit's one-line message) as its whole text, when
    ``error`` is not empty: what :func:`corrupt_shard_error` reads back.

    An assertion, not an exception raised in a ``numpy_function``: TensorFlow copies a
    Python exception's traceback into its error and logs the error twice (30 lines at
    the default log level), but an assertion's text is only its data, logged once.
    """
    import tensorflow as tf

    return tf.debugging.Assert(tf.equal(error, ""), [error], summarize=1)


_CLASSES: dict[type, type] = {}


def _memfit_class(base: type) -> type:
    """``base`` (a TensorFlow error class) that is a :class:`CorruptShardError` too, and
    that prints as one: ``memfit.errors.CorruptShardError: memfit: shard ...``."""
    cls = _CLASSES.get(base)
    if cls is None:
        def __str__(self: Any) -> str:
            return str(self.args[0])

        def __reduce__(self: Any) -> Any:      # a plain CorruptShardError across processes
            return CorruptShardError, (str(self.args[0]), self.file, self.record)

        cls = type("CorruptShardError", (CorruptShardError, base), {
            "__module__": CorruptShardError.__module__,
            "__qualname__": CorruptShardError.__qualname__,
            "__doc__": (f"{CorruptShardError.__doc__} Raised through TensorFlow: also a "
                        f"{base.__name__}, whose ``.message`` is TensorFlow's text."),
            "__str__": __str__, "__reduce__": __reduce__})
        _CLASSES[base] = cls
    return cls


def promise(batches: int, directory: str | os.PathLike) -> None:
    """Records that a dataset reading ``directory`` asserts ``batches`` batches (its
    manifest's counts), so that tf.data's error when it ends early says what is wrong with
    the pack (:func:`ended_early`) instead of "expected to contain N elements".

    Example:
        >>> promise(18, "data/train")
        >>> ended_early("Input dataset was expected to contain 18 elements but contained "
        ...             "only 16 elements.").file
        'data/train'
    """
    _PROMISED[int(batches)] = str(directory)


def ended_early(text: str) -> CorruptShardError | None:
    """memfit's error for tf.data's "expected to contain N elements but contained only M"
    (or "at least M") where a memfit dataset of this process promised N batches; ``None``
    otherwise."""
    found = _ENDED_EARLY.search(text)
    directory = _PROMISED.get(int(found[1])) if found else None
    if found is None or directory is None:
        return None
    gave, fewer = (f"{int(found[3]):,}", True) if found[2] == "only" else (
        f"more than {int(found[1]):,}", False)
    return CorruptShardError(
        f"memfit: the pack {directory} gave {gave} batches where its manifest promises "
        f"{int(found[1]):,}: its shards hold {'fewer' if fewer else 'more'} samples than the "
        f"manifest says (the manifest was edited, or a shard replaced). Run `memfit verify "
        f"{directory}`, then pack again.", directory, None)


def _translated(e: BaseException) -> BaseException:
    """``e`` made memfit's error when its text carries memfit's message, else ``e``."""
    text = getattr(e, "message", None)
    if not isinstance(text, str) or isinstance(e, CorruptShardError):
        return e
    found = corrupt_shard_error(text) if MARKER in text else ended_early(text)
    if found is None:
        return e
    try:
        e.__class__ = _memfit_class(type(e))
    except TypeError:                       # not a class memfit can extend: leave it be
        return e
    e.args = found.args
    e.file, e.record = found.file, found.record  # type: ignore[attr-defined]
    return e


_lock = threading.Lock()


def install() -> bool:
    """Makes TensorFlow's errors for a damaged shard memfit's (see the module docstring);
    idempotent. Returns whether the hook is in place."""
    with _lock:
        if installed():
            return True
        try:
            import tensorflow as tf
        except ImportError:
            return False
        op_error = tf.errors.OpError
        original = op_error.__init__

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            _translated(self)

        __init__.memfit_hook = True  # type: ignore[attr-defined]
        op_error.__init__ = __init__
        return True


def installed() -> bool:
    """Whether :func:`install`'s hook is in place."""
    import sys

    tf = sys.modules.get("tensorflow")
    return tf is not None and getattr(tf.errors.OpError.__init__, "memfit_hook", False)


_SHORT: dict[type, type] = {}


def _short(cls: type, names: tuple[str, ...]) -> type:
    """``cls`` whose methods ``names`` re-raise memfit's error from their own frame; its
    ``__iter__`` (when named) returns such an iterator."""
    sub = _SHORT.get(cls)
    if sub is not None:
        return sub

    def reraising(name: str) -> Any:
        base = getattr(cls, name)

        @functools.wraps(base)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return base(self, *args, **kwargs)
            except CorruptShardError as e:      # TensorFlow's frames left out below here
                raise e.with_traceback(None) from None
        return method

    body = {name: reraising(name) for name in names if name != "__iter__"}
    if "__iter__" in names:
        iterate = cls.__iter__

        def __iter__(self: Any) -> Any:
            it = iterate(self)
            try:
                it.__class__ = _short(type(it), ("__next__", "get_next"))
            except TypeError:                   # not a class memfit can extend: leave it
                pass
            return it
        body["__iter__"] = __iter__
    sub = type(cls.__name__, (cls,), {**body, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__})
    _SHORT[cls] = sub
    return sub


def short_iteration(ds: tf.data.Dataset) -> None:
    """Iterating ``ds`` in Python raises memfit's error with only the caller's frames and
    one of memfit's above it (see the module docstring)."""
    try:
        ds.__class__ = _short(type(ds), ("__iter__",))
    except TypeError:
        pass

"""Loading MODEL for the estimator: a ``.keras`` file, ``module:function``, or a live model.

Everything the estimator, the measuring child and the batch-size search need to agree on
lives here: how a model is loaded, under which dtype policy it is built, what its input
and target tensors look like, and which loss and optimizer it is compiled with. The
estimating process and the child process call the same functions, so they train the
same thing.

Example:
    >>> spec = ModelSpec("keras.applications:MobileNetV2",
    ...                  input_shape=[(96, 96, 3)])                   # doctest: +SKIP
    >>> model = load(spec, "mixed_float16")                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from memfit import checks
from memfit.errors import MemfitError, cause

__all__ = ["ModelSpec", "EstimateError", "load", "check_source", "parse_input_shape",
           "check_policy", "check_batch_size", "input_errors", "input_specs", "target_specs",
           "policy_scope", "structure_of", "input_structure", "packed"]

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
POLICIES = ("float32", "float16", "bfloat16", "float64", "mixed_float16", "mixed_bfloat16")


class EstimateError(MemfitError, ValueError):
    """A model, shape, batch size, optimizer or policy the estimator cannot use as given."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to get the model: what the user typed, and the input shapes they gave.

    Attributes:
        source: a ``.keras`` path, or ``module:function`` (``path/to/file.py:function``
            works too); the function is called without arguments and returns a model.
        input_shape: one shape per model input, without the batch dimension (e.g.
            ``[(224, 224, 3)]``); only needed when the model does not know it.
    """

    source: str
    input_shape: tuple[tuple[int, ...], ...] | None = None

    def to_json(self) -> dict:
        return {"source": self.source,
                "input_shape": None if self.input_shape is None else
                [list(s) for s in self.input_shape]}

    @classmethod
    def from_json(cls, data: dict) -> ModelSpec:
        shapes = data.get("input_shape")
        return cls(data["source"], None if shapes is None else
                   tuple(tuple(int(d) for d in s) for s in shapes))


def parse_input_shape(value: str | Sequence[int] | Sequence[Sequence[int]] | None
                      ) -> tuple[tuple[int, ...], ...] | None:
    """Parses ``"224,224,3"`` (or ``"224x224x3"``; several inputs: ``"32,32,3;10"``).

    Example:
        >>> parse_input_shape("96,96,3")
        ((96, 96, 3),)
        >>> parse_input_shape([(28, 28), (10,)])
        ((28, 28), (10,))

    Args:
        value: a string, one shape (a sequence of ints), several shapes, or ``None``.

    Raises:
        EstimateError: quoting the value when it is not a shape of positive integers.
    """
    if value is None:
        return None
    bad = EstimateError(f"input_shape must be the shape of one sample without the batch "
                        f"dimension, such as '224,224,3' (several inputs: '32,32,3;10'). "
                        f"Received: input_shape={value!r}")
    try:
        if isinstance(value, str):
            parts = [p for p in value.replace(" ", "").split(";") if p]
            shapes = [tuple(int(d) for d in p.replace("x", ",").strip("()[]").split(",") if d)
                      for p in parts]
        elif value and all(isinstance(d, int) for d in value):
            shapes = [tuple(int(d) for d in value)]           # type: ignore[arg-type]
        else:
            shapes = [tuple(int(d) for d in s) for s in value]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise bad from None
    if not shapes or any(not s or any(d <= 0 for d in s) for s in shapes):
        raise bad
    return tuple(shapes)


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """Raises the ``ValueError`` of an argument check in the block (:mod:`memfit.checks`)
    as an :class:`EstimateError`, with the same message.

    Example:
        >>> from memfit import checks
        >>> with input_errors():
        ...     checks.count("max_trials", 0)                # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memfit.estimate.model.EstimateError: max_trials must be ... Received: max_trials=0
    """
    try:
        yield
    except EstimateError:
        raise
    except ValueError as e:
        raise EstimateError(str(e)) from None


def check_batch_size(batch_size: Any, name: str = "batch_size") -> int:
    """Returns ``batch_size`` as an int, or raises a clear error for anything not ≥ 1.

    Example:
        >>> check_batch_size(32)
        32

    Raises:
        EstimateError: quoting the value.
    """
    with input_errors():
        return checks.count(name, batch_size, example=32)


def check_policy(policy: str | None) -> str | None:
    """Validates a Keras dtype policy name (``None``: the model's own).

    Raises:
        EstimateError: for an unknown name, listing the known ones.
    """
    if policy is None:
        return None
    if not isinstance(policy, str) or policy not in POLICIES:
        raise EstimateError(f"Unknown dtype policy: use one of {', '.join(POLICIES)}. "
                            f"Received: dtype_policy={policy!r}")
    return policy


@contextlib.contextmanager
def policy_scope(policy: str | None) -> Iterator[None]:
    """Sets Keras's global dtype policy for the block (nothing when ``policy`` is None)."""
    if policy is None:
        yield
        return
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def check_source(source: str | os.PathLike) -> None:
    """Fails fast on a model source that cannot be found, before Keras (and TensorFlow)
    is imported: a missing ``.keras`` or ``.py`` file, a ``module:function`` whose module
    is not on the path, or a text that is neither.

    Example:
        >>> check_source("no_such_module_here:make")         # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memfit.estimate.model.EstimateError: Cannot import 'no_such_module_here' for ...

    Raises:
        EstimateError: naming the source and what is missing.
    """
    text = os.fspath(source)
    if text.endswith(".py") and ":" not in text:
        # Keras's own answer, of a file it cannot load, was about TFSMLayer (a stranger)
        functions = _model_functions(text)
        raise EstimateError(f"{text!r} is a Python file: give the function in it that builds "
                            f"the model, as {text}:FUNCTION"
                            + (f" (it defines {', '.join(functions)})" if functions else "")
                            + f". Received: model={text!r}")
    if text.endswith(KERAS_SUFFIXES) or (Path(text).is_file() and ":" not in text):
        if not Path(text).exists():
            raise EstimateError(f"No model file at {text!r}: give a .keras file or "
                                f"module:function. Received: model={text!r}")
        return
    module_name, _, attr = text.rpartition(":")
    if not module_name or not attr:
        raise EstimateError(f"MODEL must be a .keras file or module:function. "
                            f"Received: model={text!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        if not Path(module_name).exists():
            raise EstimateError(
                f"No Python file {module_name!r} for model={text!r} (looked for it from "
                f"{os.getcwd()!r}): give the path of a file that exists, as "
                f"path/to/file.py:function.")
        return
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # Only the top-level package is looked for: finding ``keras.applications`` would
    # import Keras (and TensorFlow, with its start-up lines) here; the loader names a
    # missing submodule once the package is imported.
    top = module_name.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
        why = f"No module named {top!r}"
    except (ImportError, ValueError) as e:
        found, why = False, str(e)
    if not found:
        raise EstimateError(f"Cannot import {module_name!r} for model={text!r}: "
                            f"ModuleNotFoundError: {why}")


def _model_functions(path: str) -> list[str]:
    """The top-level functions a Python file defines (read, not run), at most five."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
             and not n.name.startswith("_")]
    return names[:5] + (["..."] if len(names) > 5 else [])


def _load_file(path: Path) -> Any:
    import keras

    check_source(path)
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as e:          # noqa: BLE001 - any failure means "not a Keras model"
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if path.suffix == ".keras" and not zipfile.is_zipfile(path):
            # Keras says "File not found" of a file that is there but is not a zip archive
            raise EstimateError(f"{str(path)!r} is not a .keras file: a .keras file is a zip "
                                f"archive, this one is not. Give a file saved with "
                                f"model.save('model.keras'), or module:function returning a "
                                f"model.") from None
        if zipfile.is_zipfile(path):
            raise EstimateError(f"Keras could not rebuild the model saved in {str(path)!r} "
                                f"({why.rstrip('.')}). A model with a custom layer or object "
                                f"loads only where that class is registered "
                                f"(@keras.saving.register_keras_serializable()) and imported; "
                                f"give module:function returning the model instead "
                                f"(memfit estimate mymodels:build_model).") from None
        raise EstimateError(f"{str(path)!r} is not a Keras model file that Keras can load "
                            f"({why}). Give a file saved with model.save('model.keras'), or "
                            f"module:function returning a model.") from None


def _import_function(source: str) -> Any:
    check_source(source)
    module_name, _, attr = source.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name)
            spec = importlib.util.spec_from_file_location(f"_memfit_model_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as e:          # noqa: BLE001
        where = f"fix the error in {module_name!r}" if module_name.endswith(".py") \
            else f"fix the error in the module {module_name!r} (or what it imports)"
        raise EstimateError(f"Cannot import {module_name!r} for model={source!r}: "
                            f"{cause(e)}. Importing it failed: {where}, then run the "
                            f"command again.") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise EstimateError(f"{module_name!r} has no attribute {attr!r} "
                            f"(model={source!r}).") from None


def _call_factory(factory: Any, source: str, input_shape: Any) -> Any:
    kwargs = {}
    if input_shape is not None and getattr(factory, "__module__", "").startswith(
            "keras.src.applications"):
        kwargs = {"weights": None, "input_shape": input_shape[0]}
    elif getattr(factory, "__module__", "").startswith("keras.src.applications"):
        kwargs = {"weights": None}
    try:
        return factory(**kwargs)
    except Exception as e:          # noqa: BLE001 - the user's code: report, don't crash
        raise EstimateError(f"The model factory {source!r} raised {cause(e)}. "
                            f"Fix the function so that it returns a keras.Model.") from None


def is_model_file(source: str | ModelSpec | Any) -> bool:
    """Whether :func:`load` reads ``source`` from a saved model file (``.keras``...),
    rather than calling a ``module:function`` or taking a live model."""
    if isinstance(source, ModelSpec):
        source = source.source
    if not isinstance(source, str | os.PathLike):
        return False
    text = os.fspath(source)
    return text.endswith(KERAS_SUFFIXES) or (Path(text).is_file() and ":" not in text)


def load(source: str | ModelSpec | Any, dtype_policy: str | None = None, *,
         input_shape: Any = None) -> Any:
    """Loads or builds the model under ``dtype_policy`` (``None``: as saved/defined).

    A live ``keras.Model`` is used as it is, unless a policy is given: it is then cloned
    layer by layer under that policy (new, untrained weights: only memory matters here).

    Example:
        >>> model = load("mymodels:make_cnn", "mixed_float16")         # doctest: +SKIP

    Args:
        source: a ``.keras`` path, ``module:function``, a :class:`ModelSpec`, or a model.
        dtype_policy: a Keras dtype policy name, e.g. ``"mixed_float16"``.
        input_shape: shapes of the inputs without the batch dimension, used to build a
            model that does not know them (see :func:`parse_input_shape`).

    Raises:
        EstimateError: for a missing or non-Keras file, a factory that raises or returns
            something else, or an unknown policy; each quotes the value.
    """
    import keras

    dtype_policy = check_policy(dtype_policy)
    if isinstance(source, ModelSpec):
        input_shape = source.input_shape if input_shape is None else input_shape
        source = source.source
    input_shape = parse_input_shape(input_shape)
    if isinstance(source, keras.Model):
        model = source
        if dtype_policy is not None and not _under(model, dtype_policy):
            model = _clone_under(model, dtype_policy)
        return model
    if not isinstance(source, str | os.PathLike):
        raise EstimateError(f"model must be a keras.Model, a .keras file or module:function. "
                            f"Received: model={source!r} of type {type(source).__name__}")
    text = os.fspath(source)
    with policy_scope(dtype_policy):
        if is_model_file(text):
            model = _load_file(Path(text))
            if dtype_policy is not None and not _under(model, dtype_policy):
                model = _clone_under(model, dtype_policy)
        else:
            model = _call_factory(_import_function(text), text, input_shape)
    if not isinstance(model, keras.Model):
        raise EstimateError(f"{text!r} returned {type(model).__name__}, not a keras.Model. "
                            f"Return the model from the function.")
    return model


def _under(model: Any, policy: str) -> bool:
    """Whether ``model`` already runs under ``policy``: its own policy is ``policy`` and so
    is some layer's (the others may keep theirs, as a ``float32`` output layer of a
    mixed-precision model does). A model loaded from a file under a policy takes the
    policy while every layer keeps the dtype it was saved with: not under it (a
    stranger's ``.keras`` file estimated as ``float32`` under ``--dtype-policy
    mixed_float16``)."""
    def name(layer: Any) -> str:
        return getattr(getattr(layer, "dtype_policy", None), "name", "float32")

    if name(model) != policy:
        return False
    stack, layers = list(getattr(model, "layers", [])), 0
    while stack:
        layer = stack.pop()
        nested = list(getattr(layer, "layers", []))
        if not nested:
            layers += 1
            if name(layer) == policy:
                return True
        stack.extend(nested)
    return layers == 0


def _clone_under(model: Any, policy: str) -> Any:
    import keras

    def clone(layer: Any) -> Any:
        config = layer.get_config()
        config["dtype"] = policy
        return layer.__class__.from_config(config)

    with policy_scope(policy):
        try:
            return keras.models.clone_model(model, clone_function=clone)
        except Exception as e:      # noqa: BLE001
            raise EstimateError(f"Cannot rebuild the model under dtype_policy={policy!r} "
                                f"({cause(e)}). Build it under the policy "
                                f"yourself (keras.config.set_dtype_policy) and pass "
                                f"dtype_policy=None.") from None


def input_specs(model: Any, input_shape: Any = None) -> list[tuple[tuple[int, ...], str]]:
    """The model's inputs as ``(shape without batch, dtype)`` pairs, building it if needed.

    Raises:
        EstimateError: when neither the model nor ``input_shape`` gives the shapes; the
            message says how to give one (``--input-shape 224,224,3``).
    """
    import keras

    shapes = parse_input_shape(input_shape)
    inputs = None
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    if inputs and all(None not in tuple(t.shape)[1:] for t in inputs):
        known = [(tuple(int(d) for d in t.shape[1:]), keras.backend.standardize_dtype(t.dtype))
                 for t in inputs]
        if shapes is not None and [s for s, _ in known] != list(shapes):
            raise EstimateError(f"input_shape={_fmt(shapes)} does not match the model's "
                                f"inputs {_fmt(tuple(s for s, _ in known))}; leave it out.")
        return known
    if shapes is None:
        build = getattr(model, "_build_shapes_dict", None) or {}
        values = [tuple(v) for v in build.values() if isinstance(v, tuple | list)]
        if values and all(len(v) > 1 and None not in v[1:] for v in values):
            shapes = tuple(tuple(int(d) for d in v[1:]) for v in values)
    if shapes is None:
        raise EstimateError(
            f"The model {getattr(model, 'name', '?')!r} has no known input shape (it was not "
            f"built on an Input). Give the shape of one sample without the batch dimension: "
            f"--input-shape 224,224,3 on the command line, input_shape=(224, 224, 3) in "
            f"Python.")
    dtype = "int32" if _first_layer_is_embedding(model) else "float32"
    if inputs:
        dtypes = [keras.backend.standardize_dtype(t.dtype) for t in inputs]
        if len(dtypes) == len(shapes):
            return list(zip(shapes, dtypes, strict=True))
    return [(s, dtype) for s in shapes]


def _first_layer_is_embedding(model: Any) -> bool:
    import keras

    layers = getattr(model, "layers", None) or []
    return bool(layers) and isinstance(layers[0], keras.layers.Embedding)


def _fmt(shapes: Any) -> str:
    return ";".join(",".join(str(d) for d in s) for s in shapes)


def structure_of(value: Any) -> Any:
    """``value`` where its structure must be kept to call the model or its loss -- a
    dict (a Functional model built on a dict of inputs, or one with a dict of outputs) or
    containers inside a container -- else ``None``: one tensor or a flat list, which
    memfit passes as they are.

    Example:
        >>> structure_of({"image": 1, "table": 2}), structure_of([1, 2]), structure_of(1)
        ({'image': 1, 'table': 2}, None, None)

    Args:
        value: a model's ``input`` (or the outputs of calling it), or anything.
    """
    if isinstance(value, dict):
        return value
    if isinstance(value, list | tuple) and any(isinstance(v, list | tuple | dict)
                                                for v in value):
        return value
    return None


def input_structure(model: Any) -> Any:
    """The structure of the model's inputs where it must be kept (:func:`structure_of`
    of a Functional model's ``input``), else ``None``."""
    try:
        return structure_of(model.input)
    except Exception:        # noqa: BLE001 -- a model never called has no ``input``
        return None


def packed(structure: Any, flat: list) -> Any:
    """``flat`` (tensors in the order of ``keras.tree.flatten``, as ``model.inputs`` lists
    them) as the model takes them: in ``structure`` (:func:`structure_of`), else one
    tensor alone or the list.

    Example:
        >>> packed({"table": None, "image": None}, ["i", "t"])
        {'table': 't', 'image': 'i'}
        >>> packed(None, ["x"]), packed(None, ["a", "b"])
        ('x', ['a', 'b'])

    Args:
        structure: what :func:`structure_of` returned, or ``None``.
        flat: the tensors.
    """
    if structure is None:
        return flat[0] if len(flat) == 1 else list(flat)
    import keras

    return keras.tree.pack_sequence_as(structure, list(flat))


def _symbolic_inputs(specs: list[tuple[tuple[int, ...], str]], batch: int | None,
                     structure: Any = None) -> Any:
    import keras

    return packed(structure, [keras.KerasTensor((batch, *s), dtype=d) for s, d in specs])


def ensure_built(model: Any, specs: list[tuple[tuple[int, ...], str]]) -> Any:
    """Builds the model (its variables) from the input specs; returns symbolic outputs.

    Raises:
        EstimateError: when the model cannot be called on inputs of these shapes.
    """
    import keras

    x = _symbolic_inputs(specs, None, input_structure(model))
    try:
        return keras.src.backend.compute_output_spec(model, x)
    except Exception as e:          # noqa: BLE001
        raise EstimateError(f"The model cannot be called on inputs of shape "
                            f"{_fmt([s for s, _ in specs])} ({cause(e)}). "
                            f"Check --input-shape.") from None


def target_specs(outputs: Any) -> list[tuple[tuple[int, ...], str]]:
    """Targets shaped like the model outputs (float32), for an MSE loss per output."""
    import keras

    flat = keras.tree.flatten(outputs)
    return [(tuple(int(d) if d is not None else 1 for d in t.shape[1:]), "float32")
            for t in flat]

"""Tiny models for the estimator's tests, loaded by module:function (also in children)."""

import keras


def tiny() -> keras.Model:
    """Input 8 -> Dense(4, relu) -> Dense(2): 46 parameters."""
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(2)], name="tiny")


def tiny_functional() -> keras.Model:
    x = keras.Input((8,))
    h = keras.layers.Dense(4, activation="relu")(x)
    return keras.Model(x, keras.layers.Dense(2)(h), name="tiny_functional")


class TinySubclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="tiny_subclassed")
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x: object) -> object:
        return self.out(self.hidden(x))


def tiny_subclassed() -> keras.Model:
    return TinySubclassed()


def nested() -> keras.Model:
    inner = keras.Sequential([keras.layers.Dense(4, activation="relu")], name="inner")
    x = keras.Input((8,))
    return keras.Model(x, keras.layers.Dense(2)(inner(x)), name="outer")


def no_input_shape() -> keras.Model:
    return keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])


def raises() -> keras.Model:
    raise RuntimeError("the factory is broken on purpose")


def not_a_model() -> str:
    return "a string"


def wide() -> keras.Model:
    """Memory grows fast with the batch: 2048 -> 2048 -> 2048 -> 10 (about 8.4M params)."""
    return keras.Sequential([keras.Input((2048,)), keras.layers.Dense(2048, activation="relu"),
                             keras.layers.Dense(2048, activation="relu"),
                             keras.layers.Dense(10)], name="wide")


def cnn() -> keras.Model:
    """Three pairs of 3x3 convolutions with max pooling (a small VGG), 32x32x3 inputs."""
    layers = [keras.Input((32, 32, 3))]
    for width in (32, 64, 128):
        layers += [keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
                   keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
                   keras.layers.MaxPooling2D(2)]
    layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"),
               keras.layers.Dense(10)]
    return keras.Sequential(layers, name="cnn")


def named() -> keras.Model:
    """Named inputs and outputs (dicts), as Keras's guides build multi-input models:
    ``model({"table": ..., "image": ...})`` -> ``{"price": ..., "kind": ...}``."""
    table, image = keras.Input((8,), name="table"), keras.Input((6, 6, 2), name="image")
    h = keras.layers.Concatenate()([
        keras.layers.Dense(4, activation="relu")(table),
        keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(3, 3)(image))])
    return keras.Model({"table": table, "image": image},
                       {"price": keras.layers.Dense(1, name="price")(h),
                        "kind": keras.layers.Dense(5, name="kind")(h)}, name="named")


class CallFails(keras.Model):
    """A model whose call fails with a message as Keras writes them: several lines, a
    part in bold."""

    def call(self, x: object) -> object:
        raise ValueError("Exception encountered when calling CallFails.call().\n\n"
                         "\x1b[1mThe input is not what this model takes.\x1b[0m\n\n"
                         "Arguments received:\n  • x=tensor")


def call_fails() -> keras.Model:
    return CallFails(name="call_fails")

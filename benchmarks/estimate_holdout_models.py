"""Models outside the family panel: the held-out set for the batch-size answer (issue 27).

No constant, band or heuristic of the estimator was chosen with these models: they were
written down before any of issue 27's changes were tried, and ``estimate_vs_search.py
--holdout`` judges the estimator on them only after a change is made on the family panel
(``estimate_family_models.py``). Each is a common architecture the panel has no model of,
or the exact model an issue reported.

:data:`HOLDOUT` maps each model to ``(B0, input shape)``: the batch size the search's
budget is measured at (the true answer is then near B0), and the input shape for a model
that does not know it. A measuring child imports them as
``benchmarks/estimate_holdout_models.py:NAME``.

Example:
    >>> sorted(HOLDOUT)[:2]                                         # doctest: +SKIP
    ['conv1d_lstm', 'conv_lstm_video']
"""

from __future__ import annotations

import keras

L = keras.layers


def wide_mlp_issue() -> keras.Model:
    """Issue 27's wide MLP, 4096 -> 8192 -> 4096, that trains at 256 where the estimate
    said nothing fits (about 67M parameters)."""
    return keras.Sequential([keras.Input((4096,)), L.Dense(8192, activation="relu"),
                             L.Dense(4096, activation="relu"), L.Dense(10)],
                            name="wide_mlp_issue")


def densenet121_small() -> keras.Model:
    """Dense connectivity: every block's input is the concatenation of all before it."""
    return keras.applications.DenseNet121(weights=None, input_shape=(64, 64, 3), classes=10)


def efficientnet_v2_b0() -> keras.Model:
    """Fused MBConv blocks and squeeze-and-excitation."""
    return keras.applications.EfficientNetV2B0(weights=None, input_shape=(64, 64, 3),
                                               classes=10, include_preprocessing=False)


def conv_lstm_video() -> keras.Model:
    """A convolutional LSTM over short clips (8 frames of 32 x 32 x 3)."""
    return keras.Sequential([
        keras.Input((8, 32, 32, 3)), L.ConvLSTM2D(16, 3, padding="same",
                                                 return_sequences=True),
        L.BatchNormalization(), L.ConvLSTM2D(16, 3, padding="same"),
        L.GlobalAveragePooling2D(), L.Dense(10)], name="conv_lstm_video")


def lstm_seq2seq() -> keras.Model:
    """An encoder-decoder LSTM with embeddings and a per-step softmax (teacher forcing)."""
    src = keras.Input((40,), dtype="int32")
    tgt = keras.Input((40,), dtype="int32")
    _, h, c = L.LSTM(256, return_state=True)(L.Embedding(5000, 128)(src))
    y = L.LSTM(256, return_sequences=True)(L.Embedding(5000, 128)(tgt),
                                           initial_state=[h, c])
    return keras.Model([src, tgt], L.Dense(5000)(y), name="lstm_seq2seq")


def dcgan_generator() -> keras.Model:
    """Transposed convolutions from a latent vector up to 64 x 64 x 3, trained on MSE."""
    return keras.Sequential([
        keras.Input((128,)), L.Dense(8 * 8 * 256), L.Reshape((8, 8, 256)),
        L.BatchNormalization(), L.LeakyReLU(),
        L.Conv2DTranspose(128, 4, strides=2, padding="same"), L.BatchNormalization(),
        L.LeakyReLU(), L.Conv2DTranspose(64, 4, strides=2, padding="same"),
        L.BatchNormalization(), L.LeakyReLU(),
        L.Conv2DTranspose(3, 4, strides=2, padding="same", activation="tanh")],
        name="dcgan_generator")


def multi_output() -> keras.Model:
    """One trunk, two heads (a class and a box), two losses summed."""
    x = inputs = keras.Input((64, 64, 3))
    for width in (32, 64, 128):
        x = L.MaxPooling2D(2)(L.Conv2D(width, 3, padding="same", activation="relu")(x))
    x = L.Dense(256, activation="relu")(L.Flatten()(x))
    return keras.Model(inputs, [L.Dense(10, name="cls")(x), L.Dense(4, name="box")(x)],
                       name="multi_output")


def conv1d_lstm() -> keras.Model:
    """A time-series hybrid: strided 1-D convolutions, then an LSTM, on 512 x 8 inputs."""
    return keras.Sequential([
        keras.Input((512, 8)), L.Conv1D(64, 7, strides=2, padding="same", activation="relu"),
        L.Conv1D(64, 5, strides=2, padding="same", activation="relu"), L.LSTM(128),
        L.Dense(1)], name="conv1d_lstm")


#: model -> (B0, input shape or None).
HOLDOUT: dict[str, tuple[int, tuple[int, ...] | None]] = {
    "wide_mlp_issue": (256, None),
    "densenet121_small": (16, None),
    "efficientnet_v2_b0": (32, None),
    "conv_lstm_video": (16, None),
    "lstm_seq2seq": (64, None),
    "dcgan_generator": (64, None),
    "multi_output": (64, None),
    "conv1d_lstm": (64, None),
}

"""A .keras file Keras cannot load: the error says why, not "File not found" of a file
that is there, nor "save it with model.save" of a file that was."""

import keras
import pytest

from memfit.estimate import EstimateError
from memfit.estimate.model import load


class _Doubles(keras.layers.Layer):           # a custom layer nobody registered
    def call(self, x):
        return x * 2


def test_a_file_that_is_not_a_zip_archive_is_not_called_missing(tmp_path):
    junk = tmp_path / "junk.keras"
    junk.write_text("not a model")
    with pytest.raises(EstimateError) as e:
        load(str(junk))
    assert "a .keras file is a zip archive" in str(e.value)
    assert "File not found" not in str(e.value)


def test_a_custom_layer_that_keras_cannot_rebuild_is_named(tmp_path):
    model = keras.Sequential([keras.Input((4,)), _Doubles(), keras.layers.Dense(1)])
    model.save(tmp_path / "custom.keras")
    with pytest.raises(EstimateError) as e:
        load(str(tmp_path / "custom.keras"))
    message = str(e.value)
    assert "Keras could not rebuild the model saved in" in message
    assert "register_keras_serializable" in message and "module:function" in message

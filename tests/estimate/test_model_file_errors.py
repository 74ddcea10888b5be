"""A .keras file Keras cannot load: the error says why, not "File not found" of a file
that is there, nor "save it with model.save" of a file that was."""

import keras
import pytest

from memfit.estimate import EstimateError
from memfit.estimate.model import check_source, load


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


def test_a_python_file_that_is_not_there_says_where_it_was_looked_for(tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EstimateError) as e:
        check_source("missing.py:build")
    message = str(e.value)
    assert message.startswith("No Python file 'missing.py' for model='missing.py:build'")
    assert repr(str(tmp_path)) in message                  # where it was looked for
    assert "path/to/file.py:function" in message           # and what to give instead

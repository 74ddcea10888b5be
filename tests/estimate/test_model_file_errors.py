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


def test_a_python_file_without_a_function_and_a_file_that_fails_to_import_say_what_to_do(
        tmp_path, monkeypatch):
    """A stranger: `memfit estimate mymodels.py` answered with Keras's words about
    TFSMLayer, and a file failing at import said why but not what to do."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.py").write_text("def mlp():\n    pass\ndef _private():\n    pass\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(EstimateError) as e:
        check_source("mm.py")
    assert str(e.value) == ("'mm.py' is a Python file: give the function in it that builds "
                            "the model, as mm.py:FUNCTION (it defines mlp). Received: "
                            "model='mm.py'")
    with pytest.raises(EstimateError, match=r"RuntimeError: boom at import\. Importing it "
                                            r"failed: fix the error in 'boom.py', then run"):
        load("boom.py:f")

"""The engine's input errors cross process boundaries intact: a Ray worker that raises one must reach
the router as that error (an unpicklable one arrived as Ray's UnserializableException, which the
router took for a dead worker, failing every request on it)."""

import pickle

import pytest

from engine.errors import ContextLengthError, InvalidParameterError


@pytest.mark.parametrize("cls", [InvalidParameterError, ContextLengthError])
def test_input_errors_pickle_with_their_param_and_message(cls):
    err = pickle.loads(pickle.dumps(cls("stop_token_ids", "token id 5000 is outside the vocabulary [0, 4096)")))
    assert type(err) is cls and err.param == "stop_token_ids" and err.message == str(err)
    assert "outside the vocabulary" in err.message

"""The error tree names its classifications by value (it imports no vocabulary): each must
be one of :class:`durable.vocabulary.Classification`'s values."""

from __future__ import annotations

import inspect

from durable import exceptions
from durable.vocabulary import Classification


def test_every_error_class_names_a_classification_of_the_vocabulary():
    classes = [
        cls
        for _, cls in inspect.getmembers(exceptions, inspect.isclass)
        if issubclass(cls, exceptions.DurableError)
    ]
    assert len(classes) > 10
    values = {choice.value for choice in Classification}
    wrong = {
        cls.__name__: cls.classification for cls in classes if cls.classification not in values
    }
    assert wrong == {}, f"classifications that are not Classification values: {wrong}"
    assert exceptions.TransientError.classification == Classification.TRANSIENT
    assert exceptions.AmbiguousOutcomeError.classification == Classification.AMBIGUOUS

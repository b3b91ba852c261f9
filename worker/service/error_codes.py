"""The error code of an exception the engine raised or reported for one job: one mapping by type.

The intake refuses a bad JobSpec before the engine sees it; what it cannot know (a constraint
that parses but does not compile for the vocabulary, found on the compile thread) reaches the
model loop as an exception at ``add_request`` or as an output's ``error_type``, and gets the
code it would have had at the door. Anything else is the worker's own failure: ``internal``.
"""

from __future__ import annotations

from producer.protocol import ErrorCode
from worker.engine.prompt import InvalidRequestError, PromptTooLongError
from worker.engine.sampling_params import InvalidSamplingParams

# Most specific first: a GrammarError is an InvalidSamplingParams is an InvalidRequestError.
_CODES: tuple[tuple[type[Exception], ErrorCode], ...] = (
    (InvalidSamplingParams, ErrorCode.INVALID_REQUEST),
    (PromptTooLongError, ErrorCode.PROMPT_TOO_LONG),
    (InvalidRequestError, ErrorCode.INVALID_PROMPT),
)


def error_code(error_type: type[BaseException] | None) -> ErrorCode:
    """The code a job that failed with ``error_type`` ends with (None: the engine's own)."""
    for base, code in _CODES:
        if error_type is not None and issubclass(error_type, base):
            return code
    return ErrorCode.INTERNAL

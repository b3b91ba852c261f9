"""Requests held out of the scheduler while their structure constraint compiles.

``LLMEngine.add_request`` asks ``hold`` first: a request whose constraint is not compiled yet
waits here (``wait_info``: ``compiling_grammar``), and each step's schedule first adds the ones
whose compile is done. One whose compile failed ends with ``finish_reason`` error, the
backend's message and ``error_type`` ``GrammarError`` (the caller's fault: the job service says
``invalid_request``); an abort ends a held request like a queued one.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future

from worker.engine.engine_request import EngineRequest
from worker.engine.grammar import CompiledGrammar, clean_message
from worker.engine.grammar_compiles import GrammarCompiles
from worker.engine.outputs import RequestOutput
from worker.engine.prompt import InvalidRequestError
from worker.engine.sequence import FinishReason
from worker.engine.wait_reasons import WaitInfo, WaitReason

# An idle engine's wait for a compile per step: short, as a request may arrive meanwhile (a small
# schema compiles in ~5 ms; an idle worker loop stepped 23,298 times in one 1.2 s compile).
_IDLE_WAIT_S = 0.005


class ConstraintGate:
    def __init__(self, compiles: GrammarCompiles) -> None:
        self.compiles = compiles
        # By request id, in arrival order: the request and its constraint's compile.
        self._held: dict[str, tuple[EngineRequest, Future[CompiledGrammar]]] = {}

    @property
    def num_held(self) -> int:
        return len(self._held)

    def hold(self, request: EngineRequest) -> bool:
        """Whether ``request`` must wait for its constraint (it is then held here); False for
        one without a constraint or whose constraint is compiled. ``InvalidRequestError`` for
        a request id held already, or a constraint that failed to compile before."""
        structure = request.params.structure
        if structure is None:
            return False
        if request.request_id in self._held:
            raise InvalidRequestError(f"request {request.request_id!r} is already in the engine")
        future = self.compiles.submit(structure)
        if not future.done():
            self._held[request.request_id] = (request, future)
            return True
        future.result()  # raises the compile's GrammarError, an InvalidRequestError
        return False

    def release(self, add: Callable[[EngineRequest], None], idle: bool) -> list[RequestOutput]:
        """``add`` each held request whose compile is done (``LLMEngine.add_request``); the
        error outputs of those whose compile, or whose ``add``, failed. ``idle``: the engine
        has nothing else to run, so wait a little for a compile rather than return at once
        (a caller stepping an idle engine in a loop would spin, taking a core from it)."""
        if idle and self._held:
            futures.wait([f for _, f in self._held.values()], _IDLE_WAIT_S, futures.FIRST_COMPLETED)
        outputs: list[RequestOutput] = []
        for request_id, (request, future) in list(self._held.items()):
            if not future.done():
                continue
            del self._held[request_id]
            try:
                future.result()
                add(request)
            except Exception as exc:  # the compile's GrammarError, or an admission check
                outputs += _ends(request, FinishReason.ERROR, clean_message(exc), type(exc))
        return outputs

    def abort(self, request_id: str) -> list[RequestOutput] | None:
        """The abort outputs of a held request (one per choice); None if it is not held."""
        held = self._held.pop(request_id, None)
        return None if held is None else _ends(held[0], FinishReason.ABORT, None, None)

    def wait_info(self) -> dict[str, WaitInfo]:
        return {
            request_id: WaitInfo(WaitReason.COMPILING_GRAMMAR, position, preempted=False)
            for position, request_id in enumerate(self._held)
        }


def _ends(
    request: EngineRequest,
    reason: FinishReason,
    error: str | None,
    error_type: type[Exception] | None,
) -> list[RequestOutput]:
    """One finished output per choice of a request that never reached the scheduler;
    ``error_type`` is the failure's class, which the job service maps to an error code."""
    return [
        RequestOutput(
            request_id=request.request_id,
            new_token_ids=(),
            text_delta="",
            finished=True,
            finish_reason=reason,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=len(request.resume[i]) if i < len(request.resume) else 0,
            index=i,
            error=error,
            error_type=error_type,
        )
        for i in range(request.params.n)
    ]

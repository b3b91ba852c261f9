"""A request's per-token bookkeeping outside the scheduler: stop checks and detokenization."""

from __future__ import annotations

from collections.abc import Set

from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.outputs import RequestOutput
from worker.engine.sampler import TokenLogprobs
from worker.engine.sequence import FinishReason, Sequence


class RequestState:
    def __init__(self, seq: Sequence, detokenizer: IncrementalDetokenizer) -> None:
        self.seq = seq
        self.detokenizer = detokenizer

    def append(
        self,
        token_id: int,
        logprobs: TokenLogprobs | None,
        eos_token_ids: Set[int],
        max_model_len: int,
    ) -> tuple[RequestOutput, FinishReason | None]:
        """Add a sampled token, decide whether the request stops, and say what to stream."""
        seq = self.seq
        params = seq.params
        seq.append_token(token_id)
        reason: FinishReason | None = None
        stops = token_id in params.stop_token_ids or (
            token_id in eos_token_ids and not params.ignore_eos
        )
        if stops and seq.num_output_tokens >= params.min_tokens:
            # As in vLLM: the stopping token is kept in token_ids but adds no text.
            reason = FinishReason.STOP
            delta = ""
        else:
            delta = self.detokenizer.add_tokens([token_id])
            if self.detokenizer.stop_string is not None:
                reason = FinishReason.STOP_STRING
            elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
                reason = FinishReason.LENGTH
        if reason is not None:
            delta += self.detokenizer.finish()
        lps = (logprobs,) if logprobs is not None else ()
        return self.output((token_id,), delta, lps, reason), reason

    def output(
        self,
        new_token_ids: tuple[int, ...],
        delta: str,
        logprobs: tuple[TokenLogprobs, ...],
        reason: FinishReason | None = FinishReason.ABORT,
    ) -> RequestOutput:
        return RequestOutput(
            request_id=self.seq.request_id,
            new_token_ids=new_token_ids,
            text_delta=delta,
            finished=reason is not None,
            finish_reason=reason.value if reason is not None else None,
            num_prompt_tokens=self.seq.num_prompt_tokens,
            num_output_tokens=self.seq.num_output_tokens,
            logprobs=logprobs,
            index=self.seq.index,
            num_cached_tokens=self.seq.num_cached_tokens,
        )

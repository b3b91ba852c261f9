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

    def resume(
        self, token_ids: tuple[int, ...], eos_token_ids: Set[int], max_model_len: int
    ) -> FinishReason | None:
        """Take output tokens a previous run already produced (and streamed), one at a time as
        that run did, so the text already streamed is accounted for exactly; return the finish
        reason if they already ended the choice (the run died before saying so)."""
        seq, params = self.seq, self.seq.params
        for token_id in token_ids:
            seq.append_token(token_id)
            if self.detokenizer.stop_string is None:
                self.detokenizer.add_tokens([token_id])
        last = token_ids[-1]
        stops = last in params.stop_token_ids or (last in eos_token_ids and not params.ignore_eos)
        if stops and seq.num_output_tokens >= params.min_tokens:
            return FinishReason.STOP
        if self.detokenizer.stop_string is not None:
            return FinishReason.STOP_STRING
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None

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
            finish_reason=reason,
            num_prompt_tokens=self.seq.num_prompt_tokens,
            num_output_tokens=self.seq.num_output_tokens,
            logprobs=logprobs,
            index=self.seq.index,
            num_cached_tokens=self.seq.num_cached_tokens,
        )

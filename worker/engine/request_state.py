"""A request's per-token bookkeeping outside the scheduler: stop checks and detokenization."""

from __future__ import annotations

from collections.abc import Set

from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.outputs import RequestOutput
from worker.engine.sampler import SamplingRequest, TokenLogprobs
from worker.engine.sequence import FinishReason, Sequence


class RequestState:
    def __init__(self, seq: Sequence, detokenizer: IncrementalDetokenizer) -> None:
        self.seq = seq
        self.detokenizer = detokenizer

    def sampling_request(self) -> SamplingRequest:
        """What the sampler needs of this choice for its next token."""
        return SamplingRequest(self.seq.params, self.seq.num_output_tokens, self.seq)

    def append(
        self,
        token_id: int,
        logprobs: TokenLogprobs | None,
        eos_token_ids: Set[int],
        max_model_len: int,
    ) -> tuple[RequestOutput, FinishReason | None]:
        """Add a sampled token, decide whether the request stops, and say what to stream."""
        self.seq.append_token(token_id)
        return self.emit(token_id, logprobs, eos_token_ids, max_model_len)

    def emit(
        self,
        token_id: int,
        logprobs: TokenLogprobs | None,
        eos_token_ids: Set[int],
        max_model_len: int,
    ) -> tuple[RequestOutput, FinishReason | None]:
        """The half of `append` after the token joined the sequence: stop checks, its text.
        The overlapped loop (`overlap.py`) runs it while the next step computes."""
        reason: FinishReason | None = None
        if self._stops_on(token_id, eos_token_ids):
            # As in vLLM: the stopping token is kept in token_ids but adds no text.
            reason = FinishReason.STOP
            delta = ""
        else:
            delta = self.detokenizer.add_tokens([token_id])
            if self.detokenizer.stop_string is not None:
                reason = FinishReason.STOP_STRING
            elif self._at_length(max_model_len):
                reason = FinishReason.LENGTH
        if reason is not None:
            delta += self.detokenizer.finish()
        lps = (logprobs,) if logprobs is not None else ()
        return self.output((token_id,), delta, lps, reason), reason

    def ends_whatever_text(self, eos_token_ids: Set[int], max_model_len: int) -> bool:
        """Whether the token just appended ends the choice by its id or the length alone: what
        the next step's schedule must know; only a stop string needs the text."""
        last = self.seq.token_ids[-1]
        return self._stops_on(last, eos_token_ids) or self._at_length(max_model_len)

    def _stops_on(self, token_id: int, eos_token_ids: Set[int]) -> bool:
        """A stop token or EOS, once ``min_tokens`` are out (the sequence holds ``token_id``)."""
        params = self.seq.params
        stops = token_id in params.stop_token_ids or (
            token_id in eos_token_ids and not params.ignore_eos
        )
        return stops and self.seq.num_output_tokens >= params.min_tokens

    def _at_length(self, max_model_len: int) -> bool:
        seq = self.seq
        return seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= max_model_len

    def resume(
        self, token_ids: tuple[int, ...], eos_token_ids: Set[int], max_model_len: int
    ) -> FinishReason | None:
        """Take output tokens a previous run already produced (and streamed), one at a time as
        that run did, so the text already streamed is accounted for exactly; return the finish
        reason if they already ended the choice (the run died before saying so)."""
        seq = self.seq
        for token_id in token_ids:
            seq.append_token(token_id)
            if self.detokenizer.stop_string is None:
                self.detokenizer.add_tokens([token_id])
        if self._stops_on(token_ids[-1], eos_token_ids):
            return FinishReason.STOP
        if self.detokenizer.stop_string is not None:
            return FinishReason.STOP_STRING
        if self._at_length(max_model_len):
            return FinishReason.LENGTH
        return None

    def output(
        self,
        new_token_ids: tuple[int, ...],
        delta: str,
        logprobs: tuple[TokenLogprobs, ...],
        reason: FinishReason | None = FinishReason.ABORT,
    ) -> RequestOutput:
        seq = self.seq
        return RequestOutput.fast(
            request_id=seq.request_id,
            new_token_ids=new_token_ids,
            text_delta=delta,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=len(seq.token_ids) - seq.num_prompt_tokens,
            logprobs=logprobs,
            index=seq.index,
            num_cached_tokens=seq.num_cached_tokens,
        )

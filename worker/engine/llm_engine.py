"""The engine: requests in, one continuous batch stepped, tokens and text out.

``step()`` reads like the design: the scheduler decides, the runner computes, the sampler picks,
then each request's tokens are checked for stops and detokenized. No Redis, no threads.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import Any

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.constraint_gate import ConstraintGate
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.engine_request import EngineRequest, validate_request
from worker.engine.gc_policy import raise_gen0_threshold
from worker.engine.generate import generate
from worker.engine.grammar_compiles import GrammarCompiles, xgrammar_backend
from worker.engine.model_runner import ModelRunner, pick_device, pick_dtype
from worker.engine.outputs import Completion, RequestOutput
from worker.engine.overlap import OverlapLoop, overlap_mode
from worker.engine.prefix_cache import PrefixCacheStats
from worker.engine.prompt import InvalidRequestError, PromptTooLongError, encode_prompt
from worker.engine.request_state import EmitRow, RequestState, sampling_rows
from worker.engine.sampler import Sampler
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import FinishReason, Sequence, SequenceStatus
from worker.engine.step_faults import (
    DeviceFault,
    Failures,
    describe,
    run_contained,
    sample_contained,
)
from worker.engine.token_decoder import decoder_for
from worker.engine.wait_reasons import WaitInfo
from worker.models.loader import load_model, load_tokenizer, resolve_model_dir

Messages = list[dict[str, str]]
# Callers catch these from here; they live in prompt.py, shared with the job service's intake.
__all__ = ["InvalidRequestError", "LLMEngine", "PromptTooLongError"]


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.device = pick_device(config.device)
        if self.device.type == "cpu" and config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_dir = resolve_model_dir(config.model)
        self.tokenizer: Any = load_tokenizer(self.model_dir)
        decoder_for(self.tokenizer, True)  # its byte table (0.1 s) now, not in the first step
        dtype = pick_dtype(config.dtype, self.device)
        model = load_model(
            self.model_dir,
            dtype,
            self.device,
            config.quantization,
            config.model,
            config.quant_activations,
        )
        self.model_config = model.config
        self.runner = ModelRunner(config, model, self.device)
        # The layer kernels come with the attention backend's build (C++ or Triton).
        installed = self.runner.backend.install_kernels(model, config.linear_backend)
        self.num_packed_linears, self.num_fused_modules = installed
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            config.cache.block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
        )
        self.scheduler = Scheduler(config.scheduler.resolved(self.device.type), self.block_manager)
        eos = set(model.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        # Structure constraints compile on a thread of their own; requests wait for them here.
        grammars = GrammarCompiles(xgrammar_backend(self.tokenizer, model.config.vocab_size, eos))
        self._constraints = ConstraintGate(grammars)
        capacity = self.runner.num_blocks * config.cache.block_size
        self.max_model_len = min(
            config.scheduler.max_model_len or model.config.max_position,
            model.config.max_position,
            capacity,
        )
        self.sampler = Sampler(sorted(eos), config.seed, grammars, self.max_model_len)
        self._requests: dict[str, list[RequestState]] = {}  # by request id: its n choices
        self._states: dict[int, RequestState] = {}  # unfinished choices by sequence id
        self._arrivals = itertools.count()
        self._aborted: list[RequestOutput] = []
        # Request ids whose sequences lost their blocks in the last step (they resume later).
        self.last_preempted: tuple[str, ...] = ()
        self.last_num_batched_tokens = 0  # tokens the last step computed
        self.device_fault: DeviceFault | None = None  # set once the device failed: no more steps
        mode = overlap_mode(config, self.device)
        self._overlap = OverlapLoop(self, mode) if mode != "off" else None
        raise_gen0_threshold()  # a step's short-lived objects otherwise collect once a step

    # -- requests ----------------------------------------------------------------------------------

    def encode(self, prompt: str | Messages) -> list[int]:
        """Token ids of a prompt; chat messages go through the model's chat template."""
        return encode_prompt(self.tokenizer, prompt, self.model_dir)

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request (``EngineRequest`` says what each field means); it joins the running
        batch at the next ``step``. ``InvalidRequestError`` unless it can run."""
        request_id = request.request_id
        if request_id in self._requests:
            raise InvalidRequestError(f"request {request_id!r} is already in the engine")
        self._validate(request)
        if request.arrival_time is None:  # aged from here: a constraint's compile counts too
            request = dataclasses.replace(request, arrival_time=self.scheduler.aging.clock())
        if self._constraints.hold(request):  # compiling: added by _schedule once compiled
            return
        arrival = next(self._arrivals)
        states = [self._choice_state(request, i, arrival) for i in range(request.params.n)]
        live = [s for s in states if not s.seq.is_finished]
        for state in live:
            self._states[state.seq.seq_id] = state
        if live:
            self._requests[request_id] = states
            self.scheduler.add(live[0].seq, [s.seq for s in live[1:]], request.arrival_time)

    def add_prompt(
        self,
        request_id: str,
        prompt: str | Messages | None = None,
        params: SamplingParams | None = None,
        *,
        prompt_token_ids: Seq[int] | None = None,
        **fields: Any,
    ) -> None:
        """``add_request`` of a prompt (text or chat messages, encoded here) or its token ids:
        the convenience path of ``generate`` and tests; ``fields`` are ``EngineRequest``'s."""
        if prompt_token_ids is None:
            if prompt is None:
                raise InvalidRequestError("give a prompt, chat messages or prompt_token_ids")
            prompt_token_ids = self.encode(prompt)
        params = params or SamplingParams()
        self.add_request(EngineRequest(request_id, tuple(prompt_token_ids), params, **fields))

    def _validate(self, request: EngineRequest) -> None:
        vocab_size = self.model_config.vocab_size
        validate_request(request.prompt_token_ids, request.params, self.max_model_len, vocab_size)

    def _choice_state(self, request: EngineRequest, index: int, arrival: int) -> RequestState:
        """Choice ``index``'s state. One whose resumed tokens already end it is finished now and
        reported at the next step, like an abort."""
        params, ids = request.choice_params(index), list(request.prompt_token_ids)
        seq = Sequence(
            request.request_id,
            ids,
            params,
            arrival,
            index=index,
            cache_salt=request.cache_salt,
            priority=request.priority,
            tenant=request.tenant,
        )
        detokenizer = IncrementalDetokenizer(self.tokenizer, ids, params)
        state = RequestState(seq, detokenizer, self.eos_token_ids, self.max_model_len)
        resumed = request.resume[index] if index < len(request.resume) else ()
        done = state.resume(resumed) if resumed else None
        if done is not None:
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, done
            self._aborted.append(state.output((), state.detokenizer.finish(), (), done))
        return state

    def abort(self, request_id: str) -> bool:
        """End a waiting or running request (all its choices) now; its blocks return at once.
        False if unknown."""
        if (held := self._constraints.abort(request_id)) is not None:
            self._aborted += held
            return True
        states = self._requests.pop(request_id, None)
        if states is None:
            return False
        for state in states:
            if self._states.pop(state.seq.seq_id, None) is None:
                continue  # this choice finished already
            self.scheduler.finish(state.seq, FinishReason.ABORT)
            state.seq.drop_placeholders()  # a token in flight is dropped, never reported
            self._aborted.append(state.output((), state.detokenizer.finish(), ()))
        return True

    def has_unfinished(self) -> bool:
        """Requests still running, or outputs (aborts, resumed ends) not yet reported."""
        return bool(self._requests or self._aborted or self._constraints.num_held)

    def wait_info(self) -> dict[str, WaitInfo]:
        """Why each waiting request waits (reason, position), by request id."""
        return {**self.scheduler.wait_info(), **self._constraints.wait_info()}

    def cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters: tokens looked up and found, cached blocks, evictions."""
        return self.block_manager.cache_stats()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return each request's new tokens, text and finish, if any.
        `DeviceFault` if the device failed (`step_faults`): then and at every later call, as
        no step can run again in this process; the requests are intact, to be run elsewhere."""
        if self.device_fault is not None:
            raise self.device_fault
        try:
            return self._step()
        except DeviceFault as fault:
            self.device_fault = fault
            raise

    def _step(self) -> list[RequestOutput]:
        if self._overlap is not None:  # one step in flight between calls
            return self._overlap.step()
        outputs, self._aborted = self._aborted, []
        decision = self._schedule()
        if decision.is_empty:
            return outputs
        result, failed = run_contained(self.runner, decision)
        states = [self._states[sid] for sid in result.seq_ids]
        self.scheduler.update(decision)
        if states:
            rows = sampling_rows(states)
            sampled, bad_rows = sample_contained(self.sampler, result.logits, rows)
            failed |= {states[row].seq.seq_id: why for row, why in bad_rows.items()}
            ids, lps = sampled.token_ids, sampled.logprobs
            self._emit(zip(states, ids, lps, itertools.repeat(None)), failed, outputs)
        return outputs + self._fail(failed) if failed else outputs

    def _schedule(self) -> SchedulerOutput:
        """The next step's decision, noting its preemptions and token count for the caller."""
        self._aborted += self._constraints.release(self.add_request, idle=not self._requests)
        decision = self.scheduler.schedule()
        self.last_preempted = tuple(dict.fromkeys(decision.preempted_ids))
        self.last_num_batched_tokens = decision.num_batched_tokens
        return decision

    def _emit(
        self, rows: Iterable[EmitRow], failed: Failures, outputs: list[RequestOutput]
    ) -> None:
        """Each row's output for its token into ``outputs``, its request finished if the token
        ends it; a row whose request is in ``failed`` is skipped, and one that raises puts its
        request there. A row's ``n`` (None: `RequestState.append`): the sequence holds the
        token already, as its n-th, so it is only emitted (the overlapped loop's). One loop
        over the step's rows: a call a row cost ~0.03 ms at 256 rows."""
        for state, token, lps, n in rows:
            if failed and state.seq.seq_id in failed:
                continue
            try:
                out, reason = state.emit(token, lps, n)  # n None: `append`, in one call
            except Exception as exc:  # e.g. the detokenizer on one request: that request only
                failed[state.seq.seq_id] = describe(exc)
                continue
            if reason is not None:
                self._finish(state, reason)
            outputs.append(out)

    def _fail(self, failed: Failures) -> list[RequestOutput]:
        """End every request one of whose choices failed in this step, all its choices, with
        ``finish_reason`` error and what went wrong."""
        outputs = []
        for seq_id, why in failed.items():
            state = self._states.get(seq_id)
            states = self._requests.pop(state.seq.request_id, []) if state else []
            for s in states:
                if self._states.pop(s.seq.seq_id, None) is None:
                    continue  # finished earlier
                self.scheduler.finish(s.seq, FinishReason.ERROR)
                s.seq.drop_placeholders()
                out = s.output((), s.detokenizer.finish(), (), FinishReason.ERROR)
                outputs.append(out._replace(error=why))
        return outputs

    def _finish(self, state: RequestState, reason: FinishReason) -> None:
        seq = state.seq
        self.scheduler.finish(seq, reason)
        seq.drop_placeholders()  # the overlapped loop's next token, computed and dropped
        del self._states[seq.seq_id]
        if all(s.seq.is_finished for s in self._requests[seq.request_id]):
            del self._requests[seq.request_id]

    # -- convenience -------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Iterable[str | Messages],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Run all prompts through one continuous batch (`generate.generate`)."""
        return generate(self, prompts, params)

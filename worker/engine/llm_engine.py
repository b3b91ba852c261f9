"""The engine: requests in, one continuous batch stepped, tokens and text out.

``step()`` reads like the design: the scheduler decides, the runner computes, the sampler picks,
then each request's tokens are checked for stops and detokenized. No Redis, no threads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import Any

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.model_runner import ModelRunner, pick_device, pick_dtype
from worker.engine.outputs import Completion, RequestOutput
from worker.engine.request_state import RequestState
from worker.engine.sampler import Sampler, SamplingRequest
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import FinishReason, Sequence
from worker.models.loader import load_model, load_tokenizer, resolve_model_dir

Messages = list[dict[str, str]]


class InvalidRequestError(ValueError):
    """The request can never run (empty or too long a prompt, a duplicate id)."""


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.device = pick_device(config.device)
        if self.device.type == "cpu" and config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_dir = resolve_model_dir(config.model)
        self.tokenizer: Any = load_tokenizer(self.model_dir)
        model = load_model(self.model_dir, pick_dtype(config.dtype, self.device), self.device)
        self.model_config = model.config
        self.runner = ModelRunner(config, model, self.device)
        self.block_manager = BlockManager(self.runner.num_blocks, config.cache.block_size)
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        eos = set(model.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        self.sampler = Sampler(sorted(eos), seed=config.seed)
        capacity = self.runner.num_blocks * config.cache.block_size
        self.max_model_len = min(
            config.scheduler.max_model_len or model.config.max_position,
            model.config.max_position,
            capacity,
        )
        self._requests: dict[str, RequestState] = {}
        self._arrivals = itertools.count()
        self._aborted: list[RequestOutput] = []

    # -- requests ----------------------------------------------------------------------------------

    def encode(self, prompt: str | Messages) -> list[int]:
        """Token ids of a prompt; chat messages go through the model's chat template."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError(f"{self.model_dir} has no chat template: send a plain prompt")
        text = self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False
        )
        # The template already holds BOS and the role markers: add no special tokens again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def add_request(
        self,
        request_id: str,
        prompt: str | Messages | None = None,
        params: SamplingParams | None = None,
        prompt_token_ids: Seq[int] | None = None,
    ) -> None:
        """Queue a request; it joins the running batch at the next `step`."""
        if request_id in self._requests:
            raise InvalidRequestError(f"request {request_id!r} is already in the engine")
        params = params or SamplingParams()
        if prompt_token_ids is None:
            if prompt is None:
                raise InvalidRequestError("give a prompt, chat messages or prompt_token_ids")
            prompt_token_ids = self.encode(prompt)
        ids = [int(t) for t in prompt_token_ids]
        self._check_prompt(ids)
        seq = Sequence(request_id, ids, params, next(self._arrivals))
        detok = IncrementalDetokenizer(self.tokenizer, ids, params)
        self._requests[request_id] = RequestState(seq, detok)
        self.scheduler.add(seq)

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens; this engine fits at most "
                f"{self.max_model_len - 1} (max_model_len {self.max_model_len}, "
                "prompt plus at least one generated token)"
            )
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"token ids out of range [0, {vocab}): {bad[:5]}")

    def abort(self, request_id: str) -> bool:
        """End a waiting or running request now; its blocks return at once. False if unknown."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return False
        self.scheduler.finish(state.seq, FinishReason.ABORT)
        self._aborted.append(state.output((), state.detokenizer.finish(), ()))
        return True

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return each request's new tokens, text and finish, if any."""
        outputs, self._aborted = self._aborted, []
        decision = self.scheduler.schedule()
        if decision.is_empty:
            return outputs
        result = self.runner.run(decision)
        states = [self._requests[rid] for rid in result.request_ids]
        self.scheduler.update(decision)
        if not states:
            return outputs
        sampled = self.sampler(
            result.logits,
            [SamplingRequest(s.seq.params, s.seq.num_output_tokens) for s in states],
        )
        for state, token, logprobs in zip(states, sampled.token_ids, sampled.logprobs, strict=True):
            out, reason = state.append(token, logprobs, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                self.scheduler.finish(state.seq, reason)
                del self._requests[state.seq.request_id]
            outputs.append(out)
        return outputs

    # -- convenience -------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Iterable[str | Messages],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Run all prompts through one continuous batch; completions in input order."""
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(prompts)
        else:
            per_prompt = list(params)
        ids = [f"generate-{next(self._arrivals)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, per_prompt, strict=True):
            self.add_request(rid, prompt, p)
        done: dict[str, Completion] = {}
        collected: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
        while len(done) < len(ids):
            for out in self.step():
                if out.request_id not in collected:
                    continue
                collected[out.request_id].append(out)
                if out.finished:
                    done[out.request_id] = _completion(collected[out.request_id])
        return [done[rid] for rid in ids]


def _completion(outs: list[RequestOutput]) -> Completion:
    last = outs[-1]
    return Completion(
        request_id=last.request_id,
        text="".join(o.text_delta for o in outs),
        token_ids=tuple(t for o in outs for t in o.new_token_ids),
        finish_reason=last.finish_reason or "",
        num_prompt_tokens=last.num_prompt_tokens,
        logprobs=tuple(lp for o in outs for lp in o.logprobs),
    )

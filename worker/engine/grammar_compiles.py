"""Compiling structure constraints off the model loop, once per distinct constraint.

``GrammarCompiles.submit`` returns at once with a future; one background thread compiles (the
backend spreads one compile over its own threads). Results, failures included, are kept by the
constraint's content hash in a bounded LRU, so the jobs of an app that sends one schema compile
it once. The backend (xgrammar's tokenizer tables: 0.13 s for SmolLM2's vocabulary) is built on
that thread too, at the first constraint, so an engine that never sees one never pays for it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog

from producer.constraints import Structure
from worker.engine.grammar import CompiledGrammar, GrammarBackend, structure_key

log = structlog.get_logger("paternoster.engine")
# Compiled constraints kept: one is 40 KB (a small schema over 49,152 tokens) to a few MB (a
# large grammar); 128 covers the distinct schemas of many apps at once.
DEFAULT_CACHE_SIZE = 128


def xgrammar_backend(
    tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]
) -> Callable[[], GrammarBackend]:
    """The default backend's factory (imported when first called: xgrammar loads in ~0.5 s)."""
    stops = sorted(stop_token_ids)

    def make() -> GrammarBackend:
        from worker.engine.grammar_xgrammar import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, stops)

    return make


class GrammarCompiles:
    """Compiled constraints by content, compiled on a background thread."""

    def __init__(
        self, make_backend: Callable[[], GrammarBackend], cache_size: int = DEFAULT_CACHE_SIZE
    ) -> None:
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._cache_size = cache_size
        self._futures: OrderedDict[str, Future[CompiledGrammar]] = OrderedDict()
        self._lock = threading.Lock()  # the model loop submits; the sampler reads
        self._pool = ThreadPoolExecutor(1, "paternoster-grammar")

    def submit(self, structure: Structure) -> Future[CompiledGrammar]:
        """The compile of ``structure``: done already when it was compiled before."""
        key = structure_key(structure)
        with self._lock:
            future = self._futures.get(key)
            if future is None:
                future = self._pool.submit(self._compile, structure)
                self._futures[key] = future
                while len(self._futures) > self._cache_size:
                    self._futures.popitem(last=False)
            self._futures.move_to_end(key)
        return future

    def compiled(self, structure: Structure) -> CompiledGrammar:
        """The compiled constraint, waiting for it if it is still compiling. A request is
        admitted only once its compile is done, so this waits only if the LRU dropped it since
        (more than ``cache_size`` distinct constraints in between): then it compiles again."""
        return self.submit(structure).result()

    def backend(self) -> GrammarBackend:
        """The backend, built at first use (on the compile thread, or here)."""
        with self._lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, structure: Structure) -> CompiledGrammar:
        try:
            return self.backend().compile(structure)
        except Exception as exc:
            log.info("grammar_compile_failed", kind=structure.type, error=str(exc)[:300])
            raise

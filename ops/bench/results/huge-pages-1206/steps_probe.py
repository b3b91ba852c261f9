"""Per-step wall time by step shape, for ours vs ours-fp32 (throwaway probe)."""
import json, sys, time
sys.path.insert(0, '.')
from ops.bench import our_engine, engine
from worker.engine.llm_engine import LLMEngine
RECS = []
_orig_call = our_engine.StepCounter.__call__
def call(self):
    d = _orig_call(self)
    if not d.is_empty:
        RECS.append([d.num_decodes, d.num_batched_tokens, d.num_context_tokens, time.perf_counter()])
    return d
our_engine.StepCounter.__call__ = call
_orig_step = LLMEngine.step
def step(self):
    out = _orig_step(self)
    if RECS and len(RECS[-1]) == 4:
        RECS[-1].append(time.perf_counter())
    return out
LLMEngine.step = step
out = sys.argv[1]; argv = sys.argv[2:]
engine.main(argv)
json.dump(RECS, open(out, 'w'))

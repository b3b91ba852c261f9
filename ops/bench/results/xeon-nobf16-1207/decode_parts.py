"""engine.py with the decode stack, the LM head and prefill attention timed by wrappers (wall
s over the run, by rows of the call): where an all-decode step's time goes.

python ops/bench/results/amx-panels-1207/decode_parts.py --systems S --num-requests 64 --scale 1 --threads 2
"""
import collections
import sys
import time

sys.path.insert(0, ".")
import kernels.quant_reference  # noqa: F401  (before ops/bench shadows `kernels`)
from ops.bench import engine
from worker.attention.cpu_backend import CpuAttentionBackend
from worker.models import decode_stack, llama
from worker.models.quant import QuantWeight

T: collections.Counter = collections.Counter()
N: collections.Counter = collections.Counter()


def band(rows: int) -> str:
    return "1-9" if rows < 10 else "10-15" if rows < 16 else "16-79" if rows < 80 else "80+"


def wrap(cls, name, key, rows_of):
    f = getattr(cls, name)

    def w(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        label = f"{key} {band(rows_of(a))}"
        T[label] += time.perf_counter() - t
        N[label] += 1
        return r

    setattr(cls, name, w)


wrap(decode_stack.DecodeStack, "__call__", "stack", lambda a: a[1].shape[0])
wrap(llama.LlamaForCausalLM, "compute_logits", "lm_head", lambda a: a[1].shape[0])
wrap(CpuAttentionBackend, "prefill", "prefill_attn", lambda a: 80)
wrap(QuantWeight, "linear", "qlinear_python", lambda a: a[1].shape[0])
engine.main(sys.argv[1:])
for k in sorted(T):
    print(f"{k:24} {T[k]:7.2f} s  {N[k]:6} calls  {1e3 * T[k] / N[k]:8.3f} ms a call")

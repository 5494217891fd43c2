#!/bin/bash
# Run 235 (H100, warm machine after run 234): a 64-slot Runtime built eagerly (compile=False: the load and the memory
# plan's steps, no decode graphs) on empty Triton / Inductor / engine caches, with TRITON_PRINT_AUTOTUNING=1 and
# Triton's post-compile hook counting each kernel's compiles. plan.log: the autotuner's lines and the counts.
RUN=run235 source bench/device_env.sh && export TRITON_CACHE_DIR=/tmp/cold_triton_235c \
  TORCHINDUCTOR_CACHE_DIR=/tmp/cold_ind_235c COMPILED_ENGINE_CACHE=/tmp/cold_ce_235c TRITON_PRINT_AUTOTUNING=1 && \
TAIL=60 step plan 400 python3 -c "
import time, collections, torch
from bench.common import Context, Options
path = Context(Options(model='qwen3.5-0.8b', device='cuda', dtype='bfloat16')).model.path
t0 = time.perf_counter()
from triton import knobs
compiles = collections.Counter()
def hook(*a, **k):
    fn = k.get('fn'); name = getattr(getattr(fn, 'jit_function', fn), '__name__', str(fn)); compiles[name] += 1
    return False
knobs.runtime.jit_post_compile_hook = hook
from compiled_engine.runtime import Runtime
rt = Runtime.from_pretrained(path, device='cuda', dtype='bfloat16', compile=False, max_num_seqs=64, max_model_len=9216)
torch.cuda.synchronize()
print('from_pretrained (eager) s', round(time.perf_counter() - t0, 1))
print('compiles', sum(compiles.values()), compiles.most_common(40))
"

#!/bin/bash
# Any GPU (~6 min). Where a cold start-up's time goes (run 224: 217 s to a ready 64-slot engine on an empty cache, of
# which the decode graphs 67 s, the prompt captures 11, the sampler 33 (now ~16); the other ~106 s the load and the
# memory plan's steps). One engine built under cProfile on empty Triton and Inductor caches; the profile comes back
# (cold.prof) for pstats: the time inside Triton's compile, FLA's autotuning, Inductor's compile_fx, the captures.
# cProfile slows Python-heavy parts (Inductor's passes), so the split is indicative; the log's phase lines are wall.
RUN=run229 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
export TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) COMPILED_ENGINE_CACHE=$(mktemp -d)
TAIL=70 step cold 540 python3 -c "
import cProfile, logging, pstats, time
logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
from bench.common import Context, Options
ctx = Context(Options(model='qwen3.5-0.8b', device='cuda', dtype='bfloat16', max_num_seqs=64))
ctx.require(64, 8212)
pr = cProfile.Profile(); t = time.perf_counter(); pr.enable(); llm = ctx.llm(); pr.disable()
print('engine built in %.1f s' % (time.perf_counter() - t))
pr.dump_stats('$W/cold.prof')
pstats.Stats(pr).sort_stats('cumulative').print_stats(50)
"

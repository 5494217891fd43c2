#!/bin/bash
# Any GPU (~9 min). DecodeGraphRunner.warmup runs each bucket's step once eagerly on 8 threads before the compiles, so
# that the custom ops' Triton variants compile side by side (run 229, a cold start-up under cProfile: ~75-90 s of the
# main thread inside Triton's compiler, one variant after another). A = the tree with that pass edited out (in a copy),
# B = the tree; each a cold process (empty Triton, Inductor and engine caches) building a 64-slot engine, A first.
# Predicted: the decode graphs' start-up (run 224: 67 s cold) -25 to -40 s. Then the compiled decode's GPU tests.
RUN=run230 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/treeA && mkdir /tmp/treeA && cp -r compiled_engine graphs ops bench /tmp/treeA/
sed -i 's/            self._first_launches()/            pass  # A: no first launches/' /tmp/treeA/graphs/decode_graph.py
grep -n "A: no first launches" /tmp/treeA/graphs/decode_graph.py || exit 1
build() {  # $1: the tree
    TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) COMPILED_ENGINE_CACHE=$(mktemp -d) \
    PYTHONPATH=$1:/tmp/site python3 -c "
import logging, time
logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
from bench.common import Context, Options
ctx = Context(Options(model='qwen3.5-0.8b', device='cuda', dtype='bfloat16', max_num_seqs=64))
ctx.require(64, 8212)
t = time.perf_counter(); llm = ctx.llm(); print('engine built in %.1f s' % (time.perf_counter() - t))
" 2>&1 | grep -E "compiled decode|captured|sampler|engine built|Error|error"
}
TAIL=12 step cold_ab 420 bash -c "$(declare -f build); echo A; build /tmp/treeA; echo B; build $PWD"
TAIL=12 step tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_compile_gpu.py

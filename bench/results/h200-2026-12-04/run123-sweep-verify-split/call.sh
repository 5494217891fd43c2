#!/bin/bash
# Session 22, call 3: (1) bench sweep at batch 1 / 2 / 4, both contexts (run 116: context 549 b1 52.8, b2 44.1, b4
# 39.0%; 8,229 b1 51.6, b2 45.3, b4 41.9%), with the norm apart from 2 rows (0ec9445); (2) bench spec at batch 1,
# k = 2, forced 0.8: the GDN verify in V blocks of 32 at 4 warps (64 programs at batch 1, the gated norm a second
# launch) against today's whole heads (16 programs), one process each on this machine (VERIFY_LAUNCHES set for the
# process: a measurement, not a knob).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run123; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run123.tgz -C $W .; }
TAIL=12 step sweep 230 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 4 --max-model-len 8300 -p sweep.batches=1,2,4 -p sweep.prompt_len=512,8192 --out $W/sweep
SPEC="spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768"
TAIL=4 step spec_rule 170 python3 -m bench $SPEC --out $W/spec_rule
TAIL=4 step spec_v32 150 python3 -c "
import math, runpy, sys
from ops.triton import gated_deltanet_kernels as g
g.VERIFY_LAUNCHES = ((16, 32, 4), (math.inf, 64, 4))
sys.argv = ['bench'] + sys.argv[1:]
runpy.run_module('bench', run_name='__main__')" $SPEC --out $W/spec_v32

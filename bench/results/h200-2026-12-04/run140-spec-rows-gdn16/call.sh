#!/bin/bash
# Session 25, call 2: the attention op at fewer splits than the rule's at batch 1-2 (run 139: 128 splits lost);
# `bench spec` at batch 1, k = 2 with the verify's attention by rows (run 122: verify graph 1,048.8 µs = 1.51 decode
# graphs, forced 0.8 1.33x); the batch-16 decode graph at context 8,192 with the GDN decode in tiles of 32, 4 warps,
# prefetch (run 131, the rule's tiles of 64: 1.706 ms, GDN 278.9 µs a step).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run140; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run140.tgz -C $W .; }
TAIL=20 step sweep 60 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,2x8192x9216,1x512x9216,8x8192x9216 --splits 8,16,32,64 --out $W/sweep
TAIL=12 step spec 250 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 --out $W/spec
TAIL=16 step paths_b16_v32 260 python3 bench/step_paths.py --batches 16 --context 8192 --max-model-len 9216 --top 8 --gdn-launch 32:4:1 --out $W/paths_b16_v32

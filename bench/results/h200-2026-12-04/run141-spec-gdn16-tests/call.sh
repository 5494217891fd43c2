#!/bin/bash
# Session 25, call 3: the GPU tests of the GDN decode's new 9-16 entry (tiles of 32 with the prefetch) and of the
# split / replay cases; then `bench spec` at batch 1, k = 2 with the verify's attention by rows (run 140's was cut
# compiling at 250 s; run 122: verify graph 1,048.8 µs = 1.51 decode graphs, forced 0.8 1.33x).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run141; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run141.tgz -C $W .; }
TAIL=8 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "in_v_tiles or replays_in_cuda_graph or gated_deltanet_decode_matches" -p no:cacheprovider
TAIL=14 step spec 440 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 --out $W/spec

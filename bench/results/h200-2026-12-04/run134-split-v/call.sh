#!/bin/bash
# Session 24, call 1: the GDN decode's SPLIT_V launch (5021c3f, never run on a GPU): its GPU tests, the op alone at
# 1-16 sequences against whole heads and tiles, then the decode graph at context 8,192 (9,216-wide tables) with the
# rule (run 131: batch 1 GDN 104.3 µs a step) and with every batch on the split launch (tiles of 32, 4 warps; 64, 8).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run134; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run134.tgz -C $W .; }
TAIL=8 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "in_v_tiles or past_the_fused_rule" -p no:cacheprovider
TAIL=60 step ops 100 python3 bench/ops_microbench.py --batches 1,2,4,8,16 --skip linear,gated_delta_rule_prefill,paged_attention_decode,attention_decode --no-baseline --out $W/ops
TAIL=30 step paths_rule 200 python3 bench/step_paths.py --batches 1,4 --context 8192 --max-model-len 9216 --top 10 --out $W/paths_rule
TAIL=30 step paths_split32 140 python3 bench/step_paths.py --batches 1,4 --context 8192 --max-model-len 9216 --top 10 --gdn-launch 32:4:0:split --out $W/paths_split32

#!/bin/bash
# Session 24, call 2: the GDN decode rule with the V tiles of 32 over programs up to 4 sequences, and the paged decode
# kernel's query tile at the GQA group's power of two (4 rows at Qwen3.5's G = 4, was 16): their GPU tests, the paged
# decode op alone at the verify's row counts (1 / 3 / 4 / 6 / 16 rows, 16 rows of query tile against 4), then the
# decode graph at context 8,192 (9,216-wide tables) at batch 1 / 2 / 4 with the new rule against whole heads (the old
# rule's launch at 1-8).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run135; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run135.tgz -C $W .; }
TAIL=8 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider -k "paged_attention_decode or paged_attention_verify or replays_in_cuda_graph or gated_deltanet_decode_matches or attention_decode_matches"
TAIL=14 step ops 80 python3 bench/ops_microbench.py --batches 1,3,4,6,16 --skip linear,gated_delta_rule_prefill,paged_attention_prefill,causal_conv1d_prefill,gated_deltanet_verify,gated_deltanet_commit,gated_delta_rule_decode,causal_conv1d_decode,store_kv,gated_deltanet_decode --no-baseline --out $W/ops
TAIL=24 step paths_rule 260 python3 bench/step_paths.py --batches 1,2,4 --context 8192 --max-model-len 9216 --top 10 --out $W/paths_rule
TAIL=24 step paths_heads 100 python3 bench/step_paths.py --batches 1,2,4 --context 8192 --max-model-len 9216 --top 10 --gdn-launch head:8:1 --out $W/paths_heads

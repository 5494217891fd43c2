#!/bin/bash
# Session 24, call 4: the GDN verify kernel's gated norm by each key head's last program (split_norm, the decode
# kernel's SPLIT_V count) instead of a second launch: its GPU tests, then the verify op alone at k = 2 (P = 3), 1-64
# sequences: whole heads against V blocks of 64 / 32 / 16 with the norm kernel and with the split norm.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run137; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run137.tgz -C $W .; }
TAIL=8 step tests 170 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider -k "gated_deltanet_verify or gated_deltanet_decode_replays"
TAIL=70 step ops 120 python3 bench/ops_microbench.py --batches 1,2,4,8,16,64 --skip linear,gated_delta_rule_prefill,paged_attention_prefill,causal_conv1d_prefill,gated_deltanet_commit,gated_delta_rule_decode,causal_conv1d_decode,store_kv,gated_deltanet_decode,paged_attention_decode --no-baseline --out $W/ops

#!/bin/bash
# Session 23, call 8: the GDN decode's launches at 64 / 128 / 256 sequences, one call per graph (ops_microbench with
# --sweep: the fused kernel with whole heads at 4 / 8 / 16 warps, in V tiles of 64 and 32, and the unfused conv +
# delta rule + norm the rule runs above 64), for where the large-batch GDN time goes.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run132; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | grep -E "${GREP:-.}" | tail -${TAIL:-40}; tar czf $OUT/run132.tgz -C $W .; }
GREP="gated_deltanet_decode|unfused|gdr_decode|gated_delta_rule_decode|causal_conv1d_decode|rms_norm|bandwidth" TAIL=80 step ops 240 python3 bench/ops_microbench.py --out $W/ops --batches 64,128,256 --sweep --skip linear,gated_delta_rule_prefill --no-baseline

#!/bin/bash
# Session 25, call 6 (the session's last ~270 device seconds): the decode reduce kernel's accumulators loaded with the
# split sums instead of after them (one round trip fewer; the output bit-identical), the attention op alone against
# the same kernel with the loads in turn (the old mask restored by sed, second process), then the GPU tests.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run144; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run144.tgz -C $W .; }
CASES=1x512x9216,1x8192x9216,4x8192x9216,16x512x8300,16x8192x9216
TAIL=16 step together 45 python3 bench/attention_decode_sweep.py --cases $CASES --default-only --out $W/together
cp ops/triton/paged_attention_kernels.py $W/kernel_together.py
sed -i 's/mask=s_mask\[:, None\] & d_mask\[None, :\],$/mask=(s_mask \& (l != 0.0))[:, None] \& d_mask[None, :],/' ops/triton/paged_attention_kernels.py
grep -c "(s_mask & (l != 0.0))" ops/triton/paged_attention_kernels.py  # 1: the accumulators' load waits for the sums again
TAIL=16 step in_turn 45 python3 bench/attention_decode_sweep.py --cases $CASES --default-only --out $W/in_turn
cp $W/kernel_together.py ops/triton/paged_attention_kernels.py
TAIL=16 step together2 45 python3 bench/attention_decode_sweep.py --cases $CASES --default-only --out $W/together2
TAIL=4 step tests 80 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "paged_attention_decode or attention_decode_matches or paged_attention_verify" -p no:cacheprovider

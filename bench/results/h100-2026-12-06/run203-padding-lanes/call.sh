#!/bin/bash
# Any GPU: decode skips padding lanes' recurrent state (the null slot reads as zeros, is not written). The decode
# kernels' GPU tests, then the throughput workload (256 requests, nano-vllm's: its decode batches fall from 256 to 1,
# so most steps pad up to the next bucket) on the tree before the change (padding_lanes.patch reversed, in a copy) and
# after it. Predicted: +2-4% output tok/s (the padding lanes are ~8% of the decode steps' recurrent-state bytes).
RUN=run203 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=15 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "gated_delta_rule_decode or gated_deltanet_decode"
rm -rf /tmp/a && mkdir -p /tmp/a && tar cf - --exclude=./bench/results --exclude=./.whl . | tar xf - -C /tmp/a
(cd /tmp/a && patch -s -R -p1 < bench/pending/run203/padding_lanes.patch && grep -c "NULL_SLOT" ops/triton/delta_rule_kernels.py)
TP="python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096"
(cd /tmp/a && export PYTHONPATH=/tmp/a:/tmp/site && TAIL=6 step tp_before 220 $TP --out $W/tp_before)
TAIL=6 step tp_after 140 $TP --out $W/tp_after

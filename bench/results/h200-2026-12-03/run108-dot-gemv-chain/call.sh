#!/bin/bash
# Session 19, call 2 (cold machine; call 1, run 107's script, was refused three times): the skinny GEMM's tensor-core
# loop (DOT configs) against the few-rows GEMV rule and cuBLAS. 1. its GPU tests (and the rule's); 2. the 97-matmul
# chain at 2/3/4/8/16 rows: rule, cuBLAS, dot on every role, dot on the wide roles with the rule's narrow ones;
# 3. Nsight Compute on one layer's calls at 4 rows (the rule) and 1 row; 4. bench throughput (the allocator warm-up).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run108; mkdir -p $W
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
timeout --signal=INT 150 python3 -m pytest -q -x tests/test_kernels_cuda.py -k "tensor_core_loop or every_rule_config" -p no:cacheprovider > $W/tests.log 2>&1
echo "tests: exit $? at +$(( $(date +%s) - T0 ))s"; tail -5 $W/tests.log
timeout --signal=INT 220 python3 bench/gemv_chain.py --rows 2,3,4,8,16 --passes 0 --out $W/chain > $W/chain.log 2>&1
echo "gemv_chain: exit $? at +$(( $(date +%s) - T0 ))s"; grep -E "^M=|bound|^ +[0-9]+ " $W/chain.log | head -60
tar czf $OUT/run108.tgz -C $W .
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats"
for v in 4 1; do
  L=$(left); (( L < 60 )) && break
  timeout --signal=INT 70 $NCU --clock-control none --profile-from-start off $SECTIONS --csv --page details \
    python3 bench/gemv_ncu.py --rows $v > $W/ncu_rows$v.csv 2> $W/ncu_rows$v.err
  echo "ncu rows $v: exit $? at +$(( $(date +%s) - T0 ))s"
  grep -E '"Duration"|"DRAM Throughput"|"Issue Slots Busy"|"Registers Per Thread"|"Grid Size"|"No Eligible"|"Warp Cycles Per Issued Instruction"' $W/ncu_rows$v.csv | awk -F'","' '{print $5" | "$(NF-2)" | "$NF}' | head -40
done
tar czf $OUT/run108.tgz -C $W .
L=$(left); if (( L > 200 )); then
  B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
  timeout --signal=INT $(( L - 20 )) python3 -m bench throughput "${B[@]}" --out $W/tp > $W/tp.log 2>&1
  echo "throughput: exit $?"; grep -E "^throughput" $W/tp.log
  python3 -c "
import json; d=json.load(open('$W/tp/throughput.json'))['ours']
print(' allocs', d['allocator'], 'prefill', d['steps']['prefill'], 'first', [s['s'] for s in d['steps']['first'][:9]])"
  tar czf $OUT/run108.tgz -C $W .
fi

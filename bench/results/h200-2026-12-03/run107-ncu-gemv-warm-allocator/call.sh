#!/bin/bash
# Session 19, call 1 (cold machine): Nsight Compute on one layer's skinny GEMM calls at 1 / 4 / 8 rows and cuBLAS at 8
# (bench/gemv_ncu.py: where a 4-row call's time goes against one row's); the matmul chain at 1-4 rows with its
# critical path per kernel; then `bench throughput` (256-slot engine)
# to measure the allocator warm-up (b481950: predicted num_device_alloc 0, the first prompt steps ~35-50 ms).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run107; mkdir -p $W
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis"
for v in "1" "4" "8" "8 --cublas"; do
  name=ncu_rows$(echo $v | tr -d ' -')
  timeout --signal=INT 90 $NCU --clock-control none --profile-from-start off $SECTIONS --csv --page details \
    python3 bench/gemv_ncu.py --rows $v > $W/$name.csv 2> $W/$name.err
  echo "$name: exit $? $(wc -l < $W/$name.csv) lines"
  grep -E '"Duration"|"DRAM Throughput"|"Executed Ipc Active"|"Registers Per Thread"|"Grid Size"' $W/$name.csv | cut -c1-400 | head -40
done
timeout --signal=INT 120 python3 bench/gemv_chain.py --rows 1,2,3,4 --passes 0 --profile --out $W/chain > $W/chain.log 2>&1
echo "gemv_chain: exit $?"; grep -E "^M=|^ +[0-9]|µs a step" $W/chain.log | head -80
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
timeout --signal=INT 240 python3 -m bench throughput "${B[@]}" --out $W/tp > $W/tp.log 2>&1
echo "throughput: exit $?"; grep -E "^throughput|alloc" $W/tp.log | head
python3 -c "
import json; d=json.load(open('$W/tp/throughput.json'))['ours']
print(' allocs', d['allocator'], 'prefill', d['steps']['prefill'], 'first', [s['s'] for s in d['steps']['first'][:9]])"
tar czf $OUT/run107.tgz -C $W .

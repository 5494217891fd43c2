#!/bin/bash
# Session 23, call 3: why the tensor-core loop's narrow roles (N = 1,024, 64-128 programs) take ~33 µs a call at 16
# rows in the chain (run 126): the chain at 16 rows without PDL and without the L2 prefetch; Nsight Compute on one
# GDN layer's calls alone (caches flushed), both tensor-core starts and cuBLAS.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run127; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run127.tgz -C $W .; }
TAIL=4 step chain_nopdl 90 env CE_PDL=0 python3 bench/gemv_chain.py --out $W/chain_nopdl --rows 16 --passes 0
TAIL=4 step chain_noprefetch 90 env CE_L2_PREFETCH=0 python3 bench/gemv_chain.py --out $W/chain_noprefetch --rows 16 --passes 0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
for v in dot "dot, x as M" cublas; do
  f=${v//[, ]/_}
  if [ "$v" = cublas ]; then a=(--cublas); else a=(--dot "$v"); fi
  timeout --signal=INT 100 $NCU --clock-control none --profile-from-start off $SECTIONS --csv --page details \
    python3 bench/gemv_ncu.py --rows 16 "${a[@]}" > $W/ncu_$f.csv 2> $W/ncu_$f.err
  echo "ncu $v: exit $? at +$(( $(date +%s) - T0 ))s"; tail -2 $W/ncu_$f.err
  grep -E '"Duration"|"DRAM Throughput"|"Grid Size"|"Block Size"|"Registers Per Thread"|"Dynamic Shared Memory Per Block"|"Achieved Occupancy"|"Warp Cycles Per Issued Instruction"|"Stall Long Scoreboard"|"L2 Hit Rate"' $W/ncu_$f.csv | awk -F'","' '{print $5" | "$(NF-2)" | "$NF}' | head -60
  tar czf $OUT/run127.tgz -C $W .
done

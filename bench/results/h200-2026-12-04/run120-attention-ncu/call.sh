#!/bin/bash
# Session 21, call 4 (run 119's machine, warm): Nsight Compute on ce::attention_decode at 1 x 512 and 16 x 512 (tables
# 8,300 tokens wide: 64 / 8 splits), with and without the early loads; each call alone (no PDL overlap).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run120; mkdir -p $W; T0=$(date +%s)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats"
timeout --signal=INT 150 $NCU --clock-control none --profile-from-start off $SECTIONS --csv --page details \
  python3 bench/attention_decode_sweep.py --ncu --early-loads --cases 1x512x8300,16x512x8300 --out $W/ncu > $W/ncu.csv 2> $W/ncu.err
echo "ncu: exit $? at +$(( $(date +%s) - T0 ))s"; tail -3 $W/ncu.err
grep -E '"Duration"|"Registers Per Thread"|"Grid Size"|"Achieved Occupancy"|"Warp Cycles Per Issued Instruction"|"Executed Instructions"|"Stall Long Scoreboard"|"Issue Slots Busy"' $W/ncu.csv | awk -F'","' '{print $5" | "$(NF-2)" | "$NF}' | head -60
tar czf $OUT/run120.tgz -C $W .

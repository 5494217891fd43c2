#!/bin/bash
# Session 22, call 1: (1) the matmul chain at 2/3/4/8 rows with the norm and the SiLU gate as kernels of their own
# before a prologue-free GEMV ("apart"), against the fused prologues; (2) the GDN decode's launch in the decode graph
# at batch 8 / 16 (context 512): today's rule (whole heads at 8, tiles of 64 at 16) against tiles of 64, tiles of 32
# at 4 warps and whole heads; (3) the batch-16 graph at context 8,192 (c16's decode step).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run121; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run121.tgz -C $W .; }
TAIL=30 step chain 160 python3 bench/gemv_chain.py --out $W/chain --rows 2,3,4,8 --passes 0
TAIL=14 step paths_rule 100 python3 bench/step_paths.py --batches 8,16 --context 512 --top 8 --out $W/paths_rule
for v in 32:4:0 64:8:0 head:8:1; do
  TAIL=12 step paths_${v//:/_} 75 python3 bench/step_paths.py --batches 8,16 --context 512 --top 6 --gdn-launch $v --out $W/paths_${v//:/_}
done
TAIL=30 step paths8192 90 python3 bench/step_paths.py --batches 16 --context 8192 --top 24 --out $W/paths8192

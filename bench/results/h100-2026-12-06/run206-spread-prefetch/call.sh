#!/bin/bash
# Any GPU: run205's prefetch, spread over one program per SM (spread_prefetch: the norm over 16 rows issued a 17 MB
# prefetch from 16 SMs and outlasted its work ~4x: +206 µs of norm against -95 µs of cuBLAS at 16 rows). The
# 97-matmul chain at 16 and 8 rows with and without the prefetches, the kernels' GPU tests, then, where the chain
# gains, the decode graph at batch 16 and 8, context 8,192 (c16's step) with the prefetch and with CE_L2_PREFETCH=0.
# Predicted: the norm and activation kernels back to ~1.8 µs a call, the cuBLAS calls -1 to -2 µs each: -70 to
# -120 µs a chain step at 16 rows.
RUN=run206 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step chain 120 python3 bench/gemv_chain.py --out $W/chain --rows 16,8 --passes 0 --profile
TAIL=8 step tests_prefetch 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_cuda.py \
  -k "add_rms_norm or silu_mul"
if python3 - "$W/chain/gemv_chain.json" <<'PY'
import json, sys
compare = json.load(open(sys.argv[1]))["rows"]["16"]["compare"]
on, off = compare["cuBLAS"]["us"], compare["cuBLAS, no L2 prefetch"]["us"]
print(f"chain at 16 rows: prefetch {on} µs, none {off} µs")
sys.exit(0 if on < 0.99 * off else 1)
PY
then
  SP="python3 bench/step_paths.py --model qwen3.5-0.8b --batches 16,8 --context 8192 --max-model-len 9216"
  TAIL=30 step paths_on 240 $SP --out $W/paths_on
  TAIL=30 step paths_off 100 env CE_L2_PREFETCH=0 $SP --out $W/paths_off
fi

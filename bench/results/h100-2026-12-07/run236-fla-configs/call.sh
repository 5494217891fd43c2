#!/bin/bash
# Any GPU (~5 min): FLA's autotuned prefill-kernel configs recorded on this GPU (bench/fla_configs.py, on empty
# caches), into ops/triton/fla_kernel_configs/ here and under $OUT; then a cold eager 64-slot runtime with them (FLA
# reads them: FLA_CACHE_MODE=strict, ops/triton/fla_configs.py) against run 235's 68.1 s without (45.8 s of it
# autotuning, 84 candidate configs compiled and timed); then bench startup (cold and warm) against run 234's 151.9 /
# 28.8 s to the first token (memory plan 78.4 / 7.2 s). Predicted: the eager build ~25-30 s, no autotuning line;
# the cold start-up ~-40 s.
RUN=${RUN_NAME:-run236} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
export TRITON_CACHE_DIR=/tmp/cold_triton_236a TORCHINDUCTOR_CACHE_DIR=/tmp/cold_ind_236a \
  COMPILED_ENGINE_CACHE=/tmp/cold_ce_236a
TAIL=20 step record 200 python3 bench/fla_configs.py --model qwen3.5-0.8b --max-num-seqs 64 --max-model-len 9216 \
  --out ops/triton/fla_kernel_configs
mkdir -p $OUT/fla_kernel_configs && cp -r ops/triton/fla_kernel_configs/* $OUT/fla_kernel_configs/
export TRITON_CACHE_DIR=/tmp/cold_triton_236b TORCHINDUCTOR_CACHE_DIR=/tmp/cold_ind_236b \
  COMPILED_ENGINE_CACHE=/tmp/cold_ce_236b TRITON_PRINT_AUTOTUNING=1
TAIL=6 step eager_with 150 python3 -c "
import time, torch, os
from bench.common import Context, Options
path = Context(Options(model='qwen3.5-0.8b', device='cuda', dtype='bfloat16')).model.path
t0 = time.perf_counter()
from compiled_engine.runtime import Runtime
Runtime.from_pretrained(path, device='cuda', dtype='bfloat16', compile=False, max_num_seqs=64, max_model_len=9216)
torch.cuda.synchronize()
print('from_pretrained (eager) s', round(time.perf_counter() - t0, 1), os.environ.get('FLA_CACHE_MODE'),
      os.environ.get('FLA_CONFIG_DIR'))
"
unset TRITON_PRINT_AUTOTUNING
echo "autotuning lines: $(grep -c 'Triton autotuning for function' $W/eager_with.log)"
grep "Triton autotuning for function" $W/eager_with.log | sort | uniq -c
TAIL=6 step startup 300 python3 -m bench startup --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-num-seqs 64 --max-model-len 9216 -p startup.total_timeout_s=290 --out $W/startup

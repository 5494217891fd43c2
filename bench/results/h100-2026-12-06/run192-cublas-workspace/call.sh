#!/bin/bash
# The H100 part of run192 (no H200 started): the 97-matmul chain at 16 and 8 rows with cuBLAS's workspace at torch's
# default and at none (CUBLAS_WORKSPACE_CONFIG=:0:0). Then whether torch's TunableOp offers this CUDA build more than
# cuBLAS's default solution for the 16-row shapes (its results list every solution it timed).
RUN=run192 source bench/device_env.sh || exit 1
TAIL=12 step chain 90 python3 bench/gemv_chain.py --out $W/chain --rows 16,8 --passes 0 --profile
TAIL=12 CUBLAS_WORKSPACE_CONFIG=:0:0 step chain_noworkspace 90 python3 bench/gemv_chain.py --out $W/chain_nows \
  --rows 16,8 --passes 0 --profile
cat > /tmp/tunable.py <<'PY'
import torch, torch.nn.functional as F
torch.cuda.tunable.enable(True); torch.cuda.tunable.tuning_enable(True)
torch.cuda.tunable.set_filename("/tmp/run192/tunableop_results.csv")
for n, k in [(8224, 1024), (1024, 2048), (7168, 1024), (1024, 3584), (5120, 1024)]:
    x = torch.randn(16, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    F.linear(x, w); torch.cuda.synchronize()
for key, value in torch.cuda.tunable.get_results():
    print(key, value)
torch.cuda.tunable.write_file()
PY
TAIL=30 step tunable 120 python3 /tmp/tunable.py

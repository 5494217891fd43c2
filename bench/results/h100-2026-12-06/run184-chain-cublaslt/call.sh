#!/bin/bash
# Any GPU. The 97-matmul chain at 5, 8 and 16 rows (ce::linear's cuBLAS rows) with torch's matmuls through cuBLASLt
# (`torch.backends.cuda.preferred_blas_library("cublaslt")`) beside cuBLAS, each profiled. Run 121 charged c16's
# step (batch 16, H200) cuBLAS 782.7 µs plus a split-K reduce kernel 48.1 µs; cuBLASLt's heuristics choose other
# kernels. Predicted: level to -50 µs a 16-row chain step; if it wins beyond ~2%, the cuBLAS path in ops/linear.py
# takes it.
RUN=run184 source bench/device_env.sh || exit 1
TAIL=60 step chain 200 python3 bench/gemv_chain.py --out $W/chain --rows 16,8,5 --passes 0 --profile

#!/bin/bash
# Any GPU (~7 min cold). The GPU tests this session's audit changed :
# the captured prompt steps must replay a graph for every chunk; the decode-graph tests must replay (not fall back
# to eager decode) and compile 2 x 3 graphs; the attention kernels' outputs within a relative-norm bound of the
# reference besides TOL; the replayed decode ops' v_cache exact; the speculative GPU test's compiled rounds replayed
# and the oracle drafts accepted; and every captured prompt step test with sequence buckets grown two-fold (f37c2e4).
# On 4 xdist workers (the modules that share a compiled fixture stay on one).
RUN=run219 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step tests 500 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 --dist loadgroup \
  tests/test_prefill_graphs.py tests/test_compile_gpu.py tests/test_speculative.py \
  tests/test_kernels_cuda.py -k "prefill_graphs or compile_gpu or cuda_graph_rounds_equal_eager or paged_attention_decode_matches or paged_attention_prefill_matches or paged_attention_verify_matches or attention_decode_matches or decode_ops_replay"

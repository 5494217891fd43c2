#!/bin/bash
# Session 19, call 4: the rule with the vocabulary's matmul on the tensor-core loop at 2+ rows (DOT_VOCAB, from run
# 109's descent). 1. the linear GPU tests; 2. the 97-matmul chain at 2/3/4/8/16 rows (rule against the rule with the
# lm_head on the GEMV; cuBLAS against cuBLAS with the lm_head on the tensor-core loop); 3. bench sweep at batch 1-4,
# context 549, 8-slot engine; 4. bench spec at batch 1, k = 2, forced 0 / 0.8, drafts over 32,768 ids (the verify
# graph against a decode graph).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run110; mkdir -p $W; T0=$(date +%s)
timeout --signal=INT 150 python3 -m pytest -q tests/test_kernels_cuda.py -k "tensor_core_loop or every_rule_config or skinny_gemm_on_model_shapes or linear_dispatch or linear_replays" -p no:cacheprovider > $W/tests.log 2>&1
echo "tests: exit $? at +$(( $(date +%s) - T0 ))s"; tail -4 $W/tests.log
timeout --signal=INT 150 python3 bench/gemv_chain.py --rows 2,3,4,8,16 --passes 0 --out $W/chain > $W/chain.log 2>&1
echo "gemv_chain: exit $? at +$(( $(date +%s) - T0 ))s"; grep -E "^M=" $W/chain.log | cut -c1-120
tar czf $OUT/run110.tgz -C $W .
timeout --signal=INT 150 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 4096 -p sweep.batches=1,2,3,4 -p sweep.prompt_len=512 --out $W/sweep > $W/sweep.log 2>&1
echo "sweep: exit $? at +$(( $(date +%s) - T0 ))s"; grep -E "^sweep|b=|batch" $W/sweep.log | tail -8
tar czf $OUT/run110.tgz -C $W .
timeout --signal=INT $(( 575 - ($(date +%s) - T0) )) python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 --out $W/spec > $W/spec.log 2>&1
echo "spec: exit $? at +$(( $(date +%s) - T0 ))s"; grep -E "^spec|k=2|verify" $W/spec.log | tail -8
tar czf $OUT/run110.tgz -C $W .

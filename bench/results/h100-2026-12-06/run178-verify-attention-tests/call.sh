#!/bin/bash
# As it ran (the same warm H100, nothing carried). `bench spec` needs FLA (the prompt steps' chunked delta rule): it
# stopped at "No module named 'fla'" (spec_no_fla.log), as did the opcheck of ce::gated_delta_rule_prefill.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
(timeout 200 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider -k "attention_decode or paged_attention_verify or opcheck" 2>&1 | tail -25) | tee $OUT/tests2.log
SPEC="python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3"
timeout 200 $SPEC --out $OUT/spec_fused 2>&1 | grep -v Warn | tail -14 | tee $OUT/spec_fused.log

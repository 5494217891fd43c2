#!/bin/bash
# As it ran (a fresh H100; carry .whl: fla-core 0.6.0 and einops downloaded this session). The tree carried
# fused.patch (session 34's fused verify attention, then in the library); the B side reverses it.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
SPEC="python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3"
timeout 190 $SPEC --out $OUT/spec_fused 2>&1 | grep -v "Warn\|warn\|loading" | tail -12 | tee $OUT/spec_fused.log
git apply -R bench/pending/run177/fused.patch && echo reversed
timeout 150 $SPEC --out $OUT/spec_gate 2>&1 | grep -v "Warn\|warn\|loading" | tail -12 | tee $OUT/spec_gate.log

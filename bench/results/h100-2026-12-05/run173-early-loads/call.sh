#!/bin/bash
# Any GPU (an A/B within the call). Loads issued before the reductions they used to follow (df2f96b, 3e0184f,
# 5073749; `loads.patch`): the one-row GEMV's first x chunk before the norm prologue's statistics pass, the fused GDN
# decode's q and k inputs with the first tile's, the fused attention decode's and the attention prologue's k and v rows
# (and the cache slot) with q's. Offline (Triton 3.9, sm_90 PTX) every post-wait load of the projected row now comes
# before the first barrier; before, one to two L2 round trips more stood on each kernel's critical path.
# (1) the changed kernels' GPU tests; (2) `bench spec` batch 1, k = 2, forced 0.8 with the patch, without it
# (`git apply -R`), with it again. Predicted: the decode graph -15 to -40 µs (49 norm-prologue GEMVs, 18 GDN, 6
# attention layers at ~0.2-0.5 µs a round trip), the round graph -10 to -20 µs (its two 1-row drafts, the prologue).
RUN=run173 source bench/device_env.sh || exit 1
P=bench/pending/run173/loads.patch
git apply -R --check $P || { echo "the tree does not carry loads.patch"; exit 1; }
TAIL=6 step tests 200 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "attention_decode or attention_prologue or gated_deltanet_decode or add_rms_norm_linear or linear_chain or decode_ops_replay"
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=14 step spec_loads 170 "${SPEC[@]}" --out $W/spec_loads
git apply -R $P && echo "loads.patch reversed"
TAIL=14 step spec_before 130 "${SPEC[@]}" --out $W/spec_before
git apply $P && echo "loads.patch applied"
TAIL=14 step spec_loads2 130 "${SPEC[@]}" --out $W/spec_loads2
export_caches

#!/bin/bash
# Prepared in session 29 (no device lent), not run yet; after run152-153 (or alone). Run from the repository root with
# nothing applied; when it has run, move this folder under bench/results/ with its results.
#  - The GEMV loops without masks where every tile is full (`FULL`, `gemv_kernels.full_tiles`: every matmul of the
#    model but down, K = 3,584): the loads unpredicated, no registers zeroed for masked lanes, the loop a chunk short
#    and the last chunk's product after it. Offline (Triton 3.9, sm_90) the loop's instructions an iteration: one row
#    80 -> 74 (wide tile), 2 rows 335 -> 317, 3 rows (2 + 1) 435 -> 414, 4 rows 525 -> 496: CS2R 4-24 -> 0, ISETP
#    3-6 -> 0-1; registers up (the unmasked loads hoisted): 2 rows' wide tile 102 -> 141, the rest still one wave.
#    A/B/A (the switch `FULL_TILES` by sed) in the 97-matmul chain at 1, 2 and 3 rows (run 145: 3 rows 670.9 µs).
#    Predicted: level at one row (latency-bound), -10 to -20 µs at 3 rows (issue-bound: 73% of issue slots busy at 4
#    rows, Nsight Compute), the share of the wide matmuls' ~5% fewer instructions; at 2 rows possibly a loss (in_proj
#    in two waves at 141 registers).
#  - then one pass of the chain's descent at 3 rows with FULL on: down (K = 3,584) keeps masks on its 2,048-wide
#    tiles (the second chunk 1,536 of 2,048 live, its padding's multiply-adds still issued); whether a tile that
#    divides K (512 x 7) now wins its role (`--passes 1`, ~1 minute). In the batch-1 verify graph (run 149) the
#    3-row excess over one row sits in the N = 1,024 roles: down 141.8 µs over 24 calls (5.9 a call, 3.4x its
#    bytes' time) and out_proj / o_proj 83.0 (3.5, 3.5x), against ~104 and ~48 at one row; run 97's descent at 3
#    rows found the rule's own tiles best, but that was before EXTRA_ROW and the norm apart.
#  - its GPU tests first (the model's shapes take the new loops; ragged ones the masked ones).
RUN=run154 source bench/device_env.sh || exit 1
F=ops/triton/gemv_kernels.py
grep -qx 'FULL_TILES = True' $F || { echo "FULL_TILES is not the switch this call expects"; exit 1; }
TAIL=6 step tests 110 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "skinny_gemm_on_model or every_rule_config or add_rms_norm_linear_on_model or silu_mul_linear_on_model or linear_chain_with_pdl or skinny_gemm_ragged"
TAIL=8 step chain_full 90 python3 bench/gemv_chain.py --out $W/chain_full --rows 1,2,3 --passes 0
sed -i 's/^FULL_TILES = True$/FULL_TILES = False/' $F && grep -cx 'FULL_TILES = False' $F
TAIL=8 step chain_masked 90 python3 bench/gemv_chain.py --out $W/chain_masked --rows 1,2,3 --passes 0
sed -i 's/^FULL_TILES = False$/FULL_TILES = True/' $F
TAIL=8 step chain_full2 90 python3 bench/gemv_chain.py --out $W/chain_full2 --rows 1,2,3 --passes 0
TAIL=30 step descent3 150 python3 bench/gemv_chain.py --out $W/descent3 --rows 3 --passes 1
export_caches

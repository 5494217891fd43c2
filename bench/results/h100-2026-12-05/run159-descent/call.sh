#!/bin/bash
# Prepared in session 30, after run156 and run158 (or alone). With the SiLU gate in gate_up's epilogue (6ac4dbf) down
# has no prologue: whether another tile now wins its role. Its one-row rule (4 x 2,048, 8 warps) and its 2-4-row tiles
# (8 x 2,048) came from descents with the gate in its prologue, and K = 3,584 leaves their second chunk ragged
# (1,536 of 2,048 live, the dead lanes' multiply-adds issued); a tile that divides K (512 x 7) takes the unmasked
# loop. One descent pass at 1 and 3 rows (`gemv_chain.py --passes 1`: every role's candidates with the others fixed;
# ~1-2 minutes a row count). Run from the repository root with nothing applied (carry .whl, .cecache).
RUN=run159 source bench/device_env.sh || exit 1
TAIL=40 step descent1 200 python3 bench/gemv_chain.py --out $W/descent1 --rows 1 --passes 1
TAIL=40 step descent3 250 python3 bench/gemv_chain.py --out $W/descent3 --rows 3 --passes 1
export_caches

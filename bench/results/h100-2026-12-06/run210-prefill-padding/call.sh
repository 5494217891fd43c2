#!/bin/bash
# Any GPU. The prefill op's padding rule (40e5bca: a captured prompt step's padding sequences on the null slot start
# from zeros and write nothing back; one Triton kernel gathers / scatters the state rows, skipping them): its GPU
# tests, then prompt steps and a served stream with (B) and without (A, padding.patch reversed) it. Shapes: 16
# sequences (key 16, no padding), 17 (key 64: 47 padding), 32 (key 64: 32), 65 (key 256: 191); 24 in flight
# (mixed steps of 24 sequences: key 64, 40 padding). Predicted on an H100: ~2 MiB a padding sequence and linear
# layer less DRAM traffic, -0.55 ms at 47, -2.2 ms at 191; the 16-sequence step level.
RUN=run210 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step tests 170 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "gated_delta_rule_prefill" \
  tests/test_prefill_graphs.py -p no:cacheprovider
rm -rf /tmp/a && mkdir /tmp/a && git ls-files -z 2>/dev/null | xargs -0 -I{} cp --parents {} /tmp/a 2>/dev/null
[ -f /tmp/a/ops/triton/delta_rule_kernels.py ] || cp -r ops graphs compiled_engine bench tests /tmp/a/
(cd /tmp/a && patch -s -R -p1 < $OLDPWD/bench/pending/run210/padding.patch) && echo "A tree: padding.patch reversed"
ARGS="--model qwen3.5-0.8b --shapes 1x256+15,1x256+16,1x512+31,1x256+64 --serve 24 --requests 96 --input-len 512 --output-len 128"
TAIL=14 step B_new 190 python3 bench/prompt_steps.py $ARGS --out $W/B_new
TAIL=14 step A_old 140 env PYTHONPATH=/tmp/a:/tmp/site bash -c "cd /tmp/a && python3 bench/prompt_steps.py $ARGS --out $W/A_old"

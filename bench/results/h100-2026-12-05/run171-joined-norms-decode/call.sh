#!/bin/bash
# Run 170's joined q/k norms again, the GDN decode op only, alternated (rule / joined / rule / joined) at batch 1 and
# 16: run 170 had the batch-1 split launch -0.64 µs a call, the batch-16 walked tiles +0.45, single samples.
RUN=run171 source bench/device_env.sh || exit 1
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_decode,gated_delta_rule_prefill,gated_deltanet_commit,gated_deltanet_verify,linear,sweep
MICRO=(python3 bench/ops_microbench.py --batches 1,16 --skip $SKIP --no-baseline)
for i in 1 2; do
  TAIL=2 step micro_rule$i 40 "${MICRO[@]}" --out $W/micro_rule$i
  git apply bench/pending/run171/joined_norms.patch
  TAIL=2 step micro_joined$i 40 "${MICRO[@]}" --out $W/micro_joined$i
  git apply -R bench/pending/run171/joined_norms.patch
done

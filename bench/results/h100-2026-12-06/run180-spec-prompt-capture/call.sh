#!/bin/bash
# Speculative decoding's prompt steps captured with their drafts (graphs/prefill_graph.py's drafter). Most important
# first (the session's device time is short): `bench spec` at batch 1, k = 2, forced 0.8 with the capture (the
# default), the capture's GPU tests, the same `bench spec` without it (--max-prefill-capture-tokens 0: every prompt
# step eager, as every speculative prompt step ran before), then the compiled rounds' end-to-end GPU test (whose
# prompt steps now replay the capture). Predicted on an H100: the speculative TTFT from ~21.6 ms (run 179) to ~4-5
# ms (the baseline's captured 3.6 ms plus the drafts' replay), so the output tok/s speed-up at 128 new tokens from
# 1.27x to ~1.55-1.6x; TPOT and the decode speed-up level (1.658x).
RUN=run180 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
summary() {
    python3 - "$W/$1/spec.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
b = d["baseline"]["1"]
print("baseline TTFT %.2f ms TPOT %.4f ms" % (b["ttft_ms"]["p50"], b["tpot_ms"]["p50"]))
for key, v in d["speculative"]["2"]["1"].items():
    if "ttft_ms" in v:
        print(f"  {key}: TTFT {v['ttft_ms']['p50']:.2f} ms TPOT {v['tpot_ms']['p50']:.4f} ms speedup "
              f"{v['speedup']:.3f} decode {v['decode_speedup']:.3f} differing {v['outputs_differing_from_baseline']}")
PY
}
TAIL=6 step spec_captured 150 "${SPEC[@]}" --out $W/spec_captured
summary spec_captured
TAIL=8 step tests_prefill 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs.py
TAIL=6 step spec_eager 80 "${SPEC[@]}" --max-prefill-capture-tokens 0 --out $W/spec_eager
summary spec_eager
TAIL=8 step tests_spec 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_speculative.py -k on_gpu

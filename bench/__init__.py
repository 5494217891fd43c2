"""bench: the benchmark harness of compiled_engine (issue 9).

    python -m bench <scenario>[,<scenario>...] [--model tiny|qwen3.5-0.8b|PATH] [--device cuda|cpu] [--dtype ...]
                    [--out DIR] [--vs-hf] [--enforce-eager] [-p KEY=VALUE ...]
    python -m bench report DIR [DIR ...] --out DIR      # aggregate result folders into one results.json

Scenarios (one module each): latency, sweep, throughput, sampling (the chat-like workload greedy vs sampled),
cookbook (SGLang's published Qwen3.5-0.8B serving cells: 8,192 in / 1,024 out at concurrency 1-1024, closed loop),
prefix, startup, step_profile (where a decode step's time goes: torch profiler), snapshot_methods (prefix-cache
snapshots: prefill chunks ending at boundaries vs FLA's per-chunk states; GPU only, skipped on the CPU), spec (MTP
speculative decoding vs plain decoding: the MTP head and forced acceptance rates, step costs), serve (the
OpenAI-compatible server under HTTP load, vllm bench serve's metrics, beside the offline engine). Each
writes ``<scenario>.json`` (and a PNG when matplotlib is importable) to ``--out``. Every number is reported beside
its bound from the performance model (bench/bounds.py, docs/ARCHITECTURE.md "Performance model") using the copy bandwidth
measured in the same run (bench/bandwidth.py), and, with ``--vs-hf``, beside HF transformers run on the same
requests in the same process (after ours is released; ``--ours-from DIR`` takes our side from an earlier run's JSON
instead, so that HF alone runs: a model too large for ours and HF in one device call).

Scenario sizes are keyword arguments of each module's ``run``; ``-p latency.new_tokens=8`` (or ``-p new_tokens=8``
for every scenario that has the argument) overrides one from the command line.
"""

SCENARIOS = ("latency", "sweep", "throughput", "sampling", "cookbook", "prefix", "startup", "step_profile",
             "snapshot_methods", "spec", "serve")

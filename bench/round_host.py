"""Host time of a speculative round, the device's work stubbed out (runs on the CPU, tiny default model).

A round that is not chained reads its tokens back before the next round is packed (compiled_engine/engine.py
``_read_round``), so the host's work between two rounds adds to that round's wall on a GPU (a chained round hides it
behind the next round's GPU work). This times ``LLMEngine.step()`` of unchained greedy rounds (``overlap_decode`` off)
with ``Runtime.fused_round`` replaced by the compiled path's host work alone: the blocks reserved, the verify step
packed and staged (``SpeculativeRound.pack`` / ``load``), and fixed results in place of the graph's (every draft
accepted), read back as a compiled round's are (``SpeculativeRound.round_results``: the host rows the graph writes).
What remains is the engine's: scheduling, the read-back and its bookkeeping, stop checks. Requests are as ``bench
spec``'s (``LLM.generate`` on a random checkpoint): FINAL_ONLY outputs, no tokenizer.

    python bench/round_host.py --batches 1,8,64 --max-model-len 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from compiled_engine import LLM, SamplingParams
from compiled_engine.sampling_params import RequestOutputKind
from compiled_engine.speculative import SpeculativeRound, SpeculativeStep


def host_round_us(batch: int, max_model_len: int, k: int, rounds: int) -> tuple[float, float]:
    """(p50, min) µs of ``LLMEngine.step()`` over ``rounds`` stubbed rounds of ``batch`` sequences."""
    llm = LLM(speculative_config={"method": "mtp", "num_speculative_tokens": k}, max_model_len=max_model_len,
              max_num_seqs=max(batch, 8))
    engine, runtime = llm.engine, llm.runtime
    staged = SpeculativeRound(runtime.executor.model, k, runtime.config.block_size, max(batch, 8),
                              runtime.max_model_len, torch.device("cpu"), capture=False)

    # the graph's outputs, made once: every draft accepted, the same tokens and drafts each round; and their rows in
    # the results buffer, as the graph would write them
    accepted = torch.full((batch,), k, dtype=torch.long)
    tokens, new = torch.arange(1, k + 2).repeat(batch, 1), torch.arange(k + 2, 2 * k + 2).repeat(batch, 1)
    staged.results[:batch] = torch.cat([accepted[:, None], tokens, new], dim=1)

    def stub(seqs, drafts, keep_free=0, sampling=None, chain_rounds=0):
        runtime._reserve_draft_blocks(seqs, [k + 1] * len(seqs), [k - 1] * len(seqs), keep_free)
        starts = [s.num_computed_tokens for s in seqs]
        length, _ = staged.pack(seqs, drafts)
        staged.load(length)
        return (SpeculativeStep(list(seqs), None, None, starts, [k + 1] * len(seqs), None),
                staged.round_results((accepted, tokens, new), len(seqs)))

    prompt, warmup = list(range(1, 17)), 100
    # every timed step must be a round of all rows: room for them, each round emitting k + 1 tokens a row
    if len(prompt) + (rounds + warmup + 1) * (k + 1) > max_model_len:
        raise ValueError(f"{rounds} rounds of k = {k} need max_model_len >= "
                         f"{len(prompt) + (rounds + warmup + 1) * (k + 1)}")
    # As LLM.generate on the bench's random checkpoints: outputs when finished (FINAL_ONLY), no detokenizing; rounds
    # read back one by one (unchained).
    engine.tokenizer = None
    engine.overlap_decode = False
    params = SamplingParams(temperature=0.0, max_tokens=max_model_len - len(prompt), ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i in range(batch):
        engine.add_request(f"r{i}", prompt, params)
    while engine.num_verified_rows < batch:  # the prompts, then the first real round
        engine.step()
    runtime.fused_round = stub
    verified, times = engine.num_verified_rows, []
    for _ in range(rounds + warmup):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    if engine.num_verified_rows - verified != batch * (rounds + warmup):
        raise RuntimeError("a timed step was not a round of every row")
    times = times[warmup:]
    return statistics.median(times) * 1e6, min(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    for batch in (int(b) for b in args.batches.split(",")):
        p50, low = host_round_us(batch, args.max_model_len, args.k, args.rounds)
        print(f"batch {batch:>3}, k = {args.k}, max_model_len {args.max_model_len}: host time a round p50 "
              f"{p50:.0f} µs, min {low:.0f} µs", flush=True)


if __name__ == "__main__":
    main()

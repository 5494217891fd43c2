"""Host time of the penalised rows' token table (``compiled_engine/sampler.py`` ``penalties``), on the CPU.

Every step a penalised row is sampled from the logits outside the decode graph, after the penalties, which count
its prompt and output tokens from a table the host fills and uploads every step (as vLLM's). This builds ``rows``
requests with ``bench sampling``'s lengths (prompts of 256-2,048 tokens, 32-512 outputs, seed 0), then times
``penalties`` over ``steps`` steps, each after one new token a row (the last one in flight, as an overlapped step
has it): the minimum and median ms.

    python bench/penalties_host.py --rows 256 --steps 30
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from compiled_engine import SamplingParams
from compiled_engine.request import Request
from compiled_engine.sampler import penalties
from compiled_engine.sequence import Sequence

VOCAB = 248320  # Qwen3.5's


def host_ms(rows: int, steps: int) -> tuple[float, float]:
    """(min, median) ms of ``penalties`` over ``steps`` steps of ``rows`` requests."""
    rng = random.Random(0)
    requests = []
    for i in range(rows):
        prompt = [rng.randrange(10000) for _ in range(rng.randint(256, 2048))]
        output = [rng.randrange(10000) for _ in range(rng.randint(32, 512))]
        params = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, repetition_penalty=1.1, max_tokens=600)
        requests.append(Request(f"r{i}", Sequence(i, prompt + output, len(prompt)), params, seed=i,
                                stop_ids=frozenset(), prompt_token_ids=prompt))
    last = torch.zeros(rows, dtype=torch.long)
    times = []
    for _ in range(steps):
        for request in requests:
            request.seq.token_ids.append(rng.randrange(10000))
        start = time.perf_counter()
        table = penalties(requests, torch.device("cpu"), VOCAB, last)
        times.append(time.perf_counter() - start)
        if table.rows.numel() != rows:
            raise RuntimeError(f"the table has {table.rows.numel()} rows, not {rows}")
    return min(times) * 1e3, statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    low, median = host_ms(args.rows, args.steps)
    print(f"penalties, {args.rows} rows: min {low:.2f} ms, median {median:.2f} ms over {args.steps} steps")


if __name__ == "__main__":
    main()

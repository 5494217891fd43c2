"""serve: the OpenAI-compatible server under load over HTTP, beside the offline engine on the same requests.

    python -m bench serve --model qwen3.5-0.8b -p serve.concurrency=64 -p input_len=1024 -p output_len=512
    python -m bench serve --model qwen3.5-0.8b -p url=http://127.0.0.1:8000   # a server already running

Workload, per cell (a concurrency ``c`` and a request rate): ``num_requests`` (default ``max(4 c, min_requests)``)
random prompts of ``input_len`` token ids (bench.cookbook.random_prompts), each asking for exactly ``output_len``
greedy tokens (ignore_eos), sent as streaming ``/v1/completions`` requests with token-id prompts. Arrivals as
``vllm bench serve``: a Poisson process at ``request_rate`` requests/s (inf: all at t=0), at most ``c`` in flight
(``--max-concurrency``). ``warmup_requests`` short requests run first, untimed.

Metrics, with ``vllm bench serve``'s names and definitions (measured at the client):
  * TTFT: request sent -> first streamed token; TPOT, per request: (e2e - TTFT) / (output tokens - 1);
  * ITL: the gaps between successive streamed chunks of a request, pooled over requests;
  * E2EL: request sent -> last chunk;
  * request_throughput = completed / duration; output_throughput = output tokens / duration;
    total_token_throughput = (prompt + output tokens) / duration (duration: first send -> last completion);
  mean, median (p50) and p99 of each latency, in ms.

The offline half: the same prompts through the engine in-process at the same concurrency, closed loop (the cookbook
scenario's ``serve`` loop: ``c`` in flight, one more as each finishes; at an infinite request rate this is the
server cell's arrival pattern). ``overhead`` = 1 - server output tok/s / offline output tok/s: what HTTP, SSE,
detokenization and the asyncio hand-off cost (the issue's target: <= 5% at c=64 on Qwen3.5-0.8B, H200).

Where the server runs (``server``): ``process`` (the default on CUDA): after the offline half the shared engine is
released and ``python -m compiled_engine serve`` starts with the same engine knobs (its log goes to
``<out>/serve_server.log``), so the client and the server do not share a GIL; ``thread`` (the default on the CPU, and
the smoke test's): an ``OpenAIServer`` over the shared engine under uvicorn in a thread of this process; ``url``: a
server already running (its knobs are the caller's business). ``stream_interval``: the server's
``--stream-interval`` (a request's tokens streamed every that many after its first); ``engine_process`` (with
``server=process``): the server's ``--engine-process`` (its engine loop in a process of its own) or
``--no-engine-process`` (a thread); default: the server's default (a process on CUDA).
``client_processes``: the load generator's processes (default one per 16 concurrent streams, at most 8; see
``run_load``). ``server_side``, per cell: the mean TTFT and TPOT the server itself measured (its /metrics), which
splits the client's TTFT into the server's part and the wire's.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from bench.bounds import workload_decode_bound
from bench.common import REPO_ROOT, Context, percentile
from bench.cookbook import random_prompts, serve as offline_loop

OWN_ENGINES = True  # ``process`` releases the shared engine for the server process: run after the shared scenarios
SERVED_NAME = "bench"
TOKEN_IDS = re.compile(rb'"token_ids":\s*\[([^\]]*)\]')


def requirements(concurrency=(64,), input_len: int = 1024, output_len: int = 256, **_):
    return max(_levels(concurrency)), input_len + output_len


def run(
    ctx: Context,
    concurrency=(64,),
    request_rate=math.inf,
    input_len: int = 1024,
    output_len: int = 256,
    num_requests=None,
    min_requests: int = 16,
    warmup_requests: int = 8,
    seed: int = 0,
    server: str | None = None,
    url: str | None = None,
    stream_interval: int = 1,
    engine_process: bool | None = None,
    client_processes: int | None = None,
    startup_timeout_s: float = 1800.0,
) -> dict:
    levels = _levels(concurrency)
    rates = [float(r) for r in (request_rate if isinstance(request_rate, list) else [request_rate])]
    server = "url" if url else (server or ("process" if ctx.device.type == "cuda" else "thread"))
    if server not in ("process", "thread", "url"):
        raise ValueError(f"server must be 'process', 'thread' or a url, got {server!r}")
    if engine_process and server != "process":
        raise ValueError("engine_process needs server=process (the server's own engine process)")
    if server == "process" and engine_process is None:  # the server's own default (server.build_server)
        engine_process = ctx.device.type == "cuda"
    ctx.require(*requirements(levels, input_len, output_len))
    llm = ctx.llm()
    vocab = ctx.model_config.vocab_size
    mb, bw = ctx.model_bytes(), ctx.bandwidth()["bytes_per_s"]
    cells = [{"concurrency": c, "request_rate": rate,
              "requests": num_requests or max(4 * c, min_requests)} for c in levels for rate in rates]
    result = ctx.metadata("serve")
    result.update({
        "workload": {"input_len": input_len, "output_len": output_len, "concurrency": levels, "request_rate": rates,
                     "warmup_requests": warmup_requests, "seed": seed, "greedy": True, "ignore_eos": True,
                     "endpoint": "/v1/completions, stream=true, token-id prompts"},
        "server": server,
        "stream_interval": stream_interval,
        "engine_process": engine_process,
        "client_processes": {c: _client_processes(c, client_processes) for c in levels},
        # a checkpoint without a tokenizer (the random qwen3.5-0.8b) streams token ids only: no detokenization on
        # either side
        "tokenizer": llm.tokenizer is not None,
        "cells": cells,
        "bound": {"formula": "output tok/s <= workload_decode_bound(cell's requests, min(c, requests) in flight)"},
        "fraction_of_bound": {},
    })
    for i, cell in enumerate(cells):
        cell["prompts_seed"] = seed * 7919 + i
        c, n = cell["concurrency"], cell["requests"]
        prompts = random_prompts(cell["prompts_seed"], n, input_len, vocab)
        cell["offline"] = _summary(offline_loop(ctx, llm.engine, prompts, output_len, c, tag=f"serve-offline-{i}"))
        bound = workload_decode_bound(mb, bw, [input_len] * n, [output_len] * n, min(c, n))
        cell["bound_output_tok_s"] = bound["output_tok_s"]
    ctx.write("serve", result)

    flags = ["--stream-interval", str(stream_interval)]
    if server == "process":
        flags.append("--engine-process" if engine_process else "--no-engine-process")
    with _server(ctx, server, url, startup_timeout_s, stream_interval, flags) as base:
        if warmup_requests:
            warm = random_prompts(seed + 1_000_003, warmup_requests, input_len, vocab)
            asyncio.run(load(base, warm, min(8, output_len), max(1, min(levels[0], warmup_requests)), math.inf, 0))
        for cell in cells:
            try:
                prompts = random_prompts(cell["prompts_seed"], cell["requests"], input_len, vocab)
                before = server_latency_sums(base)
                records, duration = run_load(base, prompts, output_len, cell["concurrency"], cell["request_rate"],
                                             seed, _client_processes(cell["concurrency"], client_processes))
                cell["http"] = metrics(records, duration, output_len)
                cell["server_side"] = server_means(before, server_latency_sums(base))
                ours, offline = cell["http"]["output_throughput"], cell["offline"]["output_tok_s"]
                cell["output_tok_s_ratio"] = ours / offline if offline else None
                cell["overhead"] = 1 - cell["output_tok_s_ratio"] if offline else None
                cell["fraction_of_bound"] = ours / cell["bound_output_tok_s"]
                key = f"c{cell['concurrency']}@{cell['request_rate']}"
                result["fraction_of_bound"][key] = cell["fraction_of_bound"]
                print(f"[bench] serve c={cell['concurrency']} rate={cell['request_rate']}: "
                      f"{ours:,.0f} output tok/s over HTTP vs {offline:,.0f} offline "
                      f"(overhead {100 * cell['overhead']:.1f}%)", file=sys.stderr, flush=True)
            except Exception as e:  # one cell failing must not lose the others
                cell["error"] = f"{type(e).__name__}: {e}"[:500]
                cell["traceback"] = traceback.format_exc()
            ctx.write("serve", result)
    return result


# --------------------------------------------------------------------------------------------------------------
# The load generator
# --------------------------------------------------------------------------------------------------------------


def _client_processes(concurrency: int, requested: int | None) -> int:
    """The load generator's processes for a concurrency: ``requested``, else one per 16 streams (at most 8). One
    Python client process handles ~14,000 SSE events a second (bench/NOTES.md, "Serving overhead"), fewer than
    the 0.8B engine streams at c = 64 (~20,000 tokens/s): a single client would measure itself."""
    n = requested if requested is not None else min(8, max(1, concurrency // 16))
    if n < 1:
        raise ValueError(f"client_processes must be >= 1, got {n}")
    return min(n, concurrency)


def run_load(base: str, prompts: list[list[int]], output_len: int, concurrency: int, request_rate: float,
             seed: int, processes: int = 1) -> tuple[list[dict], float]:
    """``load`` over ``processes`` client processes: process ``i`` sends prompts ``i::processes`` with its share of
    the concurrency (their sum is ``concurrency``) and ``request_rate / processes`` (independent Poisson arrivals
    add up to one at ``request_rate``); all start together, after a barrier. Records as ``load``'s (perf_counter is
    the system's monotonic clock, the same in every process); the duration runs from the first start to the last
    completion; ``client_cpu_s`` per process."""
    if processes == 1:
        return asyncio.run(load(base, prompts, output_len, concurrency, request_rate, seed))
    import multiprocessing

    mp = multiprocessing.get_context("spawn")  # the bench process holds CUDA: no fork
    barrier, results = mp.Barrier(processes), mp.Queue()
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    workers = [mp.Process(target=_load_process, daemon=True,
                          args=(results, barrier, base, prompts[i::processes], output_len, shares[i],
                                request_rate / processes, seed + i))
               for i in range(processes)]
    for w in workers:
        w.start()
    try:
        parts = [results.get() for _ in workers]  # before join: a full pipe would block the child's exit
    finally:
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.kill()
    failed = [p for p in parts if isinstance(p, str)]
    if failed:
        raise RuntimeError(f"a client process failed: {failed[0]}")
    records = [r for part_records, _, _ in parts for r in part_records]
    duration = max(end for _, _, end in parts) - min(start for _, start, _ in parts)
    return records, duration


def _load_process(results, barrier, *args) -> None:
    """One client process of ``run_load``: its records, start and end, or its traceback."""
    try:
        records, started = asyncio.run(load(*args, ready=barrier.wait, started=True))
        results.put((records, started, time.perf_counter()))
    except BaseException:  # noqa: B036 (reported to the parent, which raises)
        results.put(traceback.format_exc())


async def load(base: str, prompts: list[list[int]], output_len: int, concurrency: int, request_rate: float,
               seed: int, ready: Callable[[], object] | None = None, started: bool = False):
    """Send every prompt as a streaming completion (Poisson arrivals at ``request_rate``, at most ``concurrency`` in
    flight); per request: its send time, each chunk's arrival time and token count, its end. Returns them and the
    duration (first send to last completion), or with ``started`` the perf_counter time of the first send instead.
    ``ready``: called (blocking) once the client is built, right before the first send."""
    import httpx

    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency)
    records: list[dict] = []
    timeout = httpx.Timeout(None)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:

        async def one(prompt: list[int]) -> None:
            async with limit:
                body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
                        "ignore_eos": True, "stream": True, "return_token_ids": True}
                record = {"prompt_tokens": len(prompt), "chunks": [], "error": None}
                record["sent"] = time.perf_counter()
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as response:
                        if response.status_code != 200:
                            record["error"] = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                        else:
                            pending = b""
                            async for data in response.aiter_raw():
                                now = time.perf_counter()
                                *events, pending = (pending + data).split(b"\n\n")
                                for event in events:
                                    tokens = _event_tokens(event, record)
                                    if tokens:
                                        record["chunks"].append((now, tokens))
                except httpx.HTTPError as e:
                    record["error"] = f"{type(e).__name__}: {e}"
                record["end"] = time.perf_counter()
                records.append(record)

        if ready is not None:
            ready()
        tasks = []
        cpu = time.process_time()
        start = time.perf_counter()
        for prompt in prompts:
            tasks.append(asyncio.create_task(one(prompt)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        records.append({"client_cpu_s": time.process_time() - cpu})
        return records, (start if started else duration)


def _event_tokens(event: bytes, record: dict) -> int:
    """The number of token ids in one SSE event of the stream (an error event is recorded). The client must keep up
    with tens of thousands of events a second: the ids are counted in the bytes, no JSON is parsed but an error's."""
    if event.startswith(b'data: {"error"'):
        record["error"] = json.loads(event[6:])["error"]["message"]
        return 0
    found = TOKEN_IDS.search(event)
    if found is None:
        return 0
    ids = found.group(1).strip()
    return ids.count(b",") + 1 if ids else 0


def metrics(records: list[dict], duration: float, output_len: int) -> dict:
    """``vllm bench serve``'s metrics of the load's records (see the module docstring)."""
    client_cpu = max((r.pop("client_cpu_s") for r in records if "client_cpu_s" in r), default=0.0)
    records = [r for r in records if r]
    done = [r for r in records if r["error"] is None and r["chunks"]]
    ttft, tpot, itl, e2el = [], [], [], []
    for r in done:
        times = [t for t, _ in r["chunks"]]
        tokens = sum(n for _, n in r["chunks"])
        ttft.append(times[0] - r["sent"])
        e2el.append(times[-1] - r["sent"])
        if tokens > 1:
            tpot.append((times[-1] - times[0]) / (tokens - 1))
        itl += [b - a for a, b in zip(times, times[1:])]
    output = sum(n for r in done for _, n in r["chunks"])
    prompt = sum(r["prompt_tokens"] for r in done)
    out = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": sorted({str(r["error"])[:200] for r in records if r["error"] is not None})[:5],
        "short_outputs": sum(1 for r in done if sum(n for _, n in r["chunks"]) != output_len),
        "duration_s": duration,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
        # CPU time of the busiest client process over the duration: near 1 (one core), the client may be what
        # limits (in ``thread`` mode it includes the server and the engine)
        "client_cpu_fraction": client_cpu / duration,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        ms = [v * 1e3 for v in values]
        out[f"mean_{name}_ms"] = sum(ms) / len(ms) if ms else None
        out[f"median_{name}_ms"] = percentile(ms, 50)
        out[f"p99_{name}_ms"] = percentile(ms, 99)
    return out


def server_latency_sums(base: str) -> dict | None:
    """The server's own TTFT and TPOT histograms (``/metrics``: sums and counts), or None where it has none (a server
    of another kind behind ``url``). The server's TTFT runs from the handler's start to the first output it gets from
    the engine: the client's TTFT less the request's way in (HTTP, JSON, checks) and its first chunk's way out."""
    import httpx

    try:
        text = httpx.get(base + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    sums = {}
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds"):
        for part in ("sum", "count"):
            found = re.search(rf"^ce:{name}_{part} (\S+)$", text, re.MULTILINE)
            if found is None:
                return None
            sums[f"{name}_{part}"] = float(found.group(1))
    return sums


def server_means(before: dict | None, after: dict | None) -> dict | None:
    """Mean TTFT and TPOT (ms) the server measured over one cell (the histograms' growth between two scrapes)."""
    if before is None or after is None:
        return None
    out = {}
    for key, name in (("mean_ttft_ms", "time_to_first_token_seconds"), ("mean_tpot_ms", "time_per_output_token_seconds")):
        count = after[f"{name}_count"] - before[f"{name}_count"]
        out[key] = 1e3 * (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else None
    return out


def _summary(offline: dict) -> dict:
    keep = ("wall_s", "output_tokens", "prompt_tokens", "output_tok_s", "total_tok_s", "requests_per_s",
            "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    return {k: offline[k] for k in keep}


def _levels(concurrency) -> list[int]:
    levels = sorted({int(c) for c in (concurrency if isinstance(concurrency, (list, tuple)) else [concurrency])})
    if not levels or levels[0] < 1:
        raise ValueError(f"concurrency levels must be >= 1, got {levels}")
    return levels


# --------------------------------------------------------------------------------------------------------------
# The server under test
# --------------------------------------------------------------------------------------------------------------


class _server:
    """A context manager giving the base URL of the server under test (see the module docstring)."""

    def __init__(self, ctx: Context, kind: str, url: str | None, startup_timeout_s: float, stream_interval: int,
                 flags: list[str]):
        self.ctx, self.kind, self.url, self.timeout = ctx, kind, url, startup_timeout_s
        self.stream_interval, self.flags = stream_interval, flags
        self.proc = self.uvicorn = self.thread = self.log = None

    def __enter__(self) -> str:
        if self.kind == "url":
            return self.url.rstrip("/")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        if self.kind == "thread":
            import uvicorn

            from compiled_engine.async_llm import AsyncLLM
            from compiled_engine.server import OpenAIServer

            llm = self.ctx.llm()
            tokenizer = copy.deepcopy(llm.tokenizer)  # one per thread (compiled_engine.server.build_server)
            engine = AsyncLLM(llm.engine, stream_interval=self.stream_interval)
            app = OpenAIServer(engine, tokenizer, SERVED_NAME).app
            self.uvicorn = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
            self.thread.start()
        else:
            self.ctx.release_llm()  # the server process needs the device memory
            out = self.ctx.out_dir or Path(".")
            out.mkdir(parents=True, exist_ok=True)
            self.log = open(out / "serve_server.log", "w")
            env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            cmd = server_command(self.ctx, port) + self.flags
            self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=self.log,
                                         stderr=subprocess.STDOUT)
        self._wait(base)
        return base

    def _wait(self, base: str) -> None:
        import httpx

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the server process exited with {self.proc.returncode} (see serve_server.log)")
            if self.thread is not None and not self.thread.is_alive():
                raise RuntimeError("the server thread exited")
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer /health within {self.timeout} s")

    def __exit__(self, *exc) -> None:
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
            self.thread.join(timeout=60)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


def server_command(ctx: Context, port: int) -> list[str]:
    """``python -m compiled_engine serve`` with the shared engine's knobs."""
    kw = ctx.llm_kwargs()
    cmd = [sys.executable, "-m", "compiled_engine", "serve", ctx.model.path, "--port", str(port),
           "--served-model-name", SERVED_NAME, "--device", kw["device"],
           "--dtype", str(kw["dtype"]).removeprefix("torch."), "--max-model-len", str(kw["max_model_len"]),
           "--max-num-seqs", str(kw["max_num_seqs"]), "--log-level", "warning"]
    if kw.get("max_num_batched_tokens"):
        cmd += ["--max-num-batched-tokens", str(kw["max_num_batched_tokens"])]
    if kw.get("num_kv_blocks"):
        cmd += ["--num-kv-blocks", str(kw["num_kv_blocks"])]
    if kw.get("enable_prefix_caching"):
        cmd.append("--enable-prefix-caching")
    if not kw["overlap_decode"]:
        cmd.append("--no-overlap-decode")
    if kw["enforce_eager"]:
        cmd.append("--enforce-eager")
    if kw.get("tensor_parallel_size", 1) != 1:
        cmd += ["--tensor-parallel-size", str(kw["tensor_parallel_size"])]
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary_lines(head: str, r: dict) -> list[str]:
    w = r["workload"]
    lines = [f"{head} {w['input_len']} in / {w['output_len']} out over HTTP ({r['server']}), vllm bench serve metrics "
             f"(p50/p99 ms)"]
    for cell in r["cells"]:
        label = f"c={cell['concurrency']} rate={cell['request_rate']}"
        if "http" not in cell:
            lines.append(f"{'':<11} {label}: ERROR: {cell.get('error', 'not run')[:200]}")
            continue
        h = cell["http"]
        lines.append(
            f"{'':<11} {label}: TTFT {h['median_ttft_ms']:.1f}/{h['p99_ttft_ms']:.1f} | TPOT "
            f"{h['median_tpot_ms']:.2f}/{h['p99_tpot_ms']:.2f} | ITL {h['median_itl_ms']:.2f}/{h['p99_itl_ms']:.2f} | "
            f"E2EL {h['median_e2el_ms']:.0f}/{h['p99_e2el_ms']:.0f} | {h['output_throughput']:,.0f} output tok/s, "
            f"{h['request_throughput']:.2f} req/s | offline {cell['offline']['output_tok_s']:,.0f} tok/s: overhead "
            f"{100 * cell['overhead']:.1f}% | {h['failed']} failed")
        side = cell.get("server_side")
        if side and side["mean_ttft_ms"] is not None:
            lines.append(f"{'':<11} {'':<{len(label)}}  mean TTFT {h['mean_ttft_ms']:.1f} ms at the client, "
                         f"{side['mean_ttft_ms']:.1f} ms in the server (handler start to the engine's first output)")
    return lines

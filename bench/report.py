"""Summaries of result JSONs: the table printed after every run, and ``python -m bench report`` which merges result
folders into one ``results.json`` (+ ``summary.txt`` and the PNGs) -- what bench/run_h200.sh hands back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.common import write_json
from bench.latency import critical_path_lines


def _f(value, spec: str = ".1f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:{spec}}{suffix}"


def summary_lines(results: dict[str, dict]) -> list[str]:
    """A few lines per scenario: the headline number, its bound, the fraction, and the HF ratio."""
    lines = []
    for key, r in results.items():
        try:
            lines += _scenario_lines(key, r)
        except (KeyError, TypeError, ValueError) as e:  # a partial result (a stage cut short): say so, go on
            lines.append(f"{key:<11} (incomplete result, no summary: {type(e).__name__} {e})")
    return lines


CRITICAL_PATH_ROWS = 16  # kernels of the latency critical path printed in the summary


def _scenario_lines(key: str, r: dict) -> list[str]:
    lines = []
    if "error" in r:
        return [f"{key:<11} ERROR: {r['error'][:200]}"]
    scenario = r.get("scenario", key)
    head = f"{key:<11}"
    if scenario == "latency":
        o, hf = r["ours"], r.get("hf") or {}
        lines.append(
            f"{head} batch 1: {_f(o['decode_tok_s'])} tok/s, {_f(o['ms_per_step']['p50'], '.3f')} ms/step (p50), "
            f"TTFT {_f(o['ttft_ms'], '.1f')} ms | bound {_f(r['bound']['tok_s'])} tok/s | "
            f"{_f(100 * r['fraction_of_bound'], '.1f')}% of bound, {_f(o['achieved_bandwidth_GBps'])} GB/s | "
            f"runtime-only {_f(r['runtime_only']['decode_tok_s'])} tok/s"
            + (f" | graph replay {_f(r['graph_replay']['ms_per_step'], '.3f')} ms/step GPU, host "
               f"{_f(r['graph_replay']['host_ms_per_replay'], '.3f')} ms/replay" if r.get("graph_replay") else "")
            + (f" | HF {_f(hf.get('decode_tok_s'))} tok/s, ours/HF {_f(r['ratio_vs_hf']['decode_tok_s'], '.1f')}x"
               if hf else "")
        )
        gap = r.get("engine_between_graphs") or {}
        if "gap_us" in gap:
            ops = ", ".join(f"{name} {v['per_step']:.1f}x {v['us_median']:.1f} µs" for name, v in gap["ops_in_gap"].items())
            lines.append(f"{'':<11} engine, between two decode graphs: {_f(gap['gap_us']['p50'], '.1f')} µs (p50) "
                         f"over {gap['steps']} steps; in it: {ops or 'nothing'}")
        lines += critical_path_lines((r.get("graph_replay") or {}).get("critical_path"),
                                     "critical path of the batch-1 graph", CRITICAL_PATH_ROWS)
    elif scenario == "sweep":
        # One block per context; a result from before the sweep had several contexts has one, in bound.context.
        contexts = sorted({row.get("context", r["bound"].get("context")) for row in r["rows"]})
        for index, context in enumerate(contexts):
            lines.append(f"{head if index == 0 else '':<11} context {_f(context, '.0f'):>5}: batch     tok/s     bound"
                         f"  %bound" + ("     HF tok/s  ours/HF" if "hf" in r else ""))
            for row in r["rows"]:
                if row.get("context", r["bound"].get("context")) != context:
                    continue
                line = (f"{'':<11} {'':<14} {row['batch']:>5} {_f(row['decode_tok_s'], '.0f'):>9} "
                        f"{_f(row['bound_tok_s'], '.0f'):>9} {_f(100 * row['fraction_of_bound'], '.1f'):>6}%")
                if "hf_decode_tok_s" in row:
                    line += f" {_f(row['hf_decode_tok_s'], '.0f'):>10} {_f(row['ratio_vs_hf'], '.1f'):>7}x"
                lines.append(line)
        skipped: dict[tuple, list[int]] = {}  # (prompt_len, reason) -> batches
        for cell in r.get("skipped", []):
            skipped.setdefault((cell["prompt_len"], cell["reason"]), []).append(cell["batch"])
        for (prompt_len, reason), batches in skipped.items():
            lines.append(f"{'':<11} skipped: prompt {prompt_len}, batch {','.join(map(str, batches))}: {reason}")
    elif scenario == "throughput":
        o = r["ours"]
        lines.append(
            f"{head} {o['requests']} req: {_f(o['output_tok_s'], '.0f')} output tok/s in {_f(o['wall_s'], '.1f')} s"
            f" | TTFT p50/p99 {_f(o['ttft_ms']['p50'], '.0f')}/{_f(o['ttft_ms']['p99'], '.0f')} ms"
            f" | TPOT p50/p99 {_f(o['tpot_ms']['p50'], '.1f')}/{_f(o['tpot_ms']['p99'], '.1f')} ms"
            f" | bound {_f(r['bound']['output_tok_s'], '.0f')} tok/s, {_f(100 * r['fraction_of_bound'], '.1f')}%"
        )
        if "hf" in r:
            hf, rat = r["hf"], r["ratio_vs_hf"]
            lines.append(
                f"{'':<11} HF on {hf['requests_run']} req: {_f(hf['useful_output_tok_s'], '.0f')} useful tok/s"
                f"{' (TRUNCATED)' if hf['truncated'] else ''} | ours "
                f"{_f((r['ours_on_hf_subset'] or {}).get('output_tok_s'), '.0f')} tok/s on the same requests | "
                f"ours/HF: {_f(rat['same_requests'], '.1f')}x same requests, "
                f"{_f(rat['full_workload_vs_hf_subset'], '.1f')}x full workload vs HF subset"
            )
    elif scenario == "prefix":
        off, on = r["off"], r["on"]
        if on.get("available"):
            on_text = (f"on {_f(on['output_tok_s'], '.0f')} tok/s ({_f(on['wall_s'], '.1f')} s), "
                       f"speed-up {_f(r['speedup_on_vs_off'], '.2f')}x")
        else:
            on_text = on.get("note", "n/a")
        off_text = f"off {_f(off['output_tok_s'], '.0f')} tok/s ({_f(off['wall_s'], '.1f')} s)"
        lines.append(f"{head} {off_text} | {on_text}")
    elif scenario == "startup":
        parts = []
        for phase in ("cold", "warm"):
            p = r[phase]
            if "error" in p:
                parts.append(f"{phase}: ERROR {p['error']}")
            else:
                parts.append(
                    f"{phase}: first token at {_f(p['to_first_token_s'], '.1f')} s (load {_f(p['load_s'], '.1f')}"
                    f" of which memory plan {_f(p.get('memory_plan_s'), '.1f')}, compile+capture "
                    f"{_f(p['compile_capture_s'], '.1f')}, prompt captures {_f(p.get('capture_prefill_s'), '.1f')}, "
                    f"sampler {_f(p.get('warm_up_sampling_s'), '.1f')}, autotuning {_f(p.get('autotune_s'), '.1f')}, "
                    f"first generate {_f(p['first_generate_s'], '.2f')} s)"
                )
        lines.append(f"{head} " + " | ".join(parts))
    elif scenario == "step_profile":
        from bench.step_profile import summary_lines as profile_lines

        lines += profile_lines(head, r)
    elif scenario == "cookbook":
        from bench.cookbook import summary_lines as cookbook_lines

        lines += cookbook_lines(head, r)
    elif scenario == "sampling":
        from bench.sampling import summary_lines as sampling_lines

        lines += sampling_lines(head, r)
    elif scenario == "serve":
        from bench.serve import summary_lines as serve_lines

        lines += serve_lines(head, r)
    elif scenario == "snapshot_methods":
        from bench.snapshot_methods import summary_lines as snapshot_lines

        lines += snapshot_lines(head, r)
    elif scenario == "spec":
        from bench.spec import summary_lines as spec_lines

        lines += spec_lines(head, r)
    else:
        lines.append(f"{head} (no summary for {scenario!r})")
    if "hf_error" in r:
        lines.append(f"{'':<11} HF comparison failed: {r['hf_error'][:200]}")
    return lines


def header(results: dict[str, dict]) -> list[str]:
    first = next((r for r in results.values() if "device" in r), None)
    if first is None:
        return []
    m = first["model"]
    engine = next((r["engine"] for r in results.values() if r.get("engine")), None)
    mode = "-" if engine is None else "eager" if engine["enforce_eager"] else f"compiled ({engine.get('decode_fn')})"
    return [
        f"device {first['device']['name']} | torch {first['versions']['torch']} | transformers "
        f"{first['versions']['transformers']} | model {m['name']} ({m['params'] / 1e6:.0f}M params, weights read per "
        f"batch-1 step {m.get('weight_bytes_at_batch_1', m['weight_bytes']) / 1e9:.3f} GB) | {first['dtype']} | copy bandwidth "
        f"{first['copy_bandwidth']['GBps']:.0f} GB/s | engine {mode} | git {str(first['git'].get('commit'))[:10]}"
        f"{' (dirty)' if first['git'].get('dirty') else ''}"
    ]


def collect(dirs: list[str]) -> dict[str, dict]:
    """Scenario JSONs (``<scenario>.json`` with a ``scenario`` key) of the given folders, one level deep."""
    results: dict[str, dict] = {}
    for d in dirs:
        for path in sorted(Path(d).glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if not isinstance(data, dict) or "scenario" not in data:
                continue
            key = data["scenario"] if data["scenario"] not in results else f"{data['scenario']}@{Path(d).name}"
            results[key] = data
    return results


def report(dirs: list[str], out: str) -> int:
    results = collect(dirs)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = header(results) + summary_lines(results)
    write_json(out_dir / "results.json", {"results": results, "sources": [str(d) for d in dirs], "summary": lines})
    (out_dir / "summary.txt").write_text("\n".join(lines) + "\n")
    for d in dirs:
        for png in Path(d).glob("*.png"):
            if png.resolve().parent != out_dir.resolve():
                shutil.copy(png, out_dir / png.name)
    print("\n".join(lines))
    return 0 if results else 1

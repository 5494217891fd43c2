# Sourced by the scripts a device call runs (bench/gpu_session.sh, a run folder's call.sh): the wheels in .whl
# installed into /tmp/site (carry .whl; without them the source returns 1), PYTHONPATH and the compile caches' folders
# under /tmp, the caches of an earlier call restored from .cecache (carry it), and `step` for a call script of a few
# commands:
#
#     RUN=run145 source bench/device_env.sh
#     TAIL=20 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "..."
#
# `step NAME LIMIT CMD...` runs CMD under `timeout --signal=INT LIMIT`, its output in $W/NAME.log, prints its exit
# status, the seconds since the start and the log's last $TAIL lines (40), then tars $W into $OUT/$RUN.tgz, so that a
# call taken back mid-run still returns every step before. `export_caches` (last) puts the compile caches under
# $OUT/cache, to be copied into .cecache here.
T0=$(date +%s)
if ! python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; then
    echo "the wheels in .whl did not install: carry .whl, made here by"
    echo "  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\"
    echo "    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl fla-core einops"
    echo "  (add fastapi uvicorn uvloop httptools prometheus-client httpx pytest-xdist execnet for the server's runs)"
    return 1
fi
export PYTHONPATH=$PWD:/tmp/site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
if ls .cecache/compile-cache.tgz.* >/dev/null 2>&1; then
    cat .cecache/compile-cache.tgz.* | tar xzf - -C /tmp && echo "compile caches restored: $(du -sh /tmp/ce_triton /tmp/ce_inductor | tr '\n' ' ')"
fi
if [ -n "${RUN:-}" ]; then
    W=/tmp/$RUN
    mkdir -p "$W"
fi

step() {
    local name=$1 limit=$2
    shift 2
    timeout --signal=INT "$limit" "$@" >"$W/$name.log" 2>&1
    echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"
    grep -vE "Warn|warn|loading weights" "$W/$name.log" | tail -"${TAIL:-40}"
    tar czf "$OUT/${W##*/}.tgz" -C "$W" .
}

export_caches() {  # at most 3 parts of 15 MiB (the device tool returns 8 files, 16 MiB each)
    prune_triton_cache /tmp/ce_triton
    mkdir -p "$OUT/cache" && tar czf - -C /tmp ce_triton ce_inductor | split -b 15m - "$OUT/cache/compile-cache.tgz."
}

# A cached Triton kernel loads from its binary and metadata; its intermediate forms (source, TTIR, TTGIR, LLVM IR) are
# kept only for reading, and are most of the cache's bytes: dropped here, with the group files that list them. PTX
# stays (a GPU test reads a kernel's PTX).
prune_triton_cache() {
    python3 - "$1" <<'PY'
import json, pathlib, sys
for group in pathlib.Path(sys.argv[1]).glob("*/__grp__*.json"):
    children = json.loads(group.read_text())["child_paths"]
    for name in [n for n in children if n.rsplit(".", 1)[-1] in ("source", "ttir", "ttgir", "llir")]:
        pathlib.Path(children.pop(name)).unlink(missing_ok=True)
    group.write_text(json.dumps({"child_paths": children}))
PY
}

"""Kernel options: the process-wide switches between kernels, launch flags and graph capture, in one frozen object.

    from ops.options import KernelOptions, current_options, set_options, use_options

    current_options()                          # KernelOptions.from_env() the first time it is asked, then as set
    set_options(KernelOptions(pdl=False))      # for the rest of the process (returns the options it replaced)
    with use_options(l2_prefetch=False):       # for a block: current_options() with these fields changed
        ...

Each field has an environment variable, read once by :meth:`KernelOptions.from_env` (the first call of
:func:`current_options`, unless :func:`set_options` came first); nothing else in the library reads them:

  field         variable         values                          default
  pdl           CE_PDL           1 / 0 (also on, off, true, ...)  on: programmatic dependent launch of the decode
                                                                  kernels where the GPU has it (ops/triton/pdl.py)
  l2_prefetch   CE_L2_PREFETCH   whole / 0 (or any of the above)  on: the skinny GEMM prefetches its weight into L2
                                                                  before its PDL wait (ops/triton/l2_prefetch.py)
  skinny_gemm   CE_SKINNY_GEMM   1 / 0                            on: 1-2-row bf16/fp16 matmuls run our Triton skinny
                                                                  GEMM (ops/linear.py); off sends them to cuBLAS
  cuda_graphs   CE_CUDA_GRAPHS   runner / trees                   runner: who captures and replays the decode graphs
                                                                  (graphs/decode_graph.py)

When a change takes effect: ``pdl``, ``l2_prefetch`` and ``skinny_gemm`` are read each time a kernel is launched (and
the launch flags select the compiled variant), ``cuda_graphs`` when a ``DecodeGraphRunner`` is built. A CUDA graph
keeps the launches it recorded, so change options before compiling and capturing the decode graphs: a graph captured
earlier goes on replaying the old choice. The value is per process: tensor-parallel worker processes read their own
environment, so set the variables there (before starting) rather than calling :func:`set_options`.

This module imports nothing from ops: op modules, kernel modules (ops/triton) and graphs all read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, Mapping

CUDA_GRAPH_CAPTURES = ("runner", "trees")  # KernelOptions.cuda_graphs: graphs/decode_graph.py describes each

_TRUE = ("1", "on", "true", "yes")
_FALSE = ("0", "off", "false", "no")


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Which kernels and launch flags the ops use, and who captures the decode graphs (module docstring)."""

    pdl: bool = True  # CE_PDL
    l2_prefetch: bool = True  # CE_L2_PREFETCH
    skinny_gemm: bool = True  # CE_SKINNY_GEMM
    cuda_graphs: str = "runner"  # CE_CUDA_GRAPHS: one of CUDA_GRAPH_CAPTURES

    def __post_init__(self):
        for field in ("pdl", "l2_prefetch", "skinny_gemm"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"KernelOptions.{field} must be a bool, got {getattr(self, field)!r}")
        if self.cuda_graphs not in CUDA_GRAPH_CAPTURES:
            raise ValueError(f"KernelOptions.cuda_graphs must be one of {CUDA_GRAPH_CAPTURES}, "
                             f"got {self.cuda_graphs!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelOptions:
        """The options ``environ`` (default: ``os.environ``) asks for: the defaults, changed by the variables that are
        set and not empty. A value outside a variable's list raises ``ValueError`` naming the variable."""
        env = os.environ if environ is None else environ
        default = cls()
        return cls(
            pdl=_flag(env, "CE_PDL", default.pdl),
            l2_prefetch=_flag(env, "CE_L2_PREFETCH", default.l2_prefetch, on=("whole",)),
            skinny_gemm=_flag(env, "CE_SKINNY_GEMM", default.skinny_gemm),
            cuda_graphs=_choice(env, "CE_CUDA_GRAPHS", default.cuda_graphs, CUDA_GRAPH_CAPTURES),
        )


def _flag(env: Mapping[str, str], name: str, default: bool, on: tuple[str, ...] = ()) -> bool:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text in _TRUE + on:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be one of {', '.join(on + _TRUE + _FALSE)}, got {env[name]!r}")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {env[name]!r}")
    return text


_current: KernelOptions | None = None  # None until first asked for: then from the environment


def current_options() -> KernelOptions:
    """The options in force in this process (read from the environment on the first call, unless set before)."""
    global _current
    if _current is None:
        _current = KernelOptions.from_env()
    return _current


def set_options(options: KernelOptions) -> KernelOptions:
    """Make ``options`` the process's options; returns the ones they replace. Launches from now on use them; graphs
    already captured keep what they recorded (module docstring)."""
    if not isinstance(options, KernelOptions):
        raise TypeError(f"set_options takes a KernelOptions, got {type(options).__name__}")
    global _current
    previous = current_options()
    _current = options
    return previous


@contextlib.contextmanager
def use_options(options: KernelOptions | None = None, /, **changes) -> Iterator[KernelOptions]:
    """Within the block, ``options`` (default: the current ones) with ``changes`` (field=value) are the process's
    options; the previous ones come back on exit, also on an exception."""
    chosen = dataclasses.replace(options if options is not None else current_options(), **changes)
    previous = set_options(chosen)
    try:
        yield chosen
    finally:
        set_options(previous)

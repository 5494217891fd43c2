"""Triton's interpreter (``TRITON_INTERPRET=1``) without its repeated language patching: for the interpreter children
of tests/test_sampling_interpreter.py, test_kernels_interpreter.py, test_moe_ops.py and test_gated_deltanet_verify.py.

The interpreter replaces ``triton.language``'s builtins with NumPy-backed ones for each kernel launch, and restores them
when the launch ends. It does the same again at every call of a ``@triton.jit`` helper from inside a kernel
(``InterpretedFunction.__call__`` calls ``_patch_lang``, and drops the scope it returns): each such call walks the
language modules with ``inspect.getmembers``, ~0.3-1 ms, to re-install what the launch already installed. Our kernels
call helpers inside their loops: ``ce::sample``'s row-path checks make ~100,000 such calls, about a third of the child's
time (cProfile). ``install()`` skips the repeat where the helper's module sees no language module the launch has not
patched; any other call patches as before. It also remembers the NumPy dtype of each Triton type: the interpreter
builds its table of them anew at every op (``_get_np_dtype``, ~8 µs a call; ~540,000 calls in the kernels' child).
Nothing else of the interpreter changes, so what a kernel computes does not: the children's checks against their
references are the same checks.

Where the interpreter's internals differ from these names (another Triton), ``install()`` changes nothing and returns
False.
"""

from __future__ import annotations

import functools
import inspect


def install() -> bool:
    try:
        import triton.language as tl
        from triton.runtime import interpreter
        launch, patch_lang, scope_type = interpreter.GridExecutor.__call__, interpreter._patch_lang, \
            interpreter._LangPatchScope
        np_dtype = interpreter._get_np_dtype
    except (ImportError, AttributeError):
        return False
    patched = None  # the language modules the running launch has patched; None outside a launch

    @functools.cache
    def languages(fn) -> frozenset:  # the language modules a function's globals see (its module's imports)
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def guarded_launch(self, *args, **kwargs):
        nonlocal patched
        patched = frozenset()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched = None

    def guarded_patch_lang(fn):
        nonlocal patched
        wanted = languages(fn)
        if patched and wanted <= patched:
            return scope_type()  # the launch's own patches stand until it restores them
        scope = patch_lang(fn)
        if patched is not None:
            patched |= wanted
        return scope

    @functools.cache
    def scalar_np_dtype(scalar):  # scalar types hash by name; block and pointer types do not hash
        return np_dtype(scalar)

    def cached_np_dtype(tt_dtype):  # a block maps as its element; a pointer returns before the table is built
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        return np_dtype(scalar) if isinstance(scalar, tl.pointer_type) else scalar_np_dtype(scalar)

    interpreter.GridExecutor.__call__ = guarded_launch
    interpreter._patch_lang = guarded_patch_lang
    interpreter._get_np_dtype = cached_np_dtype
    return True

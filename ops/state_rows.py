"""``ce::copy_state_rows``: copy rows of a linear layer's two state tensors (conv and recurrent) into rows of two
others, as one op that declares what it writes, so that a compiled graph keeps the copy (speculative decoding's
verify history: compiled_engine/gated_deltanet.py).

``copy_state_rows(conv_dst [R, ...], recurrent_dst [R', ...], dst_rows [N], conv_src [S, ...], recurrent_src
[S', ...], src_rows [N])``: ``conv_dst[dst_rows[i]] = conv_src[src_rows[i]]`` and the same for the recurrent
tensors, for every i (rows as int32 or int64; destination rows distinct, except null rows whose content nobody
reads). Sources and destinations are different tensors. The reference serves CUDA too: an index_select and an
index_copy per tensor.
"""

from __future__ import annotations

import torch

from ops.library import define_op


def copy_state_rows_reference(
    conv_dst: torch.Tensor,
    recurrent_dst: torch.Tensor,
    dst_rows: torch.Tensor,
    conv_src: torch.Tensor,
    recurrent_src: torch.Tensor,
    src_rows: torch.Tensor,
) -> None:
    dst, src = dst_rows.long(), src_rows.long()
    conv_dst.index_copy_(0, dst, conv_src.index_select(0, src).to(conv_dst.dtype))
    recurrent_dst.index_copy_(0, dst, recurrent_src.index_select(0, src).to(recurrent_dst.dtype))


def _copy_state_rows_fake(conv_dst, recurrent_dst, dst_rows, conv_src, recurrent_src, src_rows) -> None:
    return None


copy_state_rows = define_op(
    "copy_state_rows(Tensor(a!) conv_dst, Tensor(b!) recurrent_dst, Tensor dst_rows, Tensor conv_src, "
    "Tensor recurrent_src, Tensor src_rows) -> ()",
    reference=copy_state_rows_reference,
    fake=_copy_state_rows_fake,
)

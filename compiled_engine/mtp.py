"""The multi-token-prediction (MTP) layer of Qwen3.5 / Qwen3-Next checkpoints (their ``mtp.*`` tensors): the draft
model of speculative decoding (compiled_engine/speculative.py).

For the target's hidden state ``h_p`` at position ``p`` (after the target's final norm: what vLLM's
qwen3_next_mtp.py / qwen3_5_mtp.py are handed, the output of the target's forward) and the embedding of the token
at ``p + 1``:

    x = fc(cat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(h)))      # [2H] -> [H], no bias
    x = decoder_layer(x)                                                           # mtp.layers.0: full attention
    out = norm(x)                                                                  # mtp.norm

``compute_logits(out)`` (the target's lm_head) predicts the token at ``p + 2``, and ``out`` is the hidden input of
the next draft step. The norms are the zero-centred RMSNorm of the rest of the model; the embedding and lm_head are
the target's (HybridModel.mtp_forward passes the embedding in). The layer attends over its own paged KV cache
(its attention's ``k_cache``/``v_cache``), indexed by the target's block tables: the entry at position ``p`` is
computed from ``(h_p, token_{p+1})``.
"""

from __future__ import annotations

import torch
from torch import nn

from compiled_engine.config import FULL_ATTENTION, ModelConfig
from compiled_engine.distributed import SINGLE, TensorParallel
from compiled_engine.layers import RMSNorm, empty_parameter
from ops.linear import linear
from ops.step import StepInputs


class MTPLayer(nn.Module):
    """Parameter names follow the checkpoint's ``mtp.*`` tensors (the loader maps them as the target's layers). With
    tensor parallelism its decoder layer is sharded as the target's are (``fc`` and the norms are whole on every
    rank: each rank computes the same ``x``)."""

    def __init__(self, config: ModelConfig, decoder_layer: type[nn.Module], attention_backend: str = "triton",
                 tp: TensorParallel = SINGLE):
        super().__init__()
        h = config.hidden_size
        self.fc = empty_parameter(h, 2 * h)
        self.pre_fc_norm_embedding = RMSNorm(h, config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(h, config.rms_norm_eps)
        # Its MLP is sparse exactly when the target's layer 0 is (vLLM builds it as a decoder layer of index 0):
        # the MoE checkpoints' MTP layers carry experts.
        self.layers = nn.ModuleList(
            [decoder_layer(config, FULL_ATTENTION, tp, attention_backend, sparse=0 in config.moe_layers)]
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """``embedded``: the embeddings of the tokens after the hidden states' positions ``[T, H]``; ``hidden``: the
        target's (or the previous draft step's) hidden states ``[T, H]``; ``step``: positions, KV slots and block
        tables of the T rows. Returns ``[T, H]`` after mtp.norm."""
        x = torch.cat([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x, residual = self.layers[0](linear(x, self.fc), None, step)
        return self.norm.add_and_norm(x, residual)[1]

    @property
    def attention(self) -> nn.Module:
        return self.layers[0].self_attn

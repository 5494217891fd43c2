"""The hybrid decoder: embedding, N pre-norm decoder layers (Gated DeltaNet or full attention), final norm, lm_head.

``forward(step)`` maps a StepInputs to hidden states of the new tokens; ``compute_logits`` projects the rows the
caller asks for to fp32 logits (prefill), ``decode_output`` a decode step's rows to logits in the model's dtype and
each row's greedy token (what the compiled decode graph returns). The layer mixers own their caches as buffers (see
compiled_engine/cache.py), so one forward mutates exactly: every attention layer's ``k_cache``/``v_cache``, and every
linear layer's ``conv_state``/``recurrent_state``. With ``mtp=True`` the model also holds the checkpoint's
multi-token-prediction layer (``self.mtp``, compiled_engine/mtp.py), run by ``mtp_forward``; a verify step
(``step.speculative``) leaves the linear layers' state pools as they are and keeps what each position adds apart
until ``commit_verify``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compiled_engine.attention import FullAttention
from compiled_engine.config import LINEAR_ATTENTION, ModelConfig
from compiled_engine.distributed import SINGLE, TensorParallel
from compiled_engine.gated_deltanet import GatedDeltaNet, commit_verify
from compiled_engine.layers import MLP, RMSNorm, empty_parameter
from compiled_engine.moe import SparseMoE
from compiled_engine.mtp import MTPLayer
from ops.step import DecodeOutput, StepInputs
from ops.argmax import argmax_op
from ops.linear import linear


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_type: str, tp: TensorParallel, attention_backend: str, sparse: bool = False
    ):
        super().__init__()
        self.layer_type = layer_type
        self.sparse = sparse  # the MLP is the sparse MoE block (compiled_engine/moe.py)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if layer_type == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(config, tp)
        else:
            self.self_attn = FullAttention(config, tp, attention_backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoE(config, tp) if sparse else MLP(config.hidden_size, config.intermediate_size, tp)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.layer_type == LINEAR_ATTENTION else self.self_attn

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, step: StepInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm residual layer, written with the residual stream carried apart (vLLM's form): ``hidden`` is the
        previous layer's MLP output, not yet added to ``residual`` (at the first layer: the embedding, and residual
        is None). Each residual add, the norm after it and the projection after that are one op
        (ce::add_rms_norm_linear: one kernel at decode batch 1; before the MLP with its activation,
        ce::add_rms_norm_linear_silu_mul). Returns this layer's MLP output and the
        residual stream before it is added. A sparse MoE block's experts read the normed rows themselves, so there
        the norm is ce::add_rms_norm and the block makes its own projections."""
        if residual is None:
            residual, projected = hidden, linear(self.input_layernorm(hidden), self.mixer.input_weight)
        else:
            projected, residual = self.input_layernorm.add_norm_linear(hidden, residual, self.mixer.input_weight)
        if self.sparse:
            residual, normed = self.post_attention_layernorm.add_and_norm(self.mixer(projected, step), residual)
            return self.mlp(normed), residual
        activated, residual = self.post_attention_layernorm.add_norm_gate_up(
            self.mixer(projected, step), residual, self.mlp.gate_up_proj
        )
        return self.mlp.down(activated), residual


class HybridModel(nn.Module):
    """Qwen3.5 / Qwen3-Next text decoder. Parameter names are our loaded layout (compiled_engine/loader.py).

    With tensor parallelism (``tp.world_size > 1``) this is one rank's shard: the mixers and MLPs hold 1/world of
    the heads, and the embedding and lm_head 1/world of the vocabulary (padded to a multiple of world).
    """

    def __init__(
        self, config: ModelConfig, tp: TensorParallel = SINGLE, attention_backend: str = "triton", mtp: bool = False
    ):
        """``mtp``: build the multi-token-prediction layer too (speculative decoding)."""
        super().__init__()
        self.config = config
        self.tp = tp
        self.vocab_per_rank = -(-config.vocab_size // tp.world_size)
        self.embed_tokens = empty_parameter(self.vocab_per_rank, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, t, tp, attention_backend, sparse=i in config.moe_layers)
            for i, t in enumerate(config.layer_types)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied checkpoints share the embedding tensor (the loader points lm_head at it: one copy in memory).
        self.lm_head = empty_parameter(self.vocab_per_rank, config.hidden_size)
        self.mtp = MTPLayer(config, DecoderLayer, attention_backend, tp) if mtp else None

    def forward(self, step: StepInputs) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of the step's new tokens, after the final norm."""
        hidden, residual = self.embed(step.input_ids), None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, step)
        return self.norm.add_and_norm(hidden, residual)[1]

    def mtp_forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """The MTP layer on ``[T]`` next tokens and the ``[T, H]`` hidden states before them (compiled_engine/mtp.py),
        with the shared embedding; writes its KV at ``step.slot_mapping``. Returns ``[T, H]``."""
        return self.mtp(self.embed(input_ids), hidden, step)

    def commit_verify(self, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """After a verify step: every linear layer's state pools at ``slots`` [N] (the step's state slots) take the
        state after each sequence's last accepted position (``num_accepted`` [N]: gated_deltanet.commit_verify)."""
        commit_verify([layer.linear_attn for layer in self.layers if layer.layer_type == LINEAR_ATTENTION], slots,
                      num_accepted)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(input_ids, self.embed_tokens)
        # Vocab-parallel: each rank looks up the ids in its range, zeros elsewhere; the all-reduce sums them.
        local = input_ids - self.tp.rank * self.vocab_per_rank
        mine = (local >= 0) & (local < self.vocab_per_rank)
        x = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.embed_tokens)
        return self.tp.all_reduce(x * mine[:, None].to(x.dtype))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[rows, vocab]`` for the given hidden rows (gathered from every rank's vocab shard)."""
        return self._logits(hidden).float()

    def decode_output(self, hidden: torch.Tensor) -> DecodeOutput:
        """A decode step's logits in the model's dtype and its greedy tokens (``ce::argmax``: two short kernels
        instead of an fp32 conversion of the logits and torch's argmax after the graph). The compiled decode ends
        with ``decode_logits`` and its own epilogue instead (graphs/decode_graph.py)."""
        logits = self.decode_logits(hidden)
        return DecodeOutput(logits, argmax_op(logits))

    def draft_tokens(self, hidden: torch.Tensor, vocab: int | None = None) -> torch.Tensor:
        """Greedy draft tokens ``[rows]`` int64: the argmax of the logits over the first ``vocab`` token ids (None:
        all), computed from those rows of the lm_head only (with tensor parallelism: from the gathered logits, the
        first ``vocab`` of them: rank r holds ids r * vocab_per_rank onwards)."""
        if vocab is None or vocab >= self.config.vocab_size:
            return argmax_op(self.decode_logits(hidden))
        if self.tp.world_size > 1:
            return argmax_op(self.decode_logits(hidden)[:, :vocab].contiguous())
        return argmax_op(linear(hidden, self.lm_head[:vocab]))

    def decode_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """A decode step's logits ``[N, vocab]`` in the model's dtype."""
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather_last_dim(linear(hidden, self.lm_head))
        return logits[:, : self.config.vocab_size]

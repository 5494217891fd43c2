"""The hybrid decoder: embedding, N pre-norm decoder layers (Gated DeltaNet or full attention), final norm, lm_head.

``forward(step)`` maps a StepInputs to hidden states of the new tokens; ``compute_logits`` projects the rows the
caller asks for. The layer mixers own their caches as buffers (see compiled_engine/cache.py), so one forward
mutates exactly: every attention layer's ``k_cache``/``v_cache`` and every linear layer's ``conv_state``/
``recurrent_state``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compiled_engine.attention import FullAttention
from compiled_engine.config import LINEAR_ATTENTION, ModelConfig
from compiled_engine.gated_deltanet import GatedDeltaNet
from compiled_engine.layers import MLP, RMSNorm, empty_parameter
from compiled_engine.step_inputs import StepInputs


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if layer_type == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = FullAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.layer_type == LINEAR_ATTENTION else self.self_attn

    def forward(self, x: torch.Tensor, step: StepInputs) -> torch.Tensor:
        x = x + self.mixer(self.input_layernorm(x), step)
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridModel(nn.Module):
    """Qwen3.5 / Qwen3-Next text decoder. Parameter names are our loaded layout (compiled_engine/loader.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = empty_parameter(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, t) for t in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied checkpoints share the embedding tensor (the loader points lm_head at it: one copy in memory).
        self.lm_head = empty_parameter(config.vocab_size, config.hidden_size)

    def forward(self, step: StepInputs) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of the step's new tokens, after the final norm."""
        x = F.embedding(step.input_ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, step)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given hidden rows."""
        return F.linear(hidden, self.lm_head).float()

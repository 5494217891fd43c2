"""The embedded default model: a tiny Qwen3.5-architecture checkpoint with random weights, built on the fly.

No download exists here, so ``LLM()`` and ``python -m compiled_engine generate`` with no ``--model`` build this
deterministic checkpoint (``config.json`` + ``model.safetensors`` in the Qwen3_5ForCausalLM layout + a byte-level
tokenizer) into a cache folder once and reuse it. Its output is gibberish: it exercises the whole runtime, not
language. It carries a multi-token-prediction layer (``mtp.*``, as real Qwen3.5 checkpoints do), so speculative
decoding runs on it too, and its tokenizer has a ChatML-style chat template (plain bytes: the vocabulary has no
special tokens for it), so the server's chat endpoint works with it too.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from safetensors.torch import save_file

TINY_VERSION = "v3"  # bump when the recipe changes, so stale caches are rebuilt
EOS_TOKEN = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_CONFIG = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 257,  # 256 bytes + EOS: every id decodes
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,  # a tied random model just repeats its input token
    "eos_token_id": 256,
    "hidden_act": "silu",
    "dtype": "float32",
}


def default_cache_dir() -> str:
    root = os.environ.get("COMPILED_ENGINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "compiled_engine")
    return os.path.join(root, f"tiny-qwen3.5-{TINY_VERSION}")


def ensure_tiny_model(path: str | None = None) -> str:
    """Build the tiny model at ``path`` (default: the cache folder) unless it is already there."""
    path = path or default_cache_dir()
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return path
    os.makedirs(path, exist_ok=True)
    # A folder of its own for each builder: test workers may build the same model at once, and every file lands
    # by an atomic rename, so the last writer's identical copy wins.
    tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".partial-", dir=os.path.dirname(path))
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(TINY_CONFIG, f, indent=2)
    save_file(tiny_weights(TINY_CONFIG), os.path.join(tmp, "model.safetensors"))
    save_byte_tokenizer(tmp)
    for name in os.listdir(tmp):  # the weights file is moved last: its presence marks a complete folder
        if name != "model.safetensors":
            os.replace(os.path.join(tmp, name), os.path.join(path, name))
    os.replace(os.path.join(tmp, "model.safetensors"), os.path.join(path, "model.safetensors"))
    os.rmdir(tmp)
    return path


def tiny_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights with HF Qwen3_5ForCausalLM names; every block perturbs the output."""
    g = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    kd, vd = config["linear_key_head_dim"], config["linear_value_head_dim"]
    heads, kv_heads, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    conv_dim = 2 * hk * kd + hv * vd

    def linear(rows, cols):
        return torch.randn(rows, cols, generator=g) * cols**-0.5

    def norm(dim):  # zero-centred norms: a non-zero weight matters
        return torch.randn(dim, generator=g) * 0.1

    def dense_layer(p: str, attention: bool) -> None:
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
        if attention:
            w[p + "self_attn.q_proj.weight"] = linear(2 * heads * hd, hidden)
            w[p + "self_attn.k_proj.weight"] = linear(kv_heads * hd, hidden)
            w[p + "self_attn.v_proj.weight"] = linear(kv_heads * hd, hidden)
            w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * hd)
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)

    w = {"model.embed_tokens.weight": torch.randn(config["vocab_size"], hidden, generator=g)}
    interval = config["full_attention_interval"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        dense_layer(p, attention=(i + 1) % interval == 0)
        if (i + 1) % interval != 0:
            w[p + "linear_attn.in_proj_qkv.weight"] = linear(conv_dim, hidden)
            w[p + "linear_attn.in_proj_z.weight"] = linear(hv * vd, hidden)
            w[p + "linear_attn.in_proj_b.weight"] = linear(hv, hidden)
            w[p + "linear_attn.in_proj_a.weight"] = linear(hv, hidden)
            w[p + "linear_attn.conv1d.weight"] = (
                torch.randn(conv_dim, 1, config["linear_conv_kernel_dim"], generator=g) * 0.5
            )
            w[p + "linear_attn.A_log"] = torch.empty(hv).uniform_(0.01, 16, generator=g).log()
            w[p + "linear_attn.dt_bias"] = torch.randn(hv, generator=g) * 0.5
            w[p + "linear_attn.norm.weight"] = 1 + torch.randn(vd, generator=g) * 0.1
            w[p + "linear_attn.out_proj.weight"] = linear(hidden, hv * vd)
    w["model.norm.weight"] = norm(hidden)
    w["lm_head.weight"] = linear(config["vocab_size"], hidden) * 4  # logits with a few units of spread
    # The multi-token-prediction layer, drawn after every target tensor: fc over [embedding | hidden], its norms, one
    # full-attention decoder layer, its final norm.
    w["mtp.fc.weight"] = linear(hidden, 2 * hidden)
    w["mtp.pre_fc_norm_embedding.weight"] = norm(hidden)
    w["mtp.pre_fc_norm_hidden.weight"] = norm(hidden)
    dense_layer("mtp.layers.0.", attention=True)
    w["mtp.norm.weight"] = norm(hidden)
    return {k: v.contiguous() for k, v in w.items()}


def save_byte_tokenizer(path: str) -> None:
    """A byte-level tokenizer: token i < 256 is byte i (GPT-2 byte-to-unicode alphabet), 256 is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    vocab[EOS_TOKEN] = 256
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters (what ByteLevel uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))

"""Checkpoint loader: safetensors (single file or sharded) -> HybridModel on the target device and dtype.

Names are mapped by whole dotted segments, never substrings:
  * ``model.language_model.X`` (Qwen3_5ForConditionalGeneration) and ``model.X`` (ForCausalLM) -> ``X``;
  * ``model.visual.*`` is skipped; ``mtp.*`` (the multi-token-prediction layer) is loaded into ``HybridModel.mtp``
    when the model is built with it (speculative decoding: ``mtp.layers.0.*`` maps as a target layer does), and
    otherwise skipped but listed in ``LoadReport.mtp_tensors``; a model with the layer and a checkpoint without
    ``mtp.*`` tensors is a ``CheckpointError`` (a ValueError) saying so;
  * projections are fused: ``q_proj|k_proj|v_proj -> qkv_proj``, ``gate_proj|up_proj -> gate_up_proj``,
    ``in_proj_qkv|in_proj_z|in_proj_b|in_proj_a -> in_proj``; Qwen3-Next's per-key-head grouped ``in_proj_qkvz`` and
    ``in_proj_ba`` are regrouped to the same ``[q | k | v | z | b | a]`` layout;
  * a sparse MoE layer's experts come per expert (``mlp.experts.N.gate_proj|up_proj|down_proj.weight``, what HF's
    ``save_pretrained`` writes for Qwen3-Next) or fused (``mlp.experts.gate_up_proj [E, 2I, H]``,
    ``mlp.experts.down_proj [E, H, I]``, Qwen3.5-MoE's layout); either fills one ``[E * 2I, H]`` and one
    ``[E * H, I]`` parameter. The shared expert's gate and up, the router (``mlp.gate``) and the shared gate
    (``mlp.shared_expert_gate``) fill one ``input_proj`` (compiled_engine/moe.py);
  * lm_head is tied to the embedding (one tensor in memory) exactly when the config says
    ``tie_word_embeddings: true`` (vLLM's rule): a tied checkpoint's own ``lm_head.weight``, if any, is ignored; an
    untied checkpoint without ``lm_head.weight`` is an error naming it, never a silent tie.
Missing, unexpected and mis-shaped tensors raise ``CheckpointError`` naming the tensor. A tensor of a non-floating
dtype (an integer or bool tensor: quantised or damaged data) is rejected naming it; floating dtypes are cast to
the target dtype. A safetensors file (or shard index) that cannot be read, truncated or corrupt, raises
``CheckpointError`` naming the file; a shard the index names but that is absent raises ``FileNotFoundError``.

Each tensor is read from disk once and copied straight into its slice of the (fused) parameter, allocated
directly on the target device in the target dtype: no second full copy of the model is ever built. With tensor
parallelism each rank reads only its own slices of the tensors that need no regrouping.

A ``WeightSource`` stands in for the safetensors files (the benchmarks' random weights of shapes whose checkpoint
would not fit a disk: bench/models.py): it names the checkpoint tensors and makes each one whole, on the loading
rank's device; everything else (routing, regrouping, the tensor-parallel cut, the checks) is the files' path, so
every rank keeps exactly the part of each tensor that it would read from a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from tqdm.auto import tqdm

from compiled_engine.config import ModelConfig
from compiled_engine.distributed import SINGLE, TensorParallel, shard_sections
from compiled_engine.model import HybridModel

FP32_PARAMETERS = ("A_log", "dt_bias")  # tiny, and the gates are computed in fp32 anyway


class WeightSource(Protocol):
    """Checkpoint tensors made instead of read: HF names and whole (unsharded) tensors, as a safetensors file holds
    them. Picklable (a tensor-parallel worker is handed it through its spawn arguments), and deterministic: every
    rank makes the same tensor for a name and keeps its own part of it."""

    def names(self, config: ModelConfig) -> list[str]:
        """Every tensor of the checkpoint (what a file's ``keys()`` would list)."""

    def get_tensor(self, name: str, config: ModelConfig, device: torch.device) -> torch.Tensor:
        """The whole tensor ``name``, made on ``device``."""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: missing, unexpected or mis-shaped tensors."""


@dataclass
class Placement:
    """Where one checkpoint tensor goes: rows ``[row_offset, row_offset + rows)`` of ``target``.

    ``rows`` None means the whole parameter.
    """

    target: str
    row_offset: int = 0
    rows: int | None = None
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None  # layout change of the full tensor
    shard: tuple[int, list[int]] | None = None  # (dim, global sections): tensor-parallel cut, after transform


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    skipped_visual: list[str] = field(default_factory=list)
    mtp_tensors: dict[str, str] = field(default_factory=dict)  # name -> file: the MTP layer's (loaded where asked)
    tied_lm_head: bool = False


def checkpoint_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file, for a single-file or a sharded checkpoint."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = {name: os.path.join(path, file) for name, file in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as error:  # not JSON, no or a malformed weight_map
            raise CheckpointError(f"shard index {index!r} is not a valid weight_map: {error!r}") from error
        for file in sorted(set(files.values())):
            if not os.path.isfile(file):
                raise FileNotFoundError(f"shard {file!r} named in {index!r} does not exist")
        return files
    single = os.path.join(path, "model.safetensors")
    if not os.path.isfile(single):
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path!r}")
    with _open_safetensors(single) as f:
        return {name: single for name in f.keys()}


class _open_safetensors:
    """``safe_open(file)`` whose failures (a truncated or corrupt file: SafetensorError, or an OSError) raise
    ``CheckpointError`` naming the file, on opening and on every read inside the ``with`` block."""

    def __init__(self, file: str):
        self.file = file

    def __enter__(self):
        try:
            self._handle = safe_open(self.file, framework="pt", device="cpu")
            return self._handle.__enter__()
        except (SafetensorError, OSError) as error:
            raise self._error(error) from error

    def __exit__(self, kind, error, traceback):
        self._handle.__exit__(kind, error, traceback)
        if isinstance(error, (SafetensorError, OSError)):
            raise self._error(error) from error
        return False

    def _error(self, error: Exception) -> CheckpointError:
        return CheckpointError(f"cannot read safetensors file {self.file!r} (truncated or corrupt?): {error}")


class WeightRouter:
    """Maps a checkpoint tensor name to its placement in our (possibly tensor-parallel-sharded) parameters.

    Offsets and row counts are this rank's; ``Placement.shard`` says how to cut the full checkpoint tensor.
    """

    def __init__(self, config: ModelConfig, tp: TensorParallel = SINGLE):
        self.config = config
        self.tp = tp
        c, n = config, tp.world_size
        # Global sizes of the head-major sections each checkpoint projection is made of.
        self.q_rows, self.kv_rows = 2 * c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.key_rows, self.value_rows, hv = c.linear_key_dim, c.linear_value_dim, c.linear_num_value_heads
        q, kv, inter = self.q_rows // n, self.kv_rows // n, c.intermediate_size // n
        key, value, hv_local = self.key_rows // n, self.value_rows // n, hv // n
        conv = 2 * key + value
        # name -> (row offset, rows) inside our fused parameter, on this rank
        self.attention_rows = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}
        self.mlp_rows = {"gate_proj": (0, inter), "up_proj": (inter, inter)}
        self.linear_rows = {
            "in_proj_qkv": (0, conv),
            "in_proj_z": (conv, value),
            "in_proj_b": (conv + value, hv_local),
            "in_proj_a": (conv + value + hv_local, hv_local),
        }
        experts, inter_local = c.num_experts, c.moe_intermediate_size // n
        shared = c.shared_expert_intermediate_size // n
        # A sparse MoE layer's input_proj, this rank's rows: [shared expert gate_proj | its up_proj | router (E) |
        # shared_expert_gate (1)].
        self.moe_input_rows = {
            "shared_expert.gate_proj": (0, shared),
            "shared_expert.up_proj": (shared, shared),
            "gate": (2 * shared, experts),
            "shared_expert_gate": (2 * shared + experts, 1),
        }
        self.expert_rows = 2 * inter_local  # rows of one expert in experts_gate_up
        self.linear_sections = {
            "in_proj_qkv": [self.key_rows, self.key_rows, self.value_rows],
            "in_proj_z": [self.value_rows],
            "in_proj_b": [hv],
            "in_proj_a": [hv],
        }

    def route(self, name: str) -> Placement | None:
        """Our placement for ``name``; None for tensors that text generation skips. Raises for unknown names."""
        parts = name.split(".")
        if parts[:2] == ["model", "language_model"]:
            parts = parts[2:]
        elif parts[:1] == ["model"]:
            parts = parts[1:]
        elif parts == ["lm_head", "weight"]:
            return Placement("lm_head", transform=self._vocab_shard)
        else:
            raise CheckpointError(f"unexpected tensor {name!r}")
        if parts == ["embed_tokens", "weight"]:
            return Placement("embed_tokens", transform=self._vocab_shard)
        if parts == ["norm", "weight"]:
            return Placement("norm.weight")
        if len(parts) >= 4 and parts[0] == "layers" and parts[1].isdigit():
            if int(parts[1]) >= self.config.num_hidden_layers:
                return None
            index = int(parts[1])
            placement = self._route_layer(f"layers.{index}", parts[2:], sparse=index in self.config.moe_layers)
            if placement is not None:
                return placement
        raise CheckpointError(f"unexpected tensor {name!r}")

    def route_mtp(self, name: str) -> Placement:
        """Our placement for an ``mtp.*`` tensor (the model built with its MTP layer). Raises for unknown names."""
        parts = name.split(".")[1:]
        if parts == ["fc", "weight"]:
            return Placement("mtp.fc")
        if len(parts) == 2 and parts[0] in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            if parts[1] == "weight":
                return Placement(f"mtp.{parts[0]}.weight")
        if len(parts) >= 4 and parts[:2] == ["layers", "0"]:
            placement = self._route_layer("mtp.layers.0", parts[2:], sparse=0 in self.config.moe_layers)
            if placement is not None:
                return placement
        raise CheckpointError(f"unexpected tensor {name!r}")

    def _route_layer(self, prefix: str, parts: list[str], sparse: bool) -> Placement | None:
        module, rest = parts[0], parts[1:]
        c = self.config
        if module in ("input_layernorm", "post_attention_layernorm") and rest == ["weight"]:
            return Placement(f"{prefix}.{module}.weight")
        if module == "mlp" and sparse:
            return self._route_moe(f"{prefix}.mlp", rest)
        if module == "mlp" and len(rest) == 2 and rest[1] == "weight":
            if rest[0] in self.mlp_rows:
                return Placement(
                    f"{prefix}.mlp.gate_up_proj", *self.mlp_rows[rest[0]], shard=(0, [c.intermediate_size])
                )
            if rest[0] == "down_proj":
                return Placement(f"{prefix}.mlp.down_proj", shard=(1, [c.intermediate_size]))
        if module == "self_attn" and len(rest) == 2 and rest[1] == "weight":
            if rest[0] in self.attention_rows:
                sections = [self.q_rows] if rest[0] == "q_proj" else [self.kv_rows]
                return Placement(f"{prefix}.self_attn.qkv_proj", *self.attention_rows[rest[0]], shard=(0, sections))
            if rest[0] == "o_proj":
                return Placement(f"{prefix}.self_attn.o_proj", shard=(1, [self.q_rows // 2]))
            if rest[0] in ("q_norm", "k_norm"):
                return Placement(f"{prefix}.self_attn.{rest[0]}.weight")
        if module == "linear_attn":
            return self._route_linear(f"{prefix}.linear_attn", rest)
        return None

    def _route_moe(self, prefix: str, rest: list[str]) -> Placement | None:
        c = self.config
        inter, shared = c.moe_intermediate_size, c.shared_expert_intermediate_size
        name = ".".join(rest[:-1])
        if rest[-1:] == ["weight"] and name in self.moe_input_rows:
            cut = (0, [shared]) if name.startswith("shared_expert.") else None  # router, shared gate: replicated
            return Placement(f"{prefix}.input_proj", *self.moe_input_rows[name], shard=cut)
        if rest == ["shared_expert", "down_proj", "weight"]:
            return Placement(f"{prefix}.shared_down", shard=(1, [shared]))
        if rest == ["experts", "gate_up_proj"]:
            return Placement(f"{prefix}.experts_gate_up", transform=self._fused_experts(1, [inter, inter]))
        if rest == ["experts", "down_proj"]:
            return Placement(f"{prefix}.experts_down", transform=self._fused_experts(2, [inter]))
        if len(rest) == 4 and rest[0] == "experts" and rest[1].isdigit() and rest[3] == "weight":
            expert = int(rest[1])
            if expert >= c.num_experts:
                return None
            local = self.expert_rows // 2
            if rest[2] in ("gate_proj", "up_proj"):
                offset = expert * self.expert_rows + (local if rest[2] == "up_proj" else 0)
                return Placement(f"{prefix}.experts_gate_up", offset, local, shard=(0, [inter]))
            if rest[2] == "down_proj":
                return Placement(f"{prefix}.experts_down", expert * c.hidden_size, c.hidden_size, shard=(1, [inter]))
        return None

    def _fused_experts(self, dim: int, sections: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
        """A fused 3-D expert tensor (``gate_up [E, 2I, H]`` cut along dim 1, ``down [E, H, I]`` along dim 2): this
        rank's part of every expert, flattened to our 2-D parameter."""
        c = self.config
        expected = (c.num_experts, sum(sections), c.hidden_size) if dim == 1 else (
            c.num_experts, c.hidden_size, sum(sections))

        def transform(t: torch.Tensor) -> torch.Tensor:
            if tuple(t.shape) != expected:
                raise RuntimeError(f"expected shape {expected}")
            return shard_sections(t, sections, dim, self.tp).flatten(0, 1)

        return transform

    def _route_linear(self, prefix: str, rest: list[str]) -> Placement | None:
        c = self.config
        hv = c.linear_num_value_heads
        qkv_sections = [self.key_rows, self.key_rows, self.value_rows]
        if rest in (["A_log"], ["dt_bias"]):
            return Placement(f"{prefix}.{rest[0]}", shard=(0, [hv]))
        if rest == ["conv1d", "weight"]:  # [C, 1, W] -> [C, W]
            return Placement(
                f"{prefix}.conv_weight", transform=lambda t: t.reshape(t.shape[0], t.shape[-1]), shard=(0, qkv_sections)
            )
        if rest == ["norm", "weight"]:  # [V], shared by all value heads: replicated
            return Placement(f"{prefix}.norm.weight")
        if rest == ["out_proj", "weight"]:
            return Placement(f"{prefix}.out_proj", shard=(1, [self.value_rows]))
        if len(rest) == 2 and rest[1] == "weight" and rest[0] in self.linear_rows:
            return Placement(f"{prefix}.in_proj", *self.linear_rows[rest[0]], shard=(0, self.linear_sections[rest[0]]))
        conv, value = self.linear_rows["in_proj_z"]
        if rest == ["in_proj_qkvz", "weight"]:  # Qwen3-Next
            return Placement(
                f"{prefix}.in_proj", 0, conv + value, self._regroup_qkvz, (0, qkv_sections + [self.value_rows])
            )
        if rest == ["in_proj_ba", "weight"]:
            offset, rows = self.linear_rows["in_proj_b"]
            return Placement(f"{prefix}.in_proj", offset, 2 * rows, self._regroup_ba, (0, [hv, hv]))
        return None

    def source_name(self, target: str, row: int) -> str:
        """For error messages: the checkpoint tensor (without its ``model.`` / ``model.language_model.`` prefix)
        that fills row ``row`` (this rank's numbering) of our parameter ``target``: the inverse of ``route``."""
        head, _, last = target.rpartition(".")
        if last == "in_proj" and self.config.model_type == "qwen3_next":
            conv, value = self.linear_rows["in_proj_z"]
            return f"{head}.{'in_proj_qkvz' if row < conv + value else 'in_proj_ba'}.weight"
        if last == "experts_gate_up":
            expert, part = divmod(row, self.expert_rows)
            sub = "up_proj" if part >= self.expert_rows // 2 else "gate_proj"
            return f"{head}.experts.{expert}.{sub}.weight (or {head}.experts.gate_up_proj)"
        if last == "experts_down":
            return f"{head}.experts.{row // self.config.hidden_size}.down_proj.weight (or {head}.experts.down_proj)"
        if last == "shared_down":
            return f"{head}.shared_expert.down_proj.weight"
        tables = {"qkv_proj": self.attention_rows, "gate_up_proj": self.mlp_rows, "in_proj": self.linear_rows,
                  "input_proj": self.moe_input_rows}
        for sub, (offset, rows) in tables.get(last, {}).items():
            if offset <= row < offset + rows:
                return f"{head}.{sub}.weight"
        renamed = {"conv_weight": "conv1d.weight", "A_log": "A_log", "dt_bias": "dt_bias"}
        if last in renamed:
            return f"{head}.{renamed[last]}"
        return target if target.endswith(".weight") else f"{target}.weight"

    def _vocab_shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a vocab-parallel matrix, zero-padded to ``ceil(vocab / world)`` rows."""
        n = self.tp.world_size
        if n == 1:
            return t
        per_rank = -(-t.shape[0] // n)
        rows = t[self.tp.rank * per_rank : (self.tp.rank + 1) * per_rank]
        if rows.shape[0] < per_rank:
            rows = torch.cat([rows, rows.new_zeros(per_rank - rows.shape[0], *rows.shape[1:])])
        return rows

    def _regroup_qkvz(self, t: torch.Tensor) -> torch.Tensor:
        """Qwen3-Next rows per key head i: ``[q_i | k_i | v (r heads) | z (r heads)]`` -> ``[q | k | v | z]``."""
        c = self.config
        r = c.linear_num_value_heads // c.linear_num_key_heads
        K, V = c.linear_key_head_dim, c.linear_value_head_dim
        grouped = t.reshape(c.linear_num_key_heads, 2 * K + 2 * r * V, t.shape[-1])
        q, k, v, z = grouped.split([K, K, r * V, r * V], dim=1)
        return torch.cat([x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)])

    def _regroup_ba(self, t: torch.Tensor) -> torch.Tensor:
        """Qwen3-Next rows per key head i: ``[b (r) | a (r)]`` -> ``[b | a]``."""
        c = self.config
        r = c.linear_num_value_heads // c.linear_num_key_heads
        b, a = t.reshape(c.linear_num_key_heads, 2 * r, t.shape[-1]).split([r, r], dim=1)
        return torch.cat([b.reshape(-1, t.shape[-1]), a.reshape(-1, t.shape[-1])])


def _skip_reason(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] == ["model", "visual"]:
        return "visual"
    if parts[0] == "mtp":
        return "mtp"
    return None


def load_model(
    path: str,
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = False,
    tp: TensorParallel = SINGLE,
    attention_backend: str = "triton",
    mtp: bool = False,
    weights: WeightSource | None = None,
) -> tuple[HybridModel, LoadReport]:
    """Build the model (this rank's shard) on ``meta`` and fill every parameter from the checkpoint at ``path``.

    Each tensor is read on the CPU, cut to this rank's shard, and only the shard is copied to ``device``.
    ``mtp``: build and load the multi-token-prediction layer too (speculative decoding).
    ``weights``: make the checkpoint's tensors with this source (on ``device``, whole, then cut) instead of reading
    the safetensors files at ``path``, which then needs only its config.json.
    """
    with torch.device("meta"):
        model = HybridModel(config, tp, attention_backend, mtp=mtp)
    files = checkpoint_files(path) if weights is None else dict.fromkeys(weights.names(config), path)
    if mtp and not any(_skip_reason(name) == "mtp" for name in files):
        raise CheckpointError(
            f"checkpoint {path!r} has no mtp.* tensors (the multi-token-prediction layer: mtp.fc.weight, "
            "mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.layers.0.*, mtp.norm.weight), "
            "which speculative_config method 'mtp' needs"
        )
    report = LoadReport()
    router = WeightRouter(config, tp)
    params = dict(model.named_parameters(remove_duplicate=False))
    rows_written: dict[str, list[tuple[int, int]]] = {name: [] for name in params}  # [start, end) row ranges
    materialised: dict[str, torch.Tensor] = {}

    # Ties come from the config only: a missing lm_head of an untied model is damage, not a tie.
    report.tied_lm_head = config.tie_word_embeddings
    if not report.tied_lm_head and "lm_head.weight" not in files:
        raise CheckpointError(
            f"checkpoint {path!r} lacks tensor 'lm_head.weight' (its config says tie_word_embeddings: false)"
        )
    by_file: dict[str, list[str]] = {}
    for name, file in files.items():
        reason = _skip_reason(name)
        if name == "lm_head.weight" and report.tied_lm_head:
            continue  # tied: lm_head is the embedding, whatever else the checkpoint holds (vLLM skips it too)
        if reason == "visual":
            report.skipped_visual.append(name)
        elif reason == "mtp":
            report.mtp_tensors[name] = file
            if mtp:
                by_file.setdefault(file, []).append(name)
        else:
            by_file.setdefault(file, []).append(name)

    total = sum(len(v) for v in by_file.values())
    bar = tqdm(total=total, desc="loading weights", unit="tensor", disable=not progress)
    for file, names in by_file.items():
        with _open_safetensors(file) if weights is None else _SourceFile(weights, config, device) as f:
            for name in names:
                placement = router.route_mtp(name) if _skip_reason(name) == "mtp" else router.route(name)
                bar.update(1)
                if placement is None:
                    continue
                tensor = _read(f, name, placement, tp, sliced=weights is None)
                _place(name, tensor, placement, params, materialised, rows_written, device, dtype)
                report.loaded.append(name)
    bar.close()

    if report.tied_lm_head:
        rows_written["lm_head"] = [(0, params["lm_head"].shape[0])]
        materialised["lm_head"] = materialised.get("embed_tokens")
    missing = []  # the checkpoint tensors (named as the checkpoint names them, less the prefix) never seen
    for target, param in params.items():
        row = _first_unfilled_row(rows_written[target], param.shape[0])
        if row is not None:
            missing.append(f"{router.source_name(target, row)} (rows of {target})")
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks tensors: {', '.join(missing[:8])}")
    for name, tensor in materialised.items():
        _set_parameter(model, name, nn.Parameter(tensor, requires_grad=False))
    for module in model.modules():  # derived buffers (rotary inv_freq) are built on the CPU, not from the checkpoint
        for buffer_name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, buffer_name, buffer.to(device))
    return model, report


class _SourceFile:
    """A WeightSource in the place of an open safetensors file: ``get_tensor`` makes the tensor on ``device``."""

    def __init__(self, weights: WeightSource, config: ModelConfig, device: torch.device):
        self.weights, self.config, self.device = weights, config, device

    def __enter__(self) -> "_SourceFile":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.weights.get_tensor(name, self.config, self.device)


def _read(f, name: str, placement: Placement, tp: TensorParallel, sliced: bool = True) -> torch.Tensor:
    """The checkpoint tensor as our parameter wants it: transformed and cut to this rank's shard.

    From a file (``sliced``), a sharded tensor that needs no layout change is read slice by slice, so a rank reads
    only its own part from disk; one that is regrouped first (Qwen3-Next's projections, the conv weight, vocab
    padding), and every tensor a WeightSource makes, is taken whole and then cut.
    """
    sharded = placement.shard is not None and tp.world_size > 1
    if sharded and placement.transform is None and sliced:
        dim, sections = placement.shard
        view = f.get_slice(name)
        _check_dtype(name, view.get_dtype())
        shape = view.get_shape()
        if len(shape) <= dim or shape[dim] != sum(sections):
            raise CheckpointError(f"tensor {name!r} has shape {tuple(shape)}; expected {sum(sections)} along dim {dim}")
        parts, start = [], 0
        for section in sections:
            size = section // tp.world_size
            lo, hi = start + tp.rank * size, start + (tp.rank + 1) * size
            parts.append(view[lo:hi] if dim == 0 else view[:, lo:hi])
            start += section
        return torch.cat(parts, dim=dim)
    tensor = f.get_tensor(name)
    _check_dtype(name, tensor.dtype)
    if placement.transform is not None:
        try:
            tensor = placement.transform(tensor)
        except RuntimeError as error:  # a reshape of a mis-shaped tensor
            raise CheckpointError(f"tensor {name!r} of shape {tuple(tensor.shape)}: {error}") from None
    if sharded:
        dim, sections = placement.shard
        if tensor.dim() <= dim or tensor.shape[dim] != sum(sections):
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}; expected {sum(sections)} along dim {dim}"
            )
        tensor = shard_sections(tensor, sections, dim, tp)
    return tensor


_FLOATING_SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16")  # safe_open's get_slice().get_dtype() names


def _check_dtype(name: str, dtype: torch.dtype | str) -> None:
    """Reject a non-floating checkpoint tensor (int8, bool...): copying it into a float parameter casts silently."""
    floating = dtype in _FLOATING_SAFETENSORS_DTYPES if isinstance(dtype, str) else dtype.is_floating_point
    if not floating:
        raise CheckpointError(f"tensor {name!r} has dtype {dtype}; a floating-point tensor is expected")


def _place(name, tensor, placement, params, materialised, rows_written, device, dtype):
    target = placement.target
    if target not in params:
        raise CheckpointError(f"tensor {name!r} maps to unknown parameter {target!r}")
    shape = params[target].shape
    rows = shape[0] if placement.rows is None else placement.rows
    expected = (rows, *shape[1:])
    if tuple(tensor.shape) != expected:
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}; expected {expected} at rows "
            f"[{placement.row_offset}, {placement.row_offset + rows}) of {target} {tuple(shape)}"
        )
    start, end = placement.row_offset, placement.row_offset + rows
    if any(start < b and a < end for a, b in rows_written[target]):
        raise CheckpointError(f"tensor {name!r} writes rows of {target} that another tensor already filled")
    if target not in materialised:
        target_dtype = torch.float32 if target.rsplit(".", 1)[-1] in FP32_PARAMETERS else dtype
        materialised[target] = torch.empty(shape, device=device, dtype=target_dtype)
    materialised[target][placement.row_offset : placement.row_offset + rows].copy_(tensor)
    rows_written[target].append((start, end))


def _first_unfilled_row(ranges: list[tuple[int, int]], num_rows: int) -> int | None:
    """The first row in ``[0, num_rows)`` that no ``[start, end)`` range covers; None when all are covered."""
    row = 0
    for start, end in sorted(ranges):
        if start > row:
            return row
        row = max(row, end)
    return None if row >= num_rows else row


def _set_parameter(model: nn.Module, dotted: str, value: nn.Parameter) -> None:
    owner_path, _, attr = dotted.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    setattr(owner, attr, value)

"""Sequence: one request's tokens and the cache resources it holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    num_computed_tokens: int = 0  # tokens whose KV / linear state are in the caches
    block_table: list[int] = field(default_factory=list)  # KV blocks, in order
    state_slot: int | None = None  # row in every linear layer's state pools, stable while running
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at the last admission
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of full blocks (prefix cache)
    num_indexed_blocks: int = 0  # of block_table, how many are entered in the prefix-cache index
    # Trailing tokens that are placeholders: sampled on the device, not read back yet (LLMEngine's overlapped
    # steps). The prefix cache hashes only the tokens before them.
    num_placeholder_tokens: int = 0
    # The length at which the request finishes by length (prompt + max_tokens, at most max_model_len), for the
    # scheduler's growth reserve; None: unknown (Runtime users), nothing reserved.
    length_limit: int | None = None
    # Whether admission may start it after a cached prefix, and the most tokens a prefill chunk of it computes (None:
    # the step's budget): a request that needs its prompt's logits (prompt_logprobs) computes it all, in chunks whose
    # all-position logits stay small.
    reads_prefix_cache: bool = True
    max_chunk_tokens: int | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    # The Runtime that made the sequence (Runtime.new_sequence stamps its token): its blocks and slot are rows of that
    # runtime's caches only, so Runtime.build_step refuses a sequence of another one.
    owner: object = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Leading tokens whose values the host has: all but the trailing placeholders."""
        return len(self.token_ids) - self.num_placeholder_tokens

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

#!/bin/bash
# Session 16, call 2 (the same machine, warm): bench spec with the drafts over the first 32,768 ids; the chat-like
# workload greedy vs sampled with MTP k = 2 (random weights: acceptance 0, no drafting rule).
STAGES="spec_draft_vocab sampling_mtp" STAGE_LIMITS="sampling_mtp=300" OUT=$OUT GPU_SESSION_S=590 bash bench/gpu_session.sh

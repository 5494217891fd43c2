#!/bin/bash
# Session 17, call 1 (issued from the tool directly; the git-ignored .wt/ call script did not travel): NOTES item -1.
# sampling_mtp ran first (gpu_session.sh's stage order) and was cut at its 280 s limit while compiling (cold 256-slot
# engine with MTP); spec_draft_vocab then ran whole.
STAGES="spec_draft_vocab sampling_mtp" STAGE_LIMITS="sampling_mtp=280" OUT=$OUT GPU_SESSION_S=585 bash bench/gpu_session.sh

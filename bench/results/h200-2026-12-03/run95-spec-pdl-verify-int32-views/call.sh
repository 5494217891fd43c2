#!/bin/bash
# Session 16, call 1 (device tool, nvidia-h200, carry .whl, cold machine): the verify kernel as a PDL kernel
# (4ed901d), the int32 views of the round buffer (58ea952), the sampled round's parameters in the staging buffer
# (a46793f), checked and timed.
KERNEL_TESTS=gated_deltanet_verify STAGES="test_speculative spec test_kernels" OUT=$OUT GPU_SESSION_S=590 bash bench/gpu_session.sh

#!/bin/bash
# The whole GPU suite (238 tests; the tensor-parallel ones skip on one GPU), -n 6: session 31 changed every kernel
# launcher (the unit-stride copies of the 1-D index and parameter vectors), ce::add_rms_norm_linear_silu_mul's dispatch
# and the GEMV's SiLU helper, none run on a GPU; GPU tests have only run by selection since session 27. Any machine
# (an H100 will do). ~6-9 min cold; the durations name what to cut if it runs long.
RUN=run164 source bench/device_env.sh || exit 1
TAIL=40 step gpu_suite 560 python3 -m pytest -q -n 6 -m gpu tests --durations=15 -p no:cacheprovider

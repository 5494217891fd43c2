#!/bin/bash
# Any GPU (~4 min): the whole GPU suite on the tree as it stands. Its last whole run was run 198 (d1e39b1, session
# 40); since then the decode attention's reduce split and stages, the mixed steps' decode rows, the sampler's
# warm-up and alignment, two-fold sequence buckets and the FLA configs landed, each checked by its own GPU tests only.
# tests/test_server.py is left out: the image has no `openai` client (CI installs it).
RUN=run240 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=40 step gpu_suite 540 python3 -m pytest -q -n 6 -m gpu tests --ignore tests/test_server.py --durations=20

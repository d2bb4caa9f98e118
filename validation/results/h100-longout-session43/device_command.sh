#!/bin/bash
# What ran on the device (one H100 machine start, 2026-12-07, forty-third session, tree bd70422), two calls:
ONLY=i-longout-p70 bash validation/run_gpu.sh longout $OUT/real
RUN_TAG=-b ONLY=i-longout-p70 bash validation/run_gpu.sh longout $OUT/real
ONLY=i-longout-p90 bash validation/run_gpu.sh longout $OUT/real
RUN_TAG=-b ONLY=i-longout-p90 bash validation/run_gpu.sh longout $OUT/real

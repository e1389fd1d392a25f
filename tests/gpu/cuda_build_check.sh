#!/usr/bin/env bash
# Fails when a CUDA toolkit is installed but the build used the no-CUDA stand-ins.
# $1: HAVE_CUDA as the build saw it ("True" / "False").
set -euo pipefail
have=$1
nvcc="${WB_CUDA_ROOT:-/usr/local/cuda}/bin/nvcc"
if [ -x "$nvcc" ] && [ "$have" != "True" ]; then
  echo "FAIL: $nvcc exists but the build fell back to the no-CUDA stand-ins (HAVE_CUDA=$have)." >&2
  echo "      Every .cu file must compile in CI; unset WB_DISABLE_CUDA and rebuild." >&2
  exit 1
fi
echo "HAVE_CUDA=$have, nvcc $( [ -x "$nvcc" ] && echo present || echo absent ): ok"

#!/bin/bash
# Bazel's --workspace_status_command for `./wb package`: the commit the binaries are built from
# (common/version:build_info). STABLE_ keys are part of the stamped actions' inputs.
cd "$(dirname "$0")/.." || exit 1
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then commit="$commit-dirty"; fi
echo "STABLE_WB_GIT_COMMIT $commit"

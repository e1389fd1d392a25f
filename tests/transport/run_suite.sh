#!/usr/bin/env bash
# Runs the transport suite binary against one backend: run_suite.sh BACKEND SUITE [catch args]
set -euo pipefail
backend=$1
suite=$2
shift 2
export WB_TEST_TRANSPORT=$backend
exec "$suite" "$@"

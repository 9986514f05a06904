#!/bin/sh
# Runs every codec fuzz target for a fixed time budget; fails on a finding.
#   tests/fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET
# BUILD_DIR must have been configured with clang and -DTCPSTORE_BUILD_FUZZERS=ON
# and built (target "fuzzers"). Each target starts from its seed corpus
# (BUILD_DIR/fuzz/seeds/<target>, written from tests/data/tcpstore_vectors.json)
# plus tests/fuzz/regressions/<target> (inputs of past findings), and keeps
# what it learns in BUILD_DIR/fuzz/corpus/<target>. A crash, leak,
# sanitizer report or violated property leaves its input in
# BUILD_DIR/fuzz/artifacts/<target>/ and makes this script exit non-zero.
set -eu

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS_PER_TARGET" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
seconds=$2
targets="fuzz_request_stream fuzz_request_v113 fuzz_request_v2 fuzz_reply fuzz_server_path"

failed=""
for t in $targets; do
  bin="$build/bin/$t"
  seeds="$build/fuzz/seeds/$t"
  # The server-path target starts from an empty corpus (no vectors seed it).
  if [ "$t" = fuzz_server_path ]; then mkdir -p "$seeds"; fi
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "run.sh: $bin or $seeds missing (build the 'fuzzers' target with clang and" \
         "-DTCPSTORE_BUILD_FUZZERS=ON)" >&2
    exit 2
  fi
  corpus="$build/fuzz/corpus/$t"
  artifacts="$build/fuzz/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  log="$build/fuzz/$t.log"
  # Inputs of past findings (tests/fuzz/regressions/<target>/) run first.
  extra=""
  if [ -d "$here/regressions/$t" ]; then extra="$here/regressions/$t"; fi
  echo "== $t: ${seconds}s (log: $log)"
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
       -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "$seeds" $extra >"$log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added)|^Done' "$log" || true
  else
    echo "!! $t: FINDING (exit $?); last lines of $log:" >&2
    tail -n 30 "$log" >&2
    ls -l "$artifacts" >&2 || true
    failed="$failed $t"
  fi
done

if [ -n "$failed" ]; then
  echo "run.sh: findings in:$failed" >&2
  exit 1
fi
echo "run.sh: all fuzz targets ran ${seconds}s without a finding"

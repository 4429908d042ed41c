#!/usr/bin/env bash
# scripts/gpu-check's own logic, which a GPU session gets one chance to run:
# how it lists, runs and counts gtest cases (on a stand-in gtest program with
# every outcome), and a whole run of its tests and cli steps against this
# build (whose GPU tests skip here). Usage: gpu_check_test.sh SCRIPT BUILD
set -euo pipefail
script="$1"
build="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/out/summary.txt; do
    [[ -f "$f" ]] && { echo "--- $f"; cat "$f"; }
  done
  exit 1
}
expect_line() { # file, exact line
  grep -qxF -- "$2" "$1" || fail "no line '$2' in $1"
}

# A stand-in for a gtest program: a suite with a pass, a failure, a hang, a
# skip and a disabled test; a typed suite; a name the filter does not match.
cat >"$work/fake" <<'EOF'
#!/usr/bin/env bash
case "$1" in
  --gtest_list_tests)
    printf 'S.\n  Pass\n  Fail\n  Hang\n  Skip\n  DISABLED_Off\n  NoMatch\n'
    printf 'T/0.  # TypeParam = int\n  Works\nP/Q.\n  Each/0  # GetParam() = 1\n' ;;
  --gtest_filter=S.Pass | --gtest_filter=T/0.Works | --gtest_filter=P/Q.Each/0)
    echo "[  PASSED  ] 1 test." ;;
  --gtest_filter=S.Fail)
    printf '[  FAILED  ] S.Fail (3 ms)\n[  FAILED  ] 1 test, listed below:\n[  FAILED  ] S.Fail\n'
    exit 1 ;;
  --gtest_filter=S.Hang) sleep 60 ;;
  --gtest_filter=S.Skip) printf '[  PASSED  ] 0 tests.\n[  SKIPPED ] 1 test, listed below:\n' ;;
  --gtest_filter=S.NoMatch) echo "[  PASSED  ] 0 tests." ;;
  *) echo "unexpected: $*"; exit 3 ;;
esac
EOF
chmod +x "$work/fake"

rc=0
"$script" _tests "$work/fake" 60 2 >"$work/each.log" 2>&1 || rc=$?
((rc != 0)) || fail "_tests exited 0 with a failed test"
expect_line "$work/each.log" "gpu-check: 3 passed, 1 skipped, 1 failed, 1 timed out, 1 not run"
expect_line "$work/each.log" "gpu-check failed: S.Fail"
expect_line "$work/each.log" "gpu-check failed: S.Hang (timed out after 2s)"
expect_line "$work/each.log" "gpu-check not run: S.NoMatch (the filter matched no test)"
if grep -q DISABLED_ "$work/each.log"; then fail "a disabled test was run"; fi

# A program that cannot list its tests fails the step, not "0 passed".
printf '#!/bin/sh\necho "cannot load" >&2\nexit 127\n' >"$work/broken"
chmod +x "$work/broken"
rc=0
"$script" _tests "$work/broken" 60 2 >"$work/broken.log" 2>&1 || rc=$?
((rc != 0)) || fail "_tests exited 0 for a program that cannot list its tests"
expect_line "$work/broken.log" "gpu-check failed: $work/broken --gtest_list_tests"

# A whole run of two steps against this build: both pass, with counts.
rc=0
GPU_CHECK_BUILD="$build" "$script" run --only tests,cli --out "$work/out" --budget 300 \
  >"$work/run.log" 2>&1 || rc=$?
((rc == 0)) || fail "run exited $rc"
grep -qE '^tests +passed +[0-9]+s  [1-9][0-9]* passed, [0-9]+ skipped, 0 failed, 0 timed out, 0 not run$' \
  "$work/out/summary.txt" || fail "no passing tests line in summary.txt"
grep -qE '^cli +passed +[0-9]+s  1 passed' "$work/out/summary.txt" || fail "no cli line"
for f in env.txt tests.log cli.log; do
  [[ -s "$work/out/$f" ]] || fail "no $f"
done

# With no time left a step is reported as not run, and the run fails.
rc=0
GPU_CHECK_BUILD="$build" "$script" run --only cli --out "$work/out" --budget 5 \
  >"$work/late.log" 2>&1 || rc=$?
((rc != 0)) || fail "a run with a step not run exited 0"
grep -qE '^cli +NOT RUN \(no time left\)' "$work/out/summary.txt" || fail "no NOT RUN line"
echo "gpu-check: every check passed"

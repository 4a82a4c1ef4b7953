#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every CUnit test program, then every test script; prints each one's
# output (CUnit's run summary included) and a closing tally. Exit 1 if any failed.
set -u
progs=(); scripts=(); seen_sep=0
for a in "$@"; do
	if [ "$a" = "--" ]; then seen_sep=1; continue; fi
	if [ $seen_sep -eq 0 ]; then progs+=("$a"); else scripts+=("$a"); fi
done
pass=0; fail=0; failed=()
run() {
	local label=$1; shift
	echo "=== $label"
	if timeout 900 "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$label"); fi
}
for p in "${progs[@]}"; do run "$p" "$p"; done
for s in "${scripts[@]}"; do run "$s" bash "$s"; done
echo
echo "test programs: $pass passed, $fail failed"
[ $fail -eq 0 ] || { printf 'FAILED: %s\n' "${failed[@]}"; exit 1; }

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every CUnit test program, then every test script; prints each one's
# output (CUnit's run summary and pytest's included) and a closing tally:
# "N passed, N failed, N skipped" alone on a line, then the skips, each with
# the reasons it printed ("SKIP(WHAT): REASON": tests/tally.sh's skip,
# tests/test-skip.h's t_skip). Exit status 0 is a pass, 77 a skip (the
# automake convention), anything else a failure. SNAPKV_REQUIRE=cuda,python,
# model (or "all") makes a skip for want of a named thing a failure: the
# helpers fail it themselves, and a 77 whose SKIP lines name it fails here.
# Exit 1 if any failed.
set -u
progs=(); scripts=(); seen_sep=0
for a in "$@"; do
	if [ "$a" = "--" ]; then seen_sep=1; continue; fi
	if [ $seen_sep -eq 0 ]; then progs+=("$a"); else scripts+=("$a"); fi
done
pass=0; fail=0; skipped=0; failed=(); skips=()
out=$(mktemp "${TMPDIR:-/tmp}/run-tests.XXXXXX")
trap 'rm -f "$out"' EXIT
# required OUTPUT: the first required thing its SKIP lines name, if any
required() {
	local w
	for w in $(grep -o 'SKIP([a-z0-9_-]*)' "$1" | sed 's/SKIP(\(.*\))/\1/' | sort -u); do
		case ",${SNAPKV_REQUIRE:-}," in
		*",$w,"* | *,all,*) echo "$w"; return ;;
		esac
	done
}
run() {
	local label=$1 rc w
	shift
	echo "=== $label"
	# to a file, then shown: a daemon a test leaks must not hold a pipe open
	timeout 900 "$@" >"$out" 2>&1
	rc=$?
	cat "$out"
	if [ "$rc" -eq 77 ]; then
		w=$(required "$out")
		if [ -n "$w" ]; then
			echo "FAIL: $label skipped for want of $w, which SNAPKV_REQUIRE requires"
			rc=1
		fi
	fi
	case $rc in
	0) pass=$((pass + 1)) ;;
	77)
		skipped=$((skipped + 1))
		local why
		why=$(grep -o 'SKIP([a-z0-9_-]*): .*' "$out" | sort -u | paste -sd ';' | sed 's/;/; /g')
		skips+=("$label: ${why:-exit 77, no reason printed}")
		;;
	*) fail=$((fail + 1)); failed+=("$label (exit $rc)") ;;
	esac
}
for p in "${progs[@]}"; do run "$p" "$p"; done
for s in "${scripts[@]}"; do run "$s" bash "$s"; done
echo
echo "$pass passed, $fail failed, $skipped skipped"
[ $skipped -eq 0 ] || printf 'SKIPPED: %s\n' "${skips[@]}"
[ $fail -eq 0 ] || { printf 'FAILED: %s\n' "${failed[@]}"; exit 1; }

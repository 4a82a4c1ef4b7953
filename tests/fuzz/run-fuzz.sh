#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs each libFuzzer target for SECONDS over its seeds (tests/fuzz/corpus/
# <target>/, read only) and its growing corpus (FUZZ_BUILD/corpus/<target>/),
# then replays every regression input (tests/fuzz/regress/<target>/) once.
# Prints one summary line per target; exits 1 when any target crashed,
# leaked or failed a property, or a regression input does.
#   run-fuzz.sh FUZZ_BUILD SECONDS TARGET...
set -u
fb=$1; secs=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
fail=0; failed=()
# per target: longest input worth trying (frames carry up to a few layers and
# a block table; files and configs a few KiB; a ring is its layout + SQEs)
max_len() {
	case $1 in
	frame) echo 16384 ;; ring) echo 2048 ;; compact-diff) echo 512 ;; *) echo 8192 ;;
	esac
}
for t in "$@"; do
	bin=$fb/fuzz-$t
	work=$fb/corpus/$t
	art=$fb/crashes/$t
	log=$fb/fuzz-$t.log
	mkdir -p "$work" "$art"
	seeds=()
	[ -d "$here/corpus/$t" ] && seeds+=("$here/corpus/$t")
	# -timeout: one input stuck 10 s is a hang, reported as a crash
	timeout $((secs + 60)) "$bin" -max_total_time="$secs" -max_len="$(max_len "$t")" \
		-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$art/" "$work" "${seeds[@]}" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
	ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
	corp=$(find "$work" -type f | wc -l)
	reg=0
	if [ -d "$here/regress/$t" ] && [ -n "$(ls -A "$here/regress/$t")" ]; then
		reg=$(find "$here/regress/$t" -type f | wc -l)
		"$bin" "$here/regress/$t"/* >>"$log" 2>&1 || rc=1
	fi
	printf 'fuzz-%-12s %ss: %s execs, cov %s, ft %s, corpus %s, %s regression inputs: %s\n' \
		"$t" "$secs" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$corp" "$reg" \
		"$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see $log and $art/)")"
	if [ $rc -ne 0 ]; then
		fail=1; failed+=("$t")
		grep -m5 -E 'ERROR|SUMMARY|fuzz-[a-z]*: ' "$log" | sed 's/^/    /'
	fi
done
[ $fail -eq 0 ] || { echo "fuzz: FAILED: ${failed[*]}"; exit 1; }
echo "fuzz: ${#@} targets ok"

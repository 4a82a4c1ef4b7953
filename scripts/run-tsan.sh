#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run the daemon-driving test programs built with ThreadSanitizer (make
# check-tsan): every snapkvd they start inherits TSAN_OPTIONS, and a race
# report from any process (daemon, engines, the test) fails the run.
set -u -o pipefail
BUILD=${BUILD:-build-tsan}
logs=$BUILD/tsan-logs
rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
export TSAN_OPTIONS="halt_on_error=0:exitcode=89:log_path=$logs/tsan:log_exe_name=1:second_deadlock_stack=1"
rc=0
"$(dirname "$0")/run-tests.sh" "$@" 2>&1 | tee "$BUILD/tsan-output.log" || rc=1
reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
	echo
	echo "thread sanitizer reports: $(echo "$reports" | grep -c .)"
	for f in $reports; do
		echo "=== $f"
		cat "$f"
	done
	rc=1
else
	echo "thread sanitizer reports: none"
fi
exit $rc

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One prepared run of the CUDA backend on a GPU machine (sized for an H200
# with 16 cores; every step, the build included, runs under a timeout; the
# parts' timeouts are printed: the build with check fits the machine's 600 s
# cap per command, the build with sanitize and bench too, so a capped machine
# runs it twice, PARTS=check then PARTS=sanitize,bench). The strictest
# script in the tree: the emulator cannot see
# stream ordering, copy kinds, sticky errors or co-residency, so this is
# where they are checked. It builds everything it needs or fails; a step
# whose program is missing fails; any skip is a failure (SNAPKV_REQUIRE=all,
# and exit 77 counts as failed).
#   check:    the loader, host-vs-CUDA agreement on random tensors (both
#             scoring paths), the budget modes bit for bit against the host,
#             the two-process engine/daemon IPC test, and every suite that
#             says it runs the same on a GPU: snapkvd --backend cuda ==
#             host bytes, engine GPU buffers and prefill waits, and the
#             daemon's bad-input, fuzz, paged, budget and group suites
#             (test-daemon-suites-cuda-emu.sh) against the real plugin; on a
#             machine with two GPUs or more, engines on devices 0 and 1 of
#             one daemon (test-daemon-devices-emu.sh; with one GPU it is
#             listed as SKIP, not failed, unless STRICT_MULTIGPU=1)
#   sanitize: compute-sanitizer over the kernels (memcheck, racecheck,
#             synccheck on gpu-agree's small cases) and over the daemon's
#             CUDA path (memcheck: snapkvd under it in test-daemon-cuda-emu.sh)
#   bench:    the Llama-3-8B-shape benchmark beside the HBM roofline
#             (two-pass, then fused); its 2x target is reported, not enforced
# Everything goes to a log file as well as to stdout; the closing summary
# has one line per step and names device, date and numbers.
#
#   tests/gpu/run.sh            # log: $OUT/gpu-run.log if $OUT is set, else build/gpu-run.log
#   tests/gpu/run.sh --dry-run  # list what it would build and run; needs no GPU (make check)
#   PARTS=check,sanitize tests/gpu/run.sh   # some parts (default: all three)
#   LOG=/path/x.log JOBS=8 tests/gpu/run.sh
#   STRICT_MULTIGPU=1 tests/gpu/run.sh      # fewer than two GPUs fails the run
#
# Exit status: 0 when every step passed, 1 otherwise, 2 when there is no GPU
# or no nvcc.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 2
DRY=0
case ${1:-} in
--dry-run) DRY=1 ;;
"") ;;
*)
	echo "usage: tests/gpu/run.sh [--dry-run]"
	exit 2
	;;
esac
BUILD=${BUILD:-build}
JOBS=${JOBS:-16}
PARTS=${PARTS:-check,sanitize,bench}
part() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
# every skip below is a failure
export SNAPKV_REQUIRE=all
if [ $DRY -eq 0 ]; then
	LOG=${LOG:-${OUT:-$BUILD}/gpu-run.log}
	mkdir -p "$(dirname "$LOG")" "$BUILD"
	: >"$LOG"
	exec > >(tee -a "$LOG") 2>&1
fi

t_start=$(date +%s)
step_rc=()
step_name=()
note() { printf '\n=== %s (%ss)\n' "$*" "$(($(date +%s) - t_start))"; }
record() { step_name+=("$1"); step_rc+=("$2"); }

t_start=$(date +%s)
step_rc=()
step_name=()
note() { printf '\n=== %s (%ss)\n' "$*" "$(($(date +%s) - t_start))"; }
record() { step_name+=("$1"); step_rc+=("$2"); }
# the one step a machine may skip (one GPU where it needs two): its name
SKIP_OK=

# Step timeouts (seconds), by part; each part's sum stays under 600 s.
T_BUILD=150 T_LOADER=15 T_AGREE=65 T_BUDGET=15 T_IPC=25 T_DAEMON=50 T_GPUBUF=70 T_SUITES=150
T_DEVICES=40
T_SAN_MEM=100 T_SAN_RACE=80 T_SAN_SYNC=50 T_SAN_DAEMON=120
T_BENCH=45 T_BENCH_FUSED=40
echo "parts: $PARTS; timeouts: build $T_BUILD s, check $((T_LOADER + T_AGREE + T_BUDGET + T_IPC + \
	T_DAEMON + T_GPUBUF + T_SUITES + T_DEVICES)) s, sanitize $((T_SAN_MEM + T_SAN_RACE + T_SAN_SYNC + \
	T_SAN_DAEMON)) s, bench $((T_BENCH + T_BENCH_FUSED)) s"

NVCC=${NVCC:-$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
CSAN=${CSAN:-$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)}
if [ $DRY -eq 0 ]; then
	note "snapkvd CUDA backend run"
	echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "host:    $(uname -n) ($(nproc) cores)"
	echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader
	else
		echo "nvidia-smi: not found"
	fi
	if [ -z "$NVCC" ]; then
		echo "FATAL: nvcc not found (set NVCC=/path/to/nvcc)"
		exit 2
	fi
	"$NVCC" --version | tail -n 2
fi

# Everything the steps run, built in one go: a failed build is a failed run.
NEED=("$BUILD/libskv-cuda.so" "$BUILD/snapkvd" "$BUILD/snapkvctl" "$BUILD/examples/gen-layer"
	"$BUILD/kernels/cuda/test-skv-cuda-loader" "$BUILD/tests/gpu/gpu-agree"
	"$BUILD/tests/gpu/gpu-budget" "$BUILD/tests/gpu/gpu-ipc" "$BUILD/tests/gpu/gpu-engine"
	"$BUILD/tests/gpu/gpu-bench" "$BUILD/tests/test-daemon-badinput"
	"$BUILD/tests/test-daemon-fuzz" "$BUILD/tests/test-daemon-paged"
	"$BUILD/tests/test-daemon-budget" "$BUILD/tests/test-daemon-group")
if [ $DRY -eq 1 ]; then
	echo "build: make -j$JOBS CUDA=1 all (${#NEED[@]} programs the steps run must be there)"
else
	note "build: make -j$JOBS CUDA=1 (everything; the steps' programs must be there)"
	if ! timeout $T_BUILD make -j"$JOBS" BUILD="$BUILD" NVCC="$NVCC" CUDA=1 \
		>"$BUILD/gpu-run-make.log" 2>&1; then
		tail -n 30 "$BUILD/gpu-run-make.log"
		echo "FATAL: the build failed (log: $BUILD/gpu-run-make.log)"
		exit 1
	fi
	for f in "${NEED[@]}"; do
		[ -e "$f" ] || {
			echo "FATAL: $f was not built"
			exit 1
		}
	done
	echo "build: ok"
fi

run_step() { # name timeout command...
	local name=$1 limit=$2
	shift 2
	if [ $DRY -eq 1 ]; then
		printf 'step: %s\n  %s\n' "$name" "$*"
		return 0
	fi
	note "$name"
	timeout "$limit" "$@"
	local rc=$?
	[ $rc -eq 124 ] && echo "TIMEOUT after ${limit}s"
	if [ $rc -eq 77 ] && [ "$name" = "$SKIP_OK" ]; then
		echo "SKIPPED: this machine has one GPU (STRICT_MULTIGPU=1 makes it a failure)"
	elif [ $rc -eq 77 ]; then
		echo "SKIPPED: a skip is a failure here"
	fi
	record "$name" $rc
	return $rc
}
# csan TOOL PROGRAM ARGS...: under compute-sanitizer, any report an error exit
csan() {
	local tool=$1
	shift
	"$CSAN" --tool "$tool" --error-exitcode 99 --print-limit 20 "$@"
}
# the daemon under compute-sanitizer memcheck, as test-daemon-cuda-emu.sh's $SNAPKVD
SAN_SNAPKVD=$BUILD/snapkvd-under-memcheck
if [ $DRY -eq 0 ] && part sanitize; then
	printf '#!/bin/sh\nexec "%s" --tool memcheck --error-exitcode 99 --print-limit 20 "%s" "$@"\n' \
		"$CSAN" "$(realpath "$BUILD/snapkvd")" >"$SAN_SNAPKVD"
	chmod +x "$SAN_SNAPKVD"
fi
SMALL=(snapkv-f32-expand snapkv-f16-d64-1k h2o-bf16)

if part check; then
	run_step "loader (dlopen of the plugin, device open)" $T_LOADER \
		env BUILD="$BUILD" "$BUILD/kernels/cuda/test-skv-cuda-loader"
	# every case on both scoring paths: two-pass, then fused (bit-identical where
	# votes are plain stores; the reason and the fallback where fused does not apply)
	run_step "agreement: host libskv vs CUDA (two-pass and fused scoring) on random tensors" \
		$T_AGREE "$BUILD/tests/gpu/gpu-agree"
	if [ $? -eq 2 ]; then
		echo "FATAL: no usable CUDA device"
		exit 2
	fi
	# every budget mode (layers, pyramid, heads, mass, mass-heads, fallback) on
	# exact-vote cases: every output byte, kept counts, C*, fallback and
	# min_mass equal to the host's; the refusals with the host's messages
	run_step "budget modes: host libskv vs CUDA bit for bit (two-pass and fused scoring)" \
		$T_BUDGET bash -c "'$BUILD/tests/gpu/gpu-budget' --cases 40 && \
		'$BUILD/tests/gpu/gpu-budget' --cases 20 --seed 5 --score fused"
	run_step "two processes: engine VMM fd + IPC handle -> daemon -> arena fd" $T_IPC \
		"$BUILD/tests/gpu/gpu-ipc"
	run_step "daemon: snapkvd --backend cuda == host bytes (snapkvctl)" $T_DAEMON \
		env BUILD="$BUILD" PLUGIN="$BUILD/libskv-cuda.so" bash tests/gpu/emu/test-daemon-cuda-emu.sh
	# gpu-engine's prefill waits run for real here: a flag word, and an IPC event
	# recorded after an async upload (cudaMemcpyAsync from pinned memory, then
	# cudaEventRecord), one held pending on a stream waiting for a flag
	run_step "daemon: engine GPU buffers == host; prefill flag + IPC event waits" \
		$T_GPUBUF \
		env BUILD="$BUILD" PLUGIN="$BUILD/libskv-cuda.so" ENGINE="$BUILD/tests/gpu/gpu-engine" \
		bash tests/gpu/emu/test-daemon-gpubuf-emu.sh
	run_step "daemon suites (bad input, fuzz, paged, budget, group) on --backend cuda" \
		$T_SUITES env BUILD="$BUILD" PLUGIN="$BUILD/libskv-cuda.so" \
		bash tests/gpu/emu/test-daemon-suites-cuda-emu.sh
	# every GPU of the node: engines on devices 0 and 1 of one daemon, each
	# compaction on its own device, per-device totals, a request spanning
	# devices refused; a one-GPU machine skips it unless STRICT_MULTIGPU=1
	SKIP_OK="daemon: two GPUs, each engine imported and compacted on its own device"
	[ "${STRICT_MULTIGPU:-0}" = 1 ] && SKIP_OK=
	run_step "daemon: two GPUs, each engine imported and compacted on its own device" \
		$T_DEVICES env BUILD="$BUILD" PLUGIN="$BUILD/libskv-cuda.so" \
		ENGINE="$BUILD/tests/gpu/gpu-engine" \
		SNAPKV_REQUIRE="$([ -n "$SKIP_OK" ] && echo cuda || echo all)" \
		bash tests/gpu/emu/test-daemon-devices-emu.sh
fi
if part sanitize; then
	if [ $DRY -eq 0 ] && [ -z "$CSAN" ]; then
		echo "FAIL: compute-sanitizer not found (set CSAN=/path/to/compute-sanitizer)"
		record "compute-sanitizer present" 1
	else
		run_step "compute-sanitizer memcheck: kernels (${SMALL[*]}, both paths)" $T_SAN_MEM \
			csan memcheck --leak-check full "$BUILD/tests/gpu/gpu-agree" --paths twopass,fused \
			"${SMALL[@]}"
		run_step "compute-sanitizer racecheck: kernels (shared memory, both paths)" \
			$T_SAN_RACE csan racecheck "$BUILD/tests/gpu/gpu-agree" --paths twopass,fused \
			"${SMALL[@]}"
		run_step "compute-sanitizer synccheck: kernels (barriers, both paths)" $T_SAN_SYNC \
			csan synccheck "$BUILD/tests/gpu/gpu-agree" --paths twopass,fused "${SMALL[@]}"
		run_step "compute-sanitizer memcheck: snapkvd --backend cuda (test-daemon-cuda-emu)" \
			$T_SAN_DAEMON env BUILD="$BUILD" PLUGIN="$BUILD/libskv-cuda.so" \
			SNAPKVD="$SAN_SNAPKVD" bash tests/gpu/emu/test-daemon-cuda-emu.sh
	fi
fi
if part bench; then
	# two-pass first, in a process of its own: a fused kernel that hangs loses no numbers
	run_step "benchmark: two-pass scoring, Llama-3-8B shape, L = 8192 and 32768" $T_BENCH \
		"$BUILD/tests/gpu/gpu-bench" --score twopass 8192 32768
	run_step "benchmark: fused scoring, the same shapes" $T_BENCH_FUSED \
		"$BUILD/tests/gpu/gpu-bench" --score fused 8192 32768
fi
[ $DRY -eq 1 ] && exit 0

note "summary"
echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if command -v nvidia-smi >/dev/null 2>&1; then
	echo "device:  $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
fi
fail=0
for i in "${!step_name[@]}"; do
	skipped=0
	[ "${step_rc[$i]}" -eq 77 ] && [ "${step_name[$i]}" = "$SKIP_OK" ] && skipped=1
	if [ "${step_rc[$i]}" -eq 0 ]; then
		s=PASS
	elif [ $skipped -eq 1 ]; then
		s="SKIP (one GPU)"
	else
		s="FAIL (rc ${step_rc[$i]})"
	fi
	printf '  %-72s %s\n' "${step_name[$i]}" "$s"
	[ "${step_rc[$i]}" -eq 0 ] || [ $skipped -eq 1 ] || fail=1
done
if part bench; then
	echo "benchmark lines:"
	grep -E '^(HBM|L=)' "$LOG" | sed 's/^/  /'
fi
echo "elapsed: $(($(date +%s) - t_start))s; log: $LOG"
exit $fail

# SPDX-License-Identifier: MIT
# Sourced by the shell tests: counts checks and prints them one a line, and
# skips a script visibly (skip, below).
# ok/not_ok record one check; each script ends with
#   echo "NAME: $pass passed, $fail failed"; [ $fail -eq 0 ]
pass=0
fail=0
ok() {
	pass=$((pass + 1))
	echo "  ok   $*"
}
not_ok() {
	fail=$((fail + 1))
	echo "  FAIL $*"
}

# skv_required WHAT: whether SNAPKV_REQUIRE (comma-separated, or "all")
# names WHAT, so that a skip for want of it is a failure.
skv_required() {
	case ",${SNAPKV_REQUIRE:-}," in
	*",$1,"* | *,all,*) return 0 ;;
	esac
	return 1
}
# skip WHAT REASON...: this script cannot run here for want of WHAT (cuda,
# python, model, root, ...). Prints "SKIP(WHAT): REASON" and exits 77, which
# scripts/run-tests.sh counts and lists as a skip, never as a pass; where
# SNAPKV_REQUIRE names WHAT it prints "FAIL required WHAT: REASON" and exits 1.
skip() {
	local what=$1
	shift
	if skv_required "$what"; then
		echo "FAIL required $what (SNAPKV_REQUIRE=$SNAPKV_REQUIRE): $*"
		exit 1
	fi
	echo "SKIP($what): $*"
	exit 77
}
# need_cuda FILE...: the CUDA build's FILEs (plugin, emulator), or a skip for
# want of cuda; a failure where make said CUDA=1, which should have built them.
need_cuda() {
	local f
	for f; do
		[ -e "$f" ] && continue
		if [ "${CUDA:-}" = 1 ]; then
			echo "FAIL: $f not built although CUDA=1"
			exit 1
		fi
		skip cuda "$f not built (CUDA=0 or no nvcc)"
	done
}
# need_built FILE...: FILEs every build makes; missing is a failure, not a skip.
need_built() {
	local f
	for f; do
		[ -e "$f" ] && continue
		echo "FAIL: $f not built"
		exit 1
	done
}
# skip_part WHAT REASON...: one part of a script cannot run here; the rest
# goes on, and tally_exit ends the script with 77 (a skip, not a pass). A
# failed check where SNAPKV_REQUIRE names WHAT.
skipped=0
skip_part() {
	local what=$1
	shift
	if skv_required "$what"; then
		not_ok "required $what (SNAPKV_REQUIRE=$SNAPKV_REQUIRE): $*"
		return
	fi
	skipped=$((skipped + 1))
	echo "  SKIP($what): $*"
}
# tally_exit: exit 1 if a check failed, 77 if a part was skipped, else 0.
tally_exit() {
	[ "$fail" -eq 0 ] || exit 1
	[ "$skipped" -eq 0 ] || exit 77
	exit 0
}

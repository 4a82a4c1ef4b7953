# SPDX-License-Identifier: MIT
# Sourced by the shell tests: counts checks and prints them one a line.
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

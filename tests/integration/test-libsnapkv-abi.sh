#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-libsnapkv-abi.sh - libsnapkv's file names agree with its ABI: soname
# libsnapkv.so.1, the real file libsnapkv.so.1.MINOR.PATCH with MINOR the
# newest SNAPKV_1.MINOR version node the library defines (a node added to
# client/libsnapkv/libsnapkv.map must bump the file's minor), every exported
# function bound to the version node the map gives it, the nodes chained one
# to the next, and every export declared in client/libsnapkv/snapkv.h.
set -u
BUILD=${BUILD:-build}
lib=$BUILD/libsnapkv.so
. "$(dirname "$0")/../tally.sh"

soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = libsnapkv.so.1 ] && ok "soname $soname" || not_ok "soname '$soname'"
real=$(readlink "$BUILD/libsnapkv.so.1")
nodes=$(readelf -V "$lib" | grep -o 'Name: SNAPKV_1\.[0-9]*' | sed 's/Name: SNAPKV_1\.//' |
	sort -n -u)
newest=$(echo "$nodes" | tail -1)
mapnewest=$(grep -o '^SNAPKV_1\.[0-9]*' client/libsnapkv/libsnapkv.map | sed 's/SNAPKV_1\.//' | sort -n |
	tail -1)
[ -n "$newest" ] && [ "$newest" = "$mapnewest" ] &&
	ok "version nodes 1.{$(echo $nodes | tr ' ' ',')} as in libsnapkv.map" ||
	not_ok "library nodes '$nodes', map's newest '$mapnewest'"
case "$real" in
libsnapkv.so.1."$newest".[0-9]*) ok "real file $real matches SNAPKV_1.$newest" ;;
*) not_ok "real file $real, but the newest version node is SNAPKV_1.$newest" ;;
esac
unversioned=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 !~ /@/ {print $3}')
[ -z "$unversioned" ] && ok "every exported function has a version" ||
	not_ok "unversioned exports: $unversioned"
n=$(nm -D --defined-only "$lib" | awk '$2 == "T"' | grep -vc '@SNAPKV_1\.')
[ "$n" -eq 0 ] && ok "exports only skv_* under SNAPKV_1.x" || not_ok "$n exports outside SNAPKV_1.x"

# Each name the map lists is exported at the node the map puts it in (a name
# moved to a newer node would break programs linked against the old one).
map_syms=$(awk '/^SNAPKV_1\.[0-9]+ *\{/ {node = $1} /^[ \t]+skv_[a-z0-9_]+;/ {
	gsub(/[ \t;]/, ""); print $0 "@@" node }' client/libsnapkv/libsnapkv.map | sort)
lib_syms=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sort)
[ -n "$map_syms" ] && [ "$map_syms" = "$lib_syms" ] &&
	ok "$(echo "$map_syms" | wc -l) exports, each at its map node" ||
	not_ok "exports differ from the map: $(diff <(echo "$map_syms") <(echo "$lib_syms") |
		grep '^[<>]' | tr '\n' ' ')"
# The paged-output calls (SNAPKV_1.5) are where engines built for them look.
for f in skv_buffer_alloc_flags skv_buffer_register_fd_flags skv_buffer_flags \
	skv_buffer_restore skv_cache_k_slot skv_cache_block_offset skv_cache_block_run \
	skv_cache_map_blocks; do
	echo "$lib_syms" | grep -qx "$f@@SNAPKV_1.5" && ok "$f@@SNAPKV_1.5" ||
		not_ok "$f is not exported at SNAPKV_1.5"
done
# The budget-mode calls (SNAPKV_1.6).
for f in skv_cache_budget skv_cache_head_kept skv_cache_head_capacity skv_cache_head_start \
	skv_cache_layer_mass_min skv_cache_layer_mass_mean; do
	echo "$lib_syms" | grep -qx "$f@@SNAPKV_1.6" && ok "$f@@SNAPKV_1.6" ||
		not_ok "$f is not exported at SNAPKV_1.6"
done
# The decision-group call (SNAPKV_1.7).
echo "$lib_syms" | grep -qx "skv_compact_desc_group@@SNAPKV_1.7" &&
	ok "skv_compact_desc_group@@SNAPKV_1.7" ||
	not_ok "skv_compact_desc_group is not exported at SNAPKV_1.7"
# fp8 K/V: the scales a cache carries (SNAPKV_1.8).
echo "$lib_syms" | grep -qx "skv_cache_kv_scale@@SNAPKV_1.8" &&
	ok "skv_cache_kv_scale@@SNAPKV_1.8" ||
	not_ok "skv_cache_kv_scale is not exported at SNAPKV_1.8"
# Writeback without copies or per-token traffic (SNAPKV_1.9).
for f in skv_cache_grow_blocks skv_cache_release_appended; do
	echo "$lib_syms" | grep -qx "$f@@SNAPKV_1.9" && ok "$f@@SNAPKV_1.9" ||
		not_ok "$f is not exported at SNAPKV_1.9"
done
# Nodes chain: SNAPKV_1.N inherits SNAPKV_1.(N-1), none skipped.
chain=$(awk '/^} SNAPKV_1\.[0-9]+;/ {gsub(/[};]/, ""); print $1}' client/libsnapkv/libsnapkv.map |
	sed 's/SNAPKV_1\.//' | tr '\n' ' ')
want=$(seq 0 $((mapnewest - 1)) | tr '\n' ' ')
[ "$chain" = "$want" ] && ok "nodes chain 1.0 .. 1.$mapnewest" ||
	not_ok "node inheritance '$chain', expected '$want'"
# Every export is declared in the one public header.
undeclared=
for f in $(echo "$lib_syms" | sed 's/@.*//'); do
	grep -q "[ *]$f(" client/libsnapkv/snapkv.h || undeclared="$undeclared $f"
done
[ -z "$undeclared" ] && ok "every export declared in snapkv.h" ||
	not_ok "exports not in snapkv.h:$undeclared"

echo "test-libsnapkv-abi: $pass passed, $fail failed"
[ $fail -eq 0 ]

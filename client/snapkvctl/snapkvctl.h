/* SPDX-License-Identifier: MIT */
/*
 * snapkvctl.h - subcommands of the snapkvctl CLI and the helpers they share.
 *
 * To add a subcommand: write `int ctl_<name>(int argc, char **argv)` in its
 * own client/snapkvctl/ctl-<name>.c (picked up by its build.mk), declare it below
 * and add one line to the table in snapkvctl.c. argv[0] is the
 * subcommand name; the function returns the process exit code:
 * CTL_EXIT_OK, CTL_EXIT_FAIL (the operation failed at run time: I/O, out of
 * memory, daemon unreachable) or CTL_EXIT_USAGE (bad options or bad input:
 * malformed file, invalid parameters). Errors are one line on stderr,
 * "snapkvctl <cmd>: <what>: <why>", printed with ctl_err().
 */
#ifndef SNAPKVCTL_H
#define SNAPKVCTL_H

#include <stdint.h>
#include <stdio.h>

#define CTL_EXIT_OK    0
#define CTL_EXIT_FAIL  1
#define CTL_EXIT_USAGE 2

struct ctl_cmd {
	const char *name;
	const char *summary; /* one line for `snapkvctl --help` */
	int (*run)(int argc, char **argv);
};

/* Subcommands (one file each; others declare theirs in their own header,
 * e.g. ctl-daemon.h). */
int ctl_compact(int argc, char **argv);	 /* ctl-compact.c */
int ctl_inspect(int argc, char **argv);	 /* ctl-inspect.c */
int ctl_pressure(int argc, char **argv); /* ctl-pressure.c */
int ctl_top(int argc, char **argv);	 /* ctl-top.c */

/* "snapkvctl <cmd>: " + message + newline on stderr. */
void ctl_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Strict decimal parse of `s` into [min, max]: no sign, no spaces, no
 * trailing junk, no overflow. 0 or -EINVAL/-ERANGE.
 */
int ctl_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);
int ctl_parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret);

/* ctl-budget.c. A finite decimal number; 0 or -EINVAL. */
int ctl_parse_float(const char *s, float *ret);
/* --budget SPEC into p (budget mode and its parameters); 0 or an exit code
 * after one line on stderr. Ranges are left to skv_plan(). */
struct skv_params;
int ctl_parse_budget(const char *cmd, const char *spec, struct skv_params *p);
/* The mass modes' unset C_min (W + 1), C_max (C) and step ((C - W) / 16). */
void ctl_budget_defaults(struct skv_params *p);

/* Index of `s` in the NULL-terminated `names`, or -EINVAL. */
int ctl_parse_choice(const char *s, const char *const *names);

/* Positions as "0-2, 7, 9-40", at most max_ranges ranges, then a count. */
void ctl_print_ranges(FILE *f, const int32_t *pos, uint32_t n, uint32_t max_ranges);

/* A tensor's shape as "[2, 8, 64]", cut short to fit len. */
struct skv_st_tensor;
void ctl_fmt_shape(const struct skv_st_tensor *t, char *buf, size_t len);

/* ctl-fmt.c. "1.5 GiB", "512 B": IEC units, 3 significant digits. */
void ctl_fmt_iec(uint64_t bytes, char *buf, size_t len);
/* "1.50 GiB", "512 B": always two decimals, for tables whose columns line
 * up (status, ledger). Returns buf. */
const char *ctl_fmt_iec_fixed(uint64_t bytes, char *buf, size_t len);
/* "4.1 ms", "1.20 s", "-" for NaN. */
void ctl_fmt_seconds(double s, char *buf, size_t len);

/* "normal", "high", "critical", "?": levels numbered as enum
 * skv_pressure_level (snapkv.h) and snapkv.v1.PressureLevel. */
const char *ctl_pressure_name(int level);
/* The snapkvd_pressure_level metric's value as an enum skv_pressure_level. */
int ctl_pressure_from_metric(double v);

/* ctl-json.c. JSON output (jansson): a number, null when not finite (JSON has no NaN);
 * a string, null when absent or not UTF-8. New references. */
typedef struct json_t json_t;
json_t *ctl_json_real(double v);
json_t *ctl_json_str(const char *s);
/* Print j (indented, keys in order) and a newline on stdout, and drop the
 * reference. j NULL means out of memory. The exit code. */
int ctl_json_print(const char *cmd, json_t *j);

#endif /* SNAPKVCTL_H */

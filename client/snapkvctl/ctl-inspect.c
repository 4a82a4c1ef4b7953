// SPDX-License-Identifier: MIT
/*
 * ctl-inspect.c - `snapkvctl inspect FILE`: what a safetensors file holds
 * (tensors, metadata), and for a compact-cache file written by `compact`
 * the retained mass per layer and, with --show H, the kept positions of the
 * first H heads. --json prints tensors and metadata for tools. The file is
 * checked by the same strict reader as compact's input.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv-safetensors.h"
#include "snapkvctl.h"

#define CMD "inspect"

static void usage(FILE *f)
{
	fprintf(f, "usage: snapkvctl inspect FILE [--show H] [--json]\n"
		   "\n"
		   "Lists the tensors and metadata of a safetensors file. For a compact cache\n"
		   "(format=snapkv-compact, as `snapkvctl compact` writes) also prints the\n"
		   "retained mass per layer and, with --show H, the kept positions of the\n"
		   "first H stored heads of each layer. --json: tensors and metadata as JSON.\n");
}

/* Names and values come from the file: no control bytes to the terminal. */
static void put_safe(const char *s, int width)
{
	int n = 0;
	for (; *s; s++, n++)
		putchar((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s);
	for (; n < width; n++)
		putchar(' ');
}

static int print_json(const struct skv_st_file *f)
{
	json_t *root = json_object(), *ts = json_array(), *meta = json_object();
	int r = -ENOMEM;

	if (!root || !ts || !meta || json_object_set_new(root, "tensors", ts) ||
	    json_object_set_new(root, "metadata", meta)) {
		ts = meta = NULL;
		goto out;
	}
	for (size_t i = 0; i < skv_st_count(f); i++) {
		const struct skv_st_tensor *t = skv_st_at(f, i);
		json_t *shape = json_array();
		json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", t->name, "dtype",
				      skv_st_dtype_name(t->dtype), "shape", shape, "offset",
				      (json_int_t)t->offset, "bytes", (json_int_t)t->n_bytes);
		if (!o || json_array_append_new(ts, o))
			goto out;
		for (uint32_t d = 0; d < t->rank; d++)
			if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])))
				goto out;
	}
	for (size_t i = 0; i < skv_st_meta_count(f); i++) {
		const struct skv_st_meta *m = skv_st_meta_at(f, i);
		if (json_object_set_new(meta, m->key, json_string(m->value)))
			goto out;
	}
	if (json_dumpf(root, stdout, JSON_INDENT(2) | JSON_SORT_KEYS) < 0) {
		r = -EIO;
		goto out;
	}
	putchar('\n');
	r = 0;
out:
	json_decref(root);
	return r;
}

/* Retained mass and kept positions of a compact-cache file. */
static int print_compact(const struct skv_st_file *f, uint32_t show)
{
	for (uint32_t l = 0;; l++) {
		char name[64];
		snprintf(name, sizeof(name), "layers.%" PRIu32 ".indices", l);
		const struct skv_st_tensor *ti = skv_st_find(f, name);
		snprintf(name, sizeof(name), "layers.%" PRIu32 ".retained_mass", l);
		const struct skv_st_tensor *tm = skv_st_find(f, name);
		if (!ti && !tm)
			return 0;
		snprintf(name, sizeof(name), "layers.%" PRIu32 ".kept", l);
		const struct skv_st_tensor *tk = skv_st_find(f, name);
		if (!ti || !tm || ti->dtype != SKV_ST_I32 || ti->rank != (tk ? 1 : 2) ||
		    tm->dtype != SKV_ST_F32 || tm->rank != 1 ||
		    (!tk && (tm->shape[0] != ti->shape[0] || ti->shape[1] > UINT32_MAX)) ||
		    (uintptr_t)ti->data % 4 || (uintptr_t)tm->data % 4) {
			ctl_err(CMD,
				"layer %" PRIu32 ": indices or retained_mass missing or malformed",
				l);
			return -EBADMSG;
		}
		const int32_t *idx = ti->data, *kc = NULL;
		const float *mass = tm->data;
		uint64_t hs = tm->shape[0];
		uint32_t kept = tk ? 0 : (uint32_t)ti->shape[1];
		if (tk) {
			/* ragged (budget modes heads, mass-heads): counts per head that
			 * add up to the indices */
			uint64_t sum = 0;
			bool ok = tk->dtype == SKV_ST_I32 && tk->rank == 1 && tk->shape[0] == hs &&
				  (uintptr_t)tk->data % 4 == 0;
			kc = tk->data;
			for (uint64_t h = 0; ok && h < hs; h++) {
				ok = kc[h] >= 0;
				sum += ok ? (uint64_t)kc[h] : 0;
			}
			if (!ok || sum != ti->shape[0]) {
				ctl_err(CMD,
					"layer %" PRIu32 ": kept counts malformed or not adding up "
					"to the %" PRIu64 " indices",
					l, ti->shape[0]);
				return -EBADMSG;
			}
		}
		double sum = 0, mn = INFINITY;
		uint64_t cnt = 0;
		for (uint64_t h = 0; h < hs; h++)
			if (!isnan(mass[h])) {
				sum += mass[h];
				cnt++;
				mn = mass[h] < mn ? mass[h] : mn;
			}
		if (kc)
			printf("layer %" PRIu32 ": %" PRIu64 " heads, ragged: %" PRIu64
			       " kept in all, retained mass ",
			       l, hs, ti->shape[0]);
		else
			printf("layer %" PRIu32 ": %" PRIu64 " heads x %" PRIu32
			       " kept, retained mass ",
			       l, hs, kept);
		if (cnt)
			printf("min %.4f mean %.4f\n", mn, sum / (double)cnt);
		else
			printf("n/a\n");
		for (uint64_t h = 0, at = 0; h < hs && h < show; h++) {
			uint32_t n = kc ? (uint32_t)kc[h] : kept;
			if (kc)
				printf("  head %" PRIu64 " kept %" PRIu32 ": ", h, n);
			else
				printf("  head %" PRIu64 " kept: ", h);
			ctl_print_ranges(stdout, idx + (kc ? at : h * kept), n, 16);
			at += n;
		}
	}
}

int ctl_inspect(int argc, char **argv)
{
	static const struct option o[] = {{"show", required_argument, NULL, 's'},
					  {"json", no_argument, NULL, 'j'},
					  {"help", no_argument, NULL, 'h'},
					  {NULL, 0, NULL, 0}};
	struct skv_st_file *f = NULL;
	struct skv_st_error err = {{0}};
	uint32_t show = 0;
	bool json = false;
	int c, r;

	opterr = 0;
	optind = 0;
	while ((c = getopt_long(argc, argv, "h", o, NULL)) != -1) {
		switch (c) {
		case 's':
			if (ctl_parse_u32(optarg, 0, UINT32_MAX, &show) < 0) {
				ctl_err(CMD, "--show: \"%s\" is not a non-negative decimal integer",
					optarg);
				return CTL_EXIT_USAGE;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return CTL_EXIT_OK;
		default:
			ctl_err(CMD, "unknown option or missing value: %s (see --help)",
				argv[optind - 1]);
			return CTL_EXIT_USAGE;
		}
	}
	if (argc - optind != 1) {
		ctl_err(CMD, "expected one FILE (see --help)");
		return CTL_EXIT_USAGE;
	}
	const char *path = argv[optind];
	r = skv_st_open(path, &f, &err);
	if (r < 0) {
		ctl_err(CMD, "%s: %s", path, err.msg);
		return r == -ENOMEM || r == -EIO ? CTL_EXIT_FAIL : CTL_EXIT_USAGE;
	}
	if (json) {
		r = print_json(f);
		if (r < 0)
			ctl_err(CMD, "cannot print JSON: %s", strerror(-r));
		skv_st_close(f);
		return r < 0 ? CTL_EXIT_FAIL : CTL_EXIT_OK;
	}
	printf("%s: %zu tensors, %" PRIu64 " bytes of data\n", path, skv_st_count(f),
	       skv_st_data_size(f));
	for (size_t i = 0; i < skv_st_count(f); i++) {
		const struct skv_st_tensor *t = skv_st_at(f, i);
		char sh[160];
		ctl_fmt_shape(t, sh, sizeof(sh));
		printf("  ");
		put_safe(t->name, 32);
		printf(" %-4s %s\n", skv_st_dtype_name(t->dtype), sh);
	}
	if (skv_st_meta_count(f)) {
		printf("metadata:\n");
		for (size_t i = 0; i < skv_st_meta_count(f); i++) {
			const struct skv_st_meta *m = skv_st_meta_at(f, i);
			printf("  ");
			put_safe(m->key, 20);
			putchar(' ');
			put_safe(m->value, 0);
			putchar('\n');
		}
	}
	const char *fmt = skv_st_meta_get(f, "format");
	r = 0;
	if (fmt && strcmp(fmt, "snapkv-compact") == 0)
		r = print_compact(f, show);
	skv_st_close(f);
	return r < 0 ? CTL_EXIT_USAGE : CTL_EXIT_OK;
}

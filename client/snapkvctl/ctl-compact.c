// SPDX-License-Identifier: MIT
/*
 * ctl-compact.c - `snapkvctl compact [--offline] IN OUT`: SnapKV compaction
 * of a safetensors file holding per-layer Q-window, K and V, written as a
 * compact-cache safetensors file (format in client/libskvst/skv-safetensors.h). With
 * --offline libskv runs here; without, snapkvd runs it (ctl-daemon.c) and
 * the file is the same bytes.
 *
 * Everything about the input is checked before any work, and OUT is written
 * atomically, so a bad file or bad option costs one line on stderr and exit
 * status 2, never a crash and never a partial OUT.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl-daemon.h"
#include "proto/skv-socket.h"
#include "skv-safetensors.h"
#include "skv.h"
#include "snapkv.h" /* SKV_MAX_OUT_BLOCK_SIZE */
#include "snapkvctl.h"

#define CMD	    "compact"
#define MAX_LAYERS  4096
#define MAX_THREADS 1024

/* IN as given on the command line, for messages about its contents. */
static const char *in_name = "IN";

static const char *const policy_opts[] = {"snapkv", "h2o", "streamingllm", "window", NULL};
static const enum skv_policy policy_vals[] = {SKV_POLICY_SNAPKV, SKV_POLICY_H2O,
					      SKV_POLICY_STREAMINGLLM, SKV_POLICY_WINDOW};
static const char *const pooling_opts[] = {"avg", "max", NULL};
static const enum skv_pooling pooling_vals[] = {SKV_POOL_AVG, SKV_POOL_MAX};
static const char *const gqa_opts[] = {"expand", "group", NULL};
static const enum skv_gqa gqa_vals[] = {SKV_GQA_EXPAND, SKV_GQA_GROUP};

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: snapkvctl compact [--offline | --socket PATH] IN OUT [options]\n"
	    "\n"
	    "Compacts the K/V in safetensors file IN (per layer N: layers.N.q [H_q, rows, D],\n"
	    "layers.N.k and layers.N.v [H_kv, L, D]; F32, F16 or BF16; q may be absent for\n"
	    "streamingllm and window) and writes OUT (layers.N.k/.v [H_store, kept, D],\n"
	    "layers.N.indices I32 [H_store, kept], layers.N.retained_mass F32 [H_store],\n"
	    "__metadata__ with the parameters and the capacity ledger). snapkv uses the last\n"
	    "W rows of q; h2o needs all L rows (and ignores --kernel); streamingllm and\n"
	    "window use the rows of q, when present, only to report retained mass.\n"
	    "Without --offline snapkvd compacts (at --socket PATH, else $SNAPKV_SOCKET, else\n"
	    "/run/snapkvd/snapkvd.sock if it exists, else $XDG_RUNTIME_DIR/snapkvd.sock);\n"
	    "OUT is the same bytes.\n"
	    "\n"
	    "options:\n"
	    "  --offline            compact here with libskv (no daemon)\n"
	    "  --socket PATH        snapkvd's socket, when not --offline\n"
	    "  --policy P           snapkv (default), h2o, streamingllm, window\n"
	    "  --window W           observation window / recent keep (default 32)\n"
	    "  --capacity C         positions kept per stored head, window included (2048)\n"
	    "  --kernel K           pooling width, odd, 1 = none (default 5)\n"
	    "  --pooling avg|max    pooling kind (default avg)\n"
	    "  --gqa expand|group   store H_q heads (default) or H_kv heads\n"
	    "  --sinks S            streamingllm sink positions (default 4)\n"
	    "  --span S             keep up to S neighbours on either side of each position\n"
	    "                       picked by score until the budget is used (kernels/skv.h;\n"
	    "                       default 0 = top-k; at most 64; budget uniform or layers)\n"
	    "  --protect A:B        always keep positions A..B-1 (half-open, like a Python\n"
	    "                       slice); repeatable, at most %d ranges\n"
	    "  --budget B           how many positions each head keeps (SPEC.md budget modes):\n"
	    "                       uniform (default: C everywhere), layers:C0,C1,.. (one per\n"
	    "                       layer), pyramid:R (C_l around C, R < 1 shrinks with depth),\n"
	    "                       heads[:A] (AdaKV: floor A of C each, default 0.2, the rest\n"
	    "                       layer-wide), mass:TAU[:CMIN:CMAX:STEP] (one C* for the\n"
	    "                       cache: the smallest C on the ladder keeping retained mass\n"
	    "                       >= TAU in every head), mass-heads:TAU[:CMIN:CMAX] (per\n"
	    "                       head the smallest count reaching TAU); CMIN defaults to\n"
	    "                       W+1, CMAX to C, STEP to (C-W)/16. heads and mass-heads\n"
	    "                       write ragged layers ([sum kept, D], layers.N.kept)\n"
	    "  --fallback-below F   keep the full prompt when any head's retained mass would\n"
	    "                       be below F (0 < F <= 1; default: never)\n"
	    "  --group KEY:SIZE[:TIMEOUT_MS]\n"
	    "                       a decision group (through snapkvd only): the SIZE\n"
	    "                       requests of one tenant with this KEY (1..%u bytes of\n"
	    "                       printable ASCII, no ':' here) are decided together (mass:\n"
	    "                       one C* for all, the largest of their own; fallback for all\n"
	    "                       if one falls back); budget uniform, layers or mass, every\n"
	    "                       member with the same shape and parameters. snapkvd waits\n"
	    "                       TIMEOUT_MS (default its group_timeout_ms) for all SIZE;\n"
	    "                       then each fails, nothing kept. TIMEOUT_MS is added to\n"
	    "                       --timeout for the wait\n"
	    "  --threads N          --offline worker threads, 0 = one per core (default 0)\n"
	    "  --show H             print the kept positions of the first H heads per layer\n"
	    "  --out-layout L       hnd (default) or paged: OUT's layers.N.k/.v are then the\n"
	    "                       engine's block format [blocks, N, H_store, D], kept slot i\n"
	    "                       in block i / N, row i %% N, rows past kept zero; --budget\n"
	    "                       uniform or mass only (one count for every head)\n"
	    "  --block-size N       slots per block of --out-layout paged, 1..%u\n"
	    "  -q, --quiet          print nothing on success\n"
	    "  -h, --help           this text\n"
	    "\n"
	    "Exit status: 0 success, 1 run-time failure (I/O, memory, daemon), 2 bad options,\n"
	    "bad input file or invalid parameters. OUT is replaced atomically or not at all.\n",
	    SKV_MAX_PROTECTED, SKV_MAX_GROUP_KEY, SKV_MAX_OUT_BLOCK_SIZE);
}

struct opts {
	bool offline, quiet;
	const char *in, *out, *socket;
	struct skv_params params;
	unsigned threads;
	uint32_t show;
	uint32_t block_size; /* --out-layout paged: slots per block; 0: dense HND */
	bool paged;
	struct ctl_group group; /* --group; key NULL: none */
	char group_key[SKV_MAX_GROUP_KEY + 1];
};

enum {
	OPT_OFFLINE = 256,
	OPT_POLICY,
	OPT_WINDOW,
	OPT_CAPACITY,
	OPT_KERNEL,
	OPT_POOLING,
	OPT_GQA,
	OPT_SINKS,
	OPT_PROTECT,
	OPT_THREADS,
	OPT_SHOW,
	OPT_SOCKET,
	OPT_BUDGET,
	OPT_FALLBACK,
	OPT_OUT_LAYOUT,
	OPT_BLOCK_SIZE,
	OPT_GROUP,
	OPT_SPAN,
	OPT_LAST = OPT_SPAN,
};

static const struct option long_opts[] = {
    {"offline", no_argument, NULL, OPT_OFFLINE},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"kernel", required_argument, NULL, OPT_KERNEL},
    {"pooling", required_argument, NULL, OPT_POOLING},
    {"gqa", required_argument, NULL, OPT_GQA},
    {"sinks", required_argument, NULL, OPT_SINKS},
    {"protect", required_argument, NULL, OPT_PROTECT},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"show", required_argument, NULL, OPT_SHOW},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"budget", required_argument, NULL, OPT_BUDGET},
    {"fallback-below", required_argument, NULL, OPT_FALLBACK},
    {"out-layout", required_argument, NULL, OPT_OUT_LAYOUT},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"group", required_argument, NULL, OPT_GROUP},
    {"span", required_argument, NULL, OPT_SPAN},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int bad_int(const char *opt, const char *val, int r)
{
	ctl_err(CMD, "%s: \"%s\" is %s", opt, val,
		r == -ERANGE ? "out of range" : "not a non-negative decimal integer");
	return CTL_EXIT_USAGE;
}

static int parse_protect(const char *s, struct skv_params *p)
{
	char a[24], b[24];
	const char *colon = strchr(s, ':');
	uint32_t begin, end;

	if (!colon || (size_t)(colon - s) >= sizeof(a) || strlen(colon + 1) >= sizeof(b)) {
		ctl_err(CMD, "--protect: \"%s\" is not A:B", s);
		return CTL_EXIT_USAGE;
	}
	memcpy(a, s, (size_t)(colon - s));
	a[colon - s] = '\0';
	strcpy(b, colon + 1);
	if (ctl_parse_u32(a, 0, UINT32_MAX, &begin) < 0 ||
	    ctl_parse_u32(b, 0, UINT32_MAX, &end) < 0) {
		ctl_err(CMD, "--protect: \"%s\" is not A:B with non-negative integers", s);
		return CTL_EXIT_USAGE;
	}
	if (begin >= end) {
		ctl_err(CMD, "--protect: %s is empty (A:B keeps positions A..B-1, so A < B)", s);
		return CTL_EXIT_USAGE;
	}
	if (p->n_protected >= SKV_MAX_PROTECTED) {
		ctl_err(CMD, "--protect: more than %d ranges", SKV_MAX_PROTECTED);
		return CTL_EXIT_USAGE;
	}
	p->protected_ranges[p->n_protected++] = (struct skv_range){begin, end};
	return 0;
}

/* --group KEY:SIZE[:TIMEOUT_MS]: the key up to the first ':'. */
static int parse_group(const char *s, struct opts *o)
{
	const char *c1 = strchr(s, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
	char num[24];
	size_t n = c1 ? (size_t)(c1 - s) : strlen(s);

	if (!c1) {
		ctl_err(CMD, "--group: \"%s\" is not KEY:SIZE[:TIMEOUT_MS]", s);
		return CTL_EXIT_USAGE;
	}
	if (n < 1 || n > SKV_MAX_GROUP_KEY) {
		ctl_err(CMD, "--group: the key has %zu bytes, it must have 1..%u", n,
			SKV_MAX_GROUP_KEY);
		return CTL_EXIT_USAGE;
	}
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
			ctl_err(CMD, "--group: key byte %zu (0x%02x) is not printable ASCII", i,
				(unsigned char)s[i]);
			return CTL_EXIT_USAGE;
		}
	memcpy(o->group_key, s, n);
	o->group_key[n] = '\0';
	n = c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);
	if (n >= sizeof(num) || (memcpy(num, c1 + 1, n), num[n] = '\0',
				 ctl_parse_u32(num, 1, UINT32_MAX, &o->group.size) < 0)) {
		ctl_err(CMD, "--group: the size \"%.*s\" is not an integer >= 1 (members)",
			(int)(n < 64 ? n : 64), c1 + 1);
		return CTL_EXIT_USAGE;
	}
	if (c2 && ctl_parse_u32(c2 + 1, 0, UINT32_MAX, &o->group.timeout_ms) < 0) {
		ctl_err(CMD, "--group: the timeout \"%s\" is not a number of milliseconds", c2 + 1);
		return CTL_EXIT_USAGE;
	}
	o->group.key = o->group_key;
	return 0;
}

/* A --policy/--pooling/--gqa value not among the choices. */
static int bad_choice(const char *optname, const char *val)
{
	ctl_err(CMD, "--%s: unknown value \"%s\"", optname, val);
	return CTL_EXIT_USAGE;
}

/* Not an option of the compaction's params (param_opt). */
#define NOT_A_PARAM (-1000)

/* An option that sets o->params: 0, an exit status, or NOT_A_PARAM. */
static int param_opt(int c, const char *optname, struct opts *o)
{
	int r, i;

	switch (c) {
	case OPT_POLICY:
		if ((i = ctl_parse_choice(optarg, policy_opts)) < 0)
			return bad_choice(optname, optarg);
		o->params.policy = policy_vals[i];
		return 0;
	case OPT_POOLING:
		if ((i = ctl_parse_choice(optarg, pooling_opts)) < 0)
			return bad_choice(optname, optarg);
		o->params.pooling = pooling_vals[i];
		return 0;
	case OPT_GQA:
		if ((i = ctl_parse_choice(optarg, gqa_opts)) < 0)
			return bad_choice(optname, optarg);
		o->params.gqa = gqa_vals[i];
		return 0;
	case OPT_WINDOW:
		if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->params.window)) < 0)
			return bad_int("--window", optarg, r);
		return 0;
	case OPT_CAPACITY:
		if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->params.capacity)) < 0)
			return bad_int("--capacity", optarg, r);
		return 0;
	case OPT_KERNEL:
		if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->params.kernel)) < 0)
			return bad_int("--kernel", optarg, r);
		return 0;
	case OPT_SINKS:
		if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->params.sinks)) < 0)
			return bad_int("--sinks", optarg, r);
		return 0;
	case OPT_SPAN: /* the kernels judge it (at most SKV_MAX_SPAN, uniform or layers) */
		if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->params.span)) < 0)
			return bad_int("--span", optarg, r);
		return 0;
	case OPT_PROTECT:
		return parse_protect(optarg, &o->params);
	case OPT_BUDGET:
		return ctl_parse_budget(CMD, optarg, &o->params);
	case OPT_FALLBACK:
		if (ctl_parse_float(optarg, &o->params.fallback_below) < 0) {
			ctl_err(CMD, "--fallback-below: \"%s\" is not a number", optarg);
			return CTL_EXIT_USAGE;
		}
		return 0;
	default:
		return NOT_A_PARAM;
	}
}

/* The options that do not belong together, once all are read. */
static int check_opts(const struct opts *o)
{
	if (o->offline && o->socket) {
		ctl_err(CMD, "--offline and --socket exclude each other");
		return CTL_EXIT_USAGE;
	}
	if (o->offline && o->group.key) {
		ctl_err(CMD, "--group needs the daemon: snapkvd decides a group's members "
			     "together (drop --offline)");
		return CTL_EXIT_USAGE;
	}
	if (o->paged != (o->block_size != 0)) {
		ctl_err(CMD, o->paged ? "--out-layout paged needs --block-size N"
				      : "--block-size is for --out-layout paged");
		return CTL_EXIT_USAGE;
	}
	return 0;
}

/* An option getopt did not take: unknown, or missing its value. */
static int bad_opt(char **argv)
{
	if (optopt && optopt < OPT_OFFLINE && optopt != '?')
		ctl_err(CMD, "unknown option -%c (see --help)", optopt);
	else if (optopt >= OPT_OFFLINE)
		ctl_err(CMD, "option %s needs a value", argv[optind - 1]);
	else
		ctl_err(CMD, "unknown option %s (see --help)", argv[optind - 1]);
	return CTL_EXIT_USAGE;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	const char *optname;
	int c, r;

	skv_params_init(&o->params);
	opterr = 0;
	optind = 0; /* full reinitialisation of GNU getopt */
	while ((c = getopt_long(argc, argv, "qh", long_opts, NULL)) != -1) {
		/* Messages name the option itself, not argv[optind - 1]. */
		optname = "";
		for (const struct option *lo = long_opts; lo->name; lo++)
			if (lo->val == c)
				optname = lo->name;
		r = param_opt(c, optname, o);
		if (r != NOT_A_PARAM) {
			if (r != 0)
				return r;
			continue;
		}
		switch (c) {
		case OPT_OFFLINE:
			o->offline = true;
			break;
		case OPT_SOCKET:
			o->socket = optarg;
			break;
		case OPT_THREADS: {
			uint32_t t;
			if ((r = ctl_parse_u32(optarg, 0, MAX_THREADS, &t)) < 0)
				return bad_int("--threads", optarg, r);
			o->threads = t;
			break;
		}
		case OPT_SHOW:
			if ((r = ctl_parse_u32(optarg, 0, UINT32_MAX, &o->show)) < 0)
				return bad_int("--show", optarg, r);
			break;
		case OPT_OUT_LAYOUT:
			if (strcmp(optarg, "hnd") && strcmp(optarg, "paged"))
				return bad_choice("out-layout", optarg);
			o->paged = !strcmp(optarg, "paged");
			break;
		case OPT_BLOCK_SIZE:
			if ((r = ctl_parse_u32(optarg, 1, SKV_MAX_OUT_BLOCK_SIZE, &o->block_size)) <
			    0)
				return bad_int("--block-size", optarg, r);
			break;
		case OPT_GROUP:
			if ((r = parse_group(optarg, o)) != 0)
				return r;
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'h':
			usage(stdout);
			return -1;
		default:
			return bad_opt(argv);
		}
	}
	if (argc - optind != 2) {
		ctl_err(CMD, "expected IN and OUT, got %d operand%s (see --help)", argc - optind,
			argc - optind == 1 ? "" : "s");
		return CTL_EXIT_USAGE;
	}
	o->in = argv[optind];
	o->out = argv[optind + 1];
	ctl_budget_defaults(&o->params);
	return check_opts(o);
}

/* ---- input discovery ---------------------------------------------------- */

struct layer_in {
	const struct skv_st_tensor *q, *k, *v;
	const struct skv_st_tensor *ks, *vs; /* fp8: layers.N.k_scale, .v_scale */
};

/* "layers.<N>.<q|k|v|k_scale|v_scale>" with N canonical decimal: 0 or no
 * leading zero; the scales' kinds are 'K' and 'V'. */
static int parse_name(const char *name, uint32_t *ret_layer, char *ret_kind)
{
	const char *p = name;
	uint32_t n = 0;

	if (strncmp(p, "layers.", 7) != 0)
		return -EINVAL;
	p += 7;
	if (!(*p >= '0' && *p <= '9') || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		n = n * 10 + (uint32_t)(*p - '0');
		if (n >= MAX_LAYERS)
			return -ERANGE;
	}
	if (p[0] == '.' && (!strcmp(p + 1, "k_scale") || !strcmp(p + 1, "v_scale"))) {
		*ret_layer = n;
		*ret_kind = p[1] == 'k' ? 'K' : 'V';
		return 0;
	}
	if (p[0] != '.' || !strchr("qkv", p[1]) || !p[1] || p[2])
		return -EINVAL;
	*ret_layer = n;
	*ret_kind = p[1];
	return 0;
}

struct job {
	struct opts o;
	struct skv_st_file *in;
	uint32_t n_layers;
	struct layer_in *layers;
	enum skv_dtype kv_dtype;
	struct skv_shape shape;
	struct skv_plan plan;
	uint32_t q_rows; /* rows of layers.N.q in the file, 0 when absent */
	void **copies;	 /* aligned copies of misaligned input tensors */
	size_t n_copies;
	struct skv_layer_in *kin;
	struct skv_layer_out *kout;
	struct skv_st_layer_result *res;
	void *outbuf;
	uint32_t room;	/* rows of room per stored head (skv_budget_rows) */
	uint32_t *kept; /* [n_layers][h_store] what each head kept */
	struct skv_budget_result outcome;
	int32_t *out_table; /* --out-layout paged: blocks 0 .. n_out - 1 */
	uint32_t n_out;
	float *scales; /* fp8 K/V: [n_layers][K, V] (discover_scales) */
};

static void job_free(struct job *j)
{
	for (size_t i = 0; i < j->n_copies; i++)
		free(j->copies[i]);
	free(j->copies);
	free(j->layers);
	free(j->kin);
	free(j->kout);
	free(j->res);
	free(j->outbuf);
	free(j->kept);
	free(j->out_table);
	free(j->scales);
	skv_st_close(j->in);
}

static int check_kv_shape(const struct skv_st_tensor *t, const struct skv_st_tensor *ref)
{
	char a[96], b[96];

	if (t->rank != 3) {
		ctl_fmt_shape(t, a, sizeof(a));
		ctl_err(CMD, "%s: %s: shape %s is not [heads, tokens, head_dim]", in_name, t->name,
			a);
		return CTL_EXIT_USAGE;
	}
	for (int d = 0; d < 3; d++)
		if (t->shape[d] == 0 || t->shape[d] > UINT32_MAX) {
			ctl_fmt_shape(t, a, sizeof(a));
			ctl_err(CMD, "%s: %s: shape %s has a dimension that is 0 or over 2^32-1",
				in_name, t->name, a);
			return CTL_EXIT_USAGE;
		}
	if (skv_st_to_skv_dtype(t->dtype) == SKV_DTYPE_UNSPECIFIED) {
		ctl_err(CMD, "%s: %s: dtype %s is not F32, F16 or BF16", in_name, t->name,
			skv_st_dtype_name(t->dtype));
		return CTL_EXIT_USAGE;
	}
	if (ref && (ref->dtype != t->dtype || memcmp(ref->shape, t->shape, sizeof(t->shape)))) {
		ctl_fmt_shape(t, a, sizeof(a));
		ctl_fmt_shape(ref, b, sizeof(b));
		ctl_err(CMD, "%s: %s: %s %s differs from %s: %s %s", in_name, t->name,
			skv_st_dtype_name(t->dtype), a, ref->name, skv_st_dtype_name(ref->dtype),
			b);
		return CTL_EXIT_USAGE;
	}
	return 0;
}

/* fp8 K/V (F8_E4M3, F8_E5M2): every layer's k_scale and v_scale, F32 of one
 * element, into j->scales [n_layers][K, V]; none for other dtypes. */
static int discover_scales(struct job *j)
{
	const bool f8 = skv_dtype_is_fp8(j->kv_dtype);

	if (f8 && !(j->scales = calloc((size_t)j->n_layers * 2, sizeof(float)))) {
		ctl_err(CMD, "out of memory");
		return CTL_EXIT_FAIL;
	}
	for (uint32_t l = 0; l < j->n_layers; l++) {
		const struct skv_st_tensor *s[2] = {j->layers[l].ks, j->layers[l].vs};
		for (int i = 0; i < 2; i++) {
			if (!f8 && s[i]) {
				ctl_err(CMD, "%s: %s: scales go with F8_E4M3 or F8_E5M2 K/V only",
					in_name, s[i]->name);
				return CTL_EXIT_USAGE;
			}
			if (!f8)
				continue;
			if (!s[i] || s[i]->dtype != SKV_ST_F32 || s[i]->n_elems != 1) {
				ctl_err(CMD,
					"%s: fp8 K/V need layers.%" PRIu32
					".%s, one F32 element (its scale)",
					in_name, l, i ? "v_scale" : "k_scale");
				return CTL_EXIT_USAGE;
			}
			memcpy(&j->scales[2 * l + i], s[i]->data, sizeof(float));
		}
	}
	return 0;
}

static int discover(struct job *j)
{
	size_t n = skv_st_count(j->in);
	uint32_t max_layer = 0;
	bool any = false;
	int r;

	for (size_t i = 0; i < n; i++) {
		const struct skv_st_tensor *t = skv_st_at(j->in, i);
		uint32_t l;
		char kind;
		r = parse_name(t->name, &l, &kind);
		if (r == -ERANGE) {
			ctl_err(CMD, "%s: %.64s: layer index over the limit of %d", in_name,
				t->name, MAX_LAYERS - 1);
			return CTL_EXIT_USAGE;
		}
		if (r < 0) {
			ctl_err(CMD,
				"%s: unexpected tensor \"%.64s\" (expected layers.N.q, .k, .v, "
				".k_scale, .v_scale)",
				in_name, t->name);
			return CTL_EXIT_USAGE;
		}
		if (!any || l > max_layer)
			max_layer = l;
		any = true;
	}
	if (!any) {
		ctl_err(CMD, "%s: no layers.N.k / layers.N.v tensors", in_name);
		return CTL_EXIT_USAGE;
	}
	j->n_layers = max_layer + 1;
	j->layers = calloc(j->n_layers, sizeof(*j->layers));
	if (!j->layers) {
		ctl_err(CMD, "out of memory");
		return CTL_EXIT_FAIL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct skv_st_tensor *t = skv_st_at(j->in, i);
		uint32_t l;
		char kind;
		parse_name(t->name, &l, &kind);
		struct layer_in *li = &j->layers[l];
		if (kind == 'q')
			li->q = t;
		else if (kind == 'k')
			li->k = t;
		else if (kind == 'K')
			li->ks = t;
		else if (kind == 'V')
			li->vs = t;
		else
			li->v = t;
	}
	for (uint32_t l = 0; l < j->n_layers; l++) {
		struct layer_in *li = &j->layers[l];
		if (!li->k || !li->v) {
			ctl_err(CMD,
				"%s: layers.%" PRIu32 ".%c is missing (layers must be 0..%" PRIu32
				" with k and v each)",
				in_name, l, li->k ? 'v' : 'k', max_layer);
			return CTL_EXIT_USAGE;
		}
		if (!li->q != !j->layers[0].q) {
			ctl_err(CMD, "%s: layers.%" PRIu32 ".q is %s but layers.0.q is %s", in_name,
				l, li->q ? "present" : "missing", li->q ? "missing" : "present");
			return CTL_EXIT_USAGE;
		}
		if ((r = check_kv_shape(li->k, l ? j->layers[0].k : NULL)) ||
		    (r = check_kv_shape(li->v, li->k)))
			return r;
		if (li->q) {
			const struct skv_st_tensor *q = li->q, *q0 = j->layers[0].q;
			char a[96];
			if (q->rank != 3 || q->shape[0] == 0 || q->shape[0] > UINT32_MAX ||
			    q->shape[1] > UINT32_MAX || q->shape[2] != li->k->shape[2]) {
				ctl_fmt_shape(q, a, sizeof(a));
				ctl_err(CMD,
					"%s: %s: shape %s is not [H_q, rows, %" PRIu64
					"] (head_dim of %s)",
					in_name, q->name, a, li->k->shape[2], li->k->name);
				return CTL_EXIT_USAGE;
			}
			if (skv_st_to_skv_dtype(q->dtype) == SKV_DTYPE_UNSPECIFIED) {
				ctl_err(CMD, "%s: %s: dtype %s is not F32, F16 or BF16", in_name,
					q->name, skv_st_dtype_name(q->dtype));
				return CTL_EXIT_USAGE;
			}
			if (l && (q->dtype != q0->dtype ||
				  memcmp(q->shape, q0->shape, sizeof(q->shape)))) {
				ctl_err(CMD, "%s: %s: dtype or shape differs from %s", in_name,
					q->name, q0->name);
				return CTL_EXIT_USAGE;
			}
			if (q->shape[1] > li->k->shape[1]) {
				ctl_err(CMD, "%s: %s has %" PRIu64 " rows, more than L = %" PRIu64,
					in_name, q->name, q->shape[1], li->k->shape[1]);
				return CTL_EXIT_USAGE;
			}
		}
	}
	const struct skv_st_tensor *k0 = j->layers[0].k, *q0 = j->layers[0].q;
	j->kv_dtype = skv_st_to_skv_dtype(k0->dtype);
	j->shape.h_kv = (uint32_t)k0->shape[0];
	j->shape.prompt_len = (uint32_t)k0->shape[1];
	j->shape.head_dim = (uint32_t)k0->shape[2];
	/* Without q nothing says how many query heads the model has: store
	 * as many heads as K/V have (G = 1). */
	j->shape.h_q = q0 ? (uint32_t)q0->shape[0] : j->shape.h_kv;
	j->q_rows = q0 ? (uint32_t)q0->shape[1] : 0;
	return discover_scales(j);
}

/* Which q rows the policy reads: snapkv the last W, h2o all L. */
static int choose_rows(struct job *j)
{
	const struct skv_params *p = &j->o.params;
	uint32_t L = j->shape.prompt_len;

	switch (p->policy) {
	case SKV_POLICY_SNAPKV:
		if (!j->q_rows) {
			ctl_err(CMD, "%s: policy snapkv needs layers.N.q (the window queries)",
				in_name);
			return CTL_EXIT_USAGE;
		}
		/* fewer rows than W: a partial window (SPEC.md), W' = those rows,
		 * down to min_window (libskv's 8 offline, the daemon's online) */
		if (j->q_rows < p->window) {
			j->shape.n_q = j->q_rows;
			break;
		}
		if (p->window > L) {
			ctl_err(CMD,
				"invalid parameters: window W = %" PRIu32
				" exceeds the prompt length L = %" PRIu32,
				p->window, L);
			return CTL_EXIT_USAGE;
		}
		j->shape.n_q = p->window;
		break;
	case SKV_POLICY_H2O:
		if (j->q_rows != L) {
			ctl_err(CMD,
				"%s: policy h2o needs layers.N.q with all L = %" PRIu32
				" rows (file has %" PRIu32 ")",
				in_name, L, j->q_rows);
			return CTL_EXIT_USAGE;
		}
		j->shape.n_q = L;
		break;
	default:
		/* No voting; rows that are there only measure retained mass. */
		j->shape.n_q = j->q_rows;
		break;
	}
	return 0;
}

/* The kernels read elements through typed pointers: hand them aligned ones. */
static int aligned_view(struct job *j, const struct skv_st_tensor *t, const void **ret)
{
	size_t es = skv_st_dtype_size(t->dtype);
	void *c;

	if ((uintptr_t)t->data % es == 0) {
		*ret = t->data;
		return 0;
	}
	c = malloc(t->n_bytes);
	if (!c)
		return -ENOMEM;
	memcpy(c, t->data, t->n_bytes);
	j->copies[j->n_copies++] = c;
	*ret = c;
	return 0;
}

static uint64_t phys_mem(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	return (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
}

/* --out-layout paged: the identity block table of the output pools. */
static int paged_table(struct job *j, uint32_t n)
{
	j->out_table = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
	if (!j->out_table)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		j->out_table[i] = (int32_t)i;
	j->n_out = n;
	return 0;
}

/* A paged output pool at base: [n_out][N][hs][D], slot i in block i / N. */
static struct skv_tensor paged_out(const struct job *j, void *base, uint32_t hs, uint32_t D)
{
	return (struct skv_tensor){.data = base,
				   .dtype = j->kv_dtype,
				   .head_stride = D,
				   .token_stride = (int64_t)hs * D,
				   .block_table = j->out_table,
				   .block_size = j->o.block_size,
				   .n_blocks = j->n_out,
				   .block_stride = (int64_t)j->o.block_size * hs * D};
}

static int setup_buffers(struct job *j)
{
	uint32_t nl = j->n_layers, hs = j->plan.h_store, kept = j->room;
	uint32_t D = j->shape.head_dim, L = j->shape.prompt_len;
	size_t es = skv_dtype_size(j->kv_dtype);
	uint64_t kv_bytes, pos_bytes, mass_bytes, per_layer, total;

	/* 64-byte rounding keeps every sub-buffer aligned for SIMD stores. */
#define R64(x) (((x) + 63) & ~(uint64_t)63)
	/* paged: kept slots rounded up to whole blocks, [blocks][N][H_store][D] */
	uint64_t slots =
	    j->o.paged ? (uint64_t)(kept + j->o.block_size - 1) / j->o.block_size * j->o.block_size
		       : kept;
	if (__builtin_mul_overflow((uint64_t)hs * slots, (uint64_t)D * es, &kv_bytes) ||
	    __builtin_mul_overflow((uint64_t)nl, 2 * R64(kv_bytes), &total)) {
		ctl_err(CMD, "output size overflows");
		return CTL_EXIT_USAGE;
	}
	pos_bytes = R64((uint64_t)hs * kept * 4);
	mass_bytes = R64((uint64_t)hs * 4);
	per_layer = 2 * R64(kv_bytes) + pos_bytes + mass_bytes;
	total = per_layer * nl; /* cannot overflow: kv term checked above, others smaller */
	if (total > phys_mem()) {
		ctl_err(CMD, "output needs %" PRIu64 " bytes, more than this machine's memory",
			total);
		return CTL_EXIT_USAGE;
	}
	j->copies = calloc((size_t)nl * 3, sizeof(*j->copies));
	j->kin = calloc(nl, sizeof(*j->kin));
	j->kout = calloc(nl, sizeof(*j->kout));
	j->res = calloc(nl, sizeof(*j->res));
	j->kept = calloc((size_t)nl * hs, sizeof(*j->kept));
	if (!j->copies || !j->kin || !j->kout || !j->res || !j->kept ||
	    posix_memalign(&j->outbuf, 64, total ? total : 64) ||
	    (j->o.paged && paged_table(j, (uint32_t)(slots / j->o.block_size)) < 0)) {
		ctl_err(CMD, "out of memory for %" PRIu64 " bytes of output", total);
		return CTL_EXIT_FAIL;
	}
	if (j->o.paged) /* the rows of the last block past kept read as zero */
		memset(j->outbuf, 0, total);
	for (uint32_t l = 0; l < nl; l++) {
		const struct layer_in *li = &j->layers[l];
		struct skv_layer_in *ki = &j->kin[l];
		struct skv_layer_out *ko = &j->kout[l];
		const void *kp, *vp, *qp = NULL;
		uint8_t *base = (uint8_t *)j->outbuf + per_layer * l;

		if (aligned_view(j, li->k, &kp) || aligned_view(j, li->v, &vp) ||
		    (li->q && j->shape.n_q && aligned_view(j, li->q, &qp))) {
			ctl_err(CMD, "out of memory");
			return CTL_EXIT_FAIL;
		}
		ki->k = (struct skv_tensor){.data = (void *)kp,
					    .dtype = j->kv_dtype,
					    .head_stride = (int64_t)L * D,
					    .token_stride = D};
		ki->v = ki->k;
		ki->v.data = (void *)vp;
		if (j->scales) {
			ki->k.scale = j->scales[2 * l];
			ki->v.scale = j->scales[2 * l + 1];
		}
		if (qp) {
			/* The last n_q of the file's rows: the window queries. */
			size_t qes = skv_st_dtype_size(li->q->dtype);
			ki->q = (struct skv_tensor){
			    .data = (uint8_t *)qp + (size_t)(j->q_rows - j->shape.n_q) * D * qes,
			    .dtype = skv_st_to_skv_dtype(li->q->dtype),
			    .head_stride = (int64_t)j->q_rows * D,
			    .token_stride = D};
		} else {
			ki->q = (struct skv_tensor){
			    .dtype = j->kv_dtype, .head_stride = 0, .token_stride = D};
		}
		ko->k = (struct skv_tensor){.data = base,
					    .dtype = j->kv_dtype,
					    .head_stride = (int64_t)kept * D,
					    .token_stride = D};
		if (j->o.paged)
			ko->k = paged_out(j, base, hs, D);
		ko->v = ko->k;
		ko->v.data = base + R64(kv_bytes);
		ko->positions = (int32_t *)(base + 2 * R64(kv_bytes));
		ko->pos_stride = kept;
		ko->pool_blocks = j->n_out;
		ko->retained_mass = (float *)(base + 2 * R64(kv_bytes) + pos_bytes);
		j->res[l] = (struct skv_st_layer_result){
		    .k = ko->k.data,
		    .v = ko->v.data,
		    .positions = ko->positions,
		    .retained_mass = ko->retained_mass,
		    .head_stride = (int64_t)kept * D,
		    .token_stride = D,
		    .pos_stride = kept,
		    .kept = j->kept + (size_t)l * hs,
		};
	}
#undef R64
	return 0;
}

/*
 * Rows of room each head's output needs (the most any layer needs); the
 * budget's per-layer rules (list length, pyramid C_l) are checked here,
 * before any work (snapkvd checks them again).
 */
static int budget_room(struct job *j)
{
	const struct skv_params *p = &j->o.params;
	struct skv_error e = {.layer = -1, .head = -1};
	uint32_t *rows = calloc(j->n_layers, sizeof(*rows));

	if (!rows) {
		ctl_err(CMD, "out of memory");
		return CTL_EXIT_FAIL;
	}
	int r = skv_budget_rows(&j->shape, p, j->n_layers, rows, &e);
	j->room = 0;
	for (uint32_t l = 0; !r && l < j->n_layers; l++)
		j->room = rows[l] > j->room ? rows[l] : j->room;
	free(rows);
	if (r < 0) {
		ctl_err(CMD, "invalid parameters: %s", e.msg[0] ? e.msg : strerror(-r));
		return CTL_EXIT_USAGE;
	}
	/* blocks hold one length for every head of every layer: uniform or
	 * mass (a fallback too: every head keeps L) */
	if (j->o.paged && p->budget_mode != SKV_BUDGET_UNIFORM &&
	    p->budget_mode != SKV_BUDGET_MASS) {
		ctl_err(CMD,
			"--out-layout paged takes --budget uniform or mass (one count for every "
			"head of every layer), not %s",
			skv_budget_name(p->budget_mode));
		return CTL_EXIT_USAGE;
	}
	return 0;
}

/* ---- summary ------------------------------------------------------------ */

static void print_bytes(const char *label, uint64_t b)
{
	printf("  %-12s %15" PRIu64 " B  (%.2f MiB)\n", label, b, (double)b / (1 << 20));
}

static void summary(const struct job *j, const struct skv_ledger *lg, double ms, const char *where)
{
	const struct skv_params *p = &j->o.params;
	double sum = 0, mn = INFINITY;
	uint64_t cnt = 0;
	uint32_t mn_l = 0, mn_h = 0;

	printf("compacted %s -> %s\n", j->o.in, j->o.out);
	printf("  %" PRIu32 " layers, L %" PRIu32 ", H_q %" PRIu32 ", H_kv %" PRIu32 ", D %" PRIu32
	       ", %s\n",
	       j->n_layers, j->shape.prompt_len, j->shape.h_q, j->shape.h_kv, j->shape.head_dim,
	       skv_dtype_name(j->kv_dtype));
	printf("  policy %s, W %" PRIu32 ", C %" PRIu32 ", k %" PRIu32 " %s, gqa %s",
	       skv_st_policy_name(p->policy), p->window, p->capacity, p->kernel,
	       skv_st_pooling_name(p->pooling), skv_st_gqa_name(p->gqa));
	if (p->policy == SKV_POLICY_STREAMINGLLM)
		printf(", sinks %" PRIu32, p->sinks);
	if (p->span)
		printf(", span %" PRIu32, p->span);
	for (uint32_t i = 0; i < p->n_protected; i++)
		printf("%s%" PRIu32 ":%" PRIu32, i ? ", " : ", protected ",
		       p->protected_ranges[i].begin, p->protected_ranges[i].end);
	if (p->budget_mode == SKV_BUDGET_UNIFORM && !j->outcome.fallback) {
		printf("\n  kept %" PRIu32 " of %" PRIu32 " positions per head, %" PRIu32
		       " stored heads per layer%s\n",
		       j->plan.kept, j->shape.prompt_len, j->plan.h_store,
		       j->plan.bypass ? " (bypass: L < C, nothing scored)" : "");
	} else {
		uint64_t tot = 0, n = (uint64_t)j->n_layers * j->plan.h_store;
		uint32_t kmin = UINT32_MAX;
		for (uint64_t i = 0; i < n; i++) {
			tot += j->kept[i];
			kmin = j->kept[i] < kmin ? j->kept[i] : kmin;
		}
		printf("\n  budget %s", skv_budget_name(p->budget_mode));
		if (j->outcome.c_star)
			printf(", C* %" PRIu32, j->outcome.c_star);
		printf(": kept per head mean %.1f, min %" PRIu32 " of %" PRIu32
		       " positions, %" PRIu32 " stored heads per layer\n",
		       (double)tot / (double)n, kmin, j->shape.prompt_len, j->plan.h_store);
		if (j->outcome.fallback)
			printf("  fallback: a head would keep retained mass %.4f < %.4g, so every "
			       "head keeps the full prompt\n",
			       (double)j->outcome.min_mass, (double)p->fallback_below);
	}
	for (uint32_t l = 0; l < j->n_layers; l++)
		for (uint32_t h = 0; h < j->plan.h_store; h++) {
			float m = j->res[l].retained_mass[h];
			if (isnan(m))
				continue;
			sum += m;
			cnt++;
			if (m < mn) {
				mn = m;
				mn_l = l;
				mn_h = h;
			}
		}
	if (cnt)
		printf("  retained mass: min %.4f (layer %" PRIu32 " head %" PRIu32
		       "), mean %.4f\n",
		       mn, mn_l, mn_h, sum / (double)cnt);
	else
		printf("  retained mass: n/a (no observation rows)\n");
	for (uint32_t l = 0; l < j->n_layers; l++)
		for (uint32_t h = 0; h < j->plan.h_store && h < j->o.show; h++) {
			printf("  layer %" PRIu32 " head %" PRIu32 " kept: ", l, h);
			ctl_print_ranges(stdout, j->res[l].positions + (size_t)h * j->room,
					 j->kept[(size_t)l * j->plan.h_store + h], 12);
		}
	if (j->o.group.key)
		printf("  group \"%s\": decided with %" PRIu32 " members, %.1f ms after the "
		       "first was scored\n",
		       j->o.group.key, j->o.group.decided_size, (double)j->o.group.wait_us / 1e3);
	printf("  ledger (B 1, N %" PRIu32 ", g 0):\n", j->n_layers);
	print_bytes("native full", lg->native_full);
	print_bytes("compact", lg->compact);
	print_bytes("index", lg->index);
	print_bytes("reserved", lg->reserved);
	printf("  %-12s %15.6f   (compact / native full)\n", "ratio",
	       (double)lg->compact / (double)lg->native_full);
	printf("  compaction %.1f ms, %s\n", ms, where);
}

/* ---- main --------------------------------------------------------------- */

static int errno_exit(int r)
{
	return (r == -ENOMEM || r == -EIO || r == -ENOSPC || r == -EDQUOT) ? CTL_EXIT_FAIL
									   : CTL_EXIT_USAGE;
}

int ctl_compact(int argc, char **argv)
{
	struct job j = {0};
	struct skv_st_error sterr = {{0}};
	struct skv_error kerr = {.layer = -1, .head = -1};
	struct skv_ctx *ctx = NULL;
	struct skv_st_compact_desc desc;
	struct timespec t0, t1;
	char where[300];
	int r, rc;

	rc = parse_opts(argc, argv, &j.o);
	if (rc)
		return rc < 0 ? CTL_EXIT_OK : rc;
	in_name = j.o.in;

	r = skv_st_open(j.o.in, &j.in, &sterr);
	if (r < 0) {
		ctl_err(CMD, "%s: %s", j.o.in, sterr.msg);
		return errno_exit(r);
	}
	if ((rc = discover(&j)) || (rc = choose_rows(&j)))
		goto out;
	/* The same plan and ledger the daemon records for the same request. */
	kerr.msg[0] = '\0';
	r = skv_st_compact_desc_init(&desc, &j.o.params, &j.shape, j.kv_dtype, j.n_layers, &kerr);
	if (r < 0) {
		ctl_err(CMD, "invalid parameters: %s", kerr.msg[0] ? kerr.msg : strerror(-r));
		rc = CTL_EXIT_USAGE;
		goto out;
	}
	j.plan = desc.plan;
	desc.out_block_size = j.o.block_size;
	desc.kv_scales = j.scales;
	if ((rc = budget_room(&j)) || (rc = setup_buffers(&j)))
		goto out;

	if (j.o.offline) {
		r = skv_ctx_new(j.o.threads, &ctx);
		if (r < 0) {
			ctl_err(CMD, "cannot start workers: %s", strerror(-r));
			rc = CTL_EXIT_FAIL;
			goto out;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		kerr = (struct skv_error){.layer = -1, .head = -1};
		j.outcome =
		    (struct skv_budget_result){.result_size = sizeof(j.outcome), .kept = j.kept};
		r = skv_compact_budget(ctx, &j.shape, &j.o.params, j.n_layers, j.kin, j.kout,
				       &j.outcome, &kerr);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (r < 0) {
			const char *why = kerr.msg[0] ? kerr.msg : strerror(-r);
			if (kerr.layer >= 0 && kerr.head >= 0)
				ctl_err(CMD, "layer %" PRId32 " head %" PRId32 ": %s", kerr.layer,
					kerr.head, why);
			else
				ctl_err(CMD, "compaction failed: %s", why);
			rc = r == -ENOMEM ? CTL_EXIT_FAIL : CTL_EXIT_USAGE;
			goto out;
		}
		snprintf(where, sizeof(where), "%u threads, %s", skv_ctx_threads(ctx),
			 skv_ctx_isa(ctx));
	} else {
		char why[900] = "", sock[SKV_SOCKET_PATH_MAX] = "";
		clock_gettime(CLOCK_MONOTONIC, &t0);
		j.outcome =
		    (struct skv_budget_result){.result_size = sizeof(j.outcome), .kept = j.kept};
		r = ctl_daemon_compact(j.o.socket, sock, &j.shape, &j.o.params, j.n_layers, j.kin,
				       j.kout, &j.o.group, &j.outcome, why, sizeof(why));
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (r < 0) {
			ctl_err(CMD, "%s", why[0] ? why : strerror(-r));
			/* The request was checked here first, so what the daemon
			 * refuses is bad data (-EINVAL, -EDOM) or its own trouble. */
			rc = (r == -EINVAL || r == -EDOM) ? CTL_EXIT_USAGE : CTL_EXIT_FAIL;
			goto out;
		}
		snprintf(where, sizeof(where), "in snapkvd at %.250s", sock);
	}
	r = skv_st_compact_desc_budget(&desc, j.kept, j.outcome.c_star, j.outcome.fallback);
	if (r < 0) {
		ctl_err(CMD, "ledger: %s",
			r == -EOVERFLOW ? "byte counts overflow 64 bits" : "invalid kept counts");
		rc = CTL_EXIT_FAIL;
		goto out;
	}

	r = skv_st_write_compact(j.o.out, &desc, j.res, &sterr);
	if (r < 0) {
		ctl_err(CMD, "%s: %s", j.o.out, sterr.msg);
		rc = r == -EINVAL ? CTL_EXIT_USAGE : CTL_EXIT_FAIL;
		goto out;
	}
	if (!j.o.quiet) {
		double ms =
		    (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
		summary(&j, &desc.ledger, ms, where);
	}
	rc = CTL_EXIT_OK;
out:
	skv_ctx_free(ctx);
	job_free(&j);
	return rc;
}

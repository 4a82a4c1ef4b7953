// SPDX-License-Identifier: MIT
/*
 * tiny-llama: generate text with a small GGUF Llama, from its full KV cache
 * or from a cache compacted by SnapKV (or another policy of SPEC.md).
 *
 *   tiny-llama [-m model.gguf] [-p prompt] [-n steps] [-t temp] [-s seed]
 *              [--policy none|snapkv|h2o|streamingllm|window] [-C cap] [-W win]
 *              [-k kernel] [--pool avg|max] [--gqa expand|group] [--sinks S]
 *              [--reserve R] [--compare]
 *
 * With a policy, the prompt is prefilled with full attention (post-RoPE K,
 * V and queries kept), compacted in process with libskv, the first new
 * token taken from the full prefill logits, and the rest decoded from the
 * compact cache at logical positions L + g. --compare also decodes from the
 * full cache and prints both texts and how many tokens agree.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl-compact.h"
#include "tl-model.h"

struct opts {
	const char *model;
	const char *prompt;
	uint32_t steps;
	float temp;
	uint64_t seed;
	struct skv_params params;
	int compact; /* a policy was given */
	uint32_t reserve;
	int compare;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tiny-llama [-m model.gguf] [-p prompt] [-n steps] [-t temp] [-s seed]\n"
		"                  [--policy none|snapkv|h2o|streamingllm|window] [-C capacity]\n"
		"                  [-W window] [-k kernel] [--pool avg|max] [--gqa expand|group]\n"
		"                  [--sinks S] [--reserve R] [--compare]\n");
}

static int parse_u32(const char *s, uint32_t *ret)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
	    {"model", required_argument, NULL, 'm'},	{"prompt", required_argument, NULL, 'p'},
	    {"steps", required_argument, NULL, 'n'},	{"temp", required_argument, NULL, 't'},
	    {"seed", required_argument, NULL, 's'},	{"policy", required_argument, NULL, 1},
	    {"capacity", required_argument, NULL, 'C'}, {"window", required_argument, NULL, 'W'},
	    {"kernel", required_argument, NULL, 'k'},	{"pool", required_argument, NULL, 2},
	    {"gqa", required_argument, NULL, 3},	{"sinks", required_argument, NULL, 4},
	    {"reserve", required_argument, NULL, 5},	{"compare", no_argument, NULL, 6},
	    {"help", no_argument, NULL, 'h'},		{0, 0, 0, 0}};
	int c, bad = 0;
	uint32_t u;

	o->model =
	    getenv("SNAPKV_MODEL") ? getenv("SNAPKV_MODEL") : "../shared/models/stories260K.gguf";
	o->prompt = "";
	o->steps = 64;
	o->temp = 0;
	o->seed = 42;
	skv_params_init(&o->params);
	o->params.window = 8;
	o->params.capacity = 16;
	o->reserve = 16;
	while ((c = getopt_long(argc, argv, "m:p:n:t:s:C:W:k:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			o->model = optarg;
			break;
		case 'p':
			o->prompt = optarg;
			break;
		case 'n':
			bad |= parse_u32(optarg, &o->steps) < 0;
			break;
		case 't':
			o->temp = strtof(optarg, NULL);
			break;
		case 's':
			o->seed = strtoull(optarg, NULL, 10);
			break;
		case 'C':
			bad |= parse_u32(optarg, &o->params.capacity) < 0;
			break;
		case 'W':
			bad |= parse_u32(optarg, &o->params.window) < 0;
			break;
		case 'k':
			bad |= parse_u32(optarg, &o->params.kernel) < 0;
			break;
		case 4:
			bad |= parse_u32(optarg, &o->params.sinks) < 0;
			break;
		case 5:
			bad |= parse_u32(optarg, &o->reserve) < 0;
			break;
		case 6:
			o->compare = 1;
			break;
		case 1:
			o->compact = 1;
			if (!strcmp(optarg, "snapkv"))
				o->params.policy = SKV_POLICY_SNAPKV;
			else if (!strcmp(optarg, "h2o"))
				o->params.policy = SKV_POLICY_H2O;
			else if (!strcmp(optarg, "streamingllm"))
				o->params.policy = SKV_POLICY_STREAMINGLLM;
			else if (!strcmp(optarg, "window"))
				o->params.policy = SKV_POLICY_WINDOW;
			else if (!strcmp(optarg, "none"))
				o->compact = 0;
			else
				bad = 1;
			break;
		case 2:
			if (!strcmp(optarg, "avg"))
				o->params.pooling = SKV_POOL_AVG;
			else if (!strcmp(optarg, "max"))
				o->params.pooling = SKV_POOL_MAX;
			else
				bad = 1;
			break;
		case 3:
			if (!strcmp(optarg, "expand"))
				o->params.gqa = SKV_GQA_EXPAND;
			else if (!strcmp(optarg, "group"))
				o->params.gqa = SKV_GQA_GROUP;
			else
				bad = 1;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			bad = 1;
		}
	}
	if (bad || optind != argc) {
		usage(stderr);
		return -EINVAL;
	}
	(void)u;
	return 0;
}

/* Append a token's text to a growing string. */
static int text_add(const struct tl_tok *tok, char **buf, size_t *len, size_t *cap, uint32_t prev,
		    uint32_t t)
{
	char piece[TL_TOK_MAX_PIECE + 8];
	size_t n = tl_tok_decode(tok, prev, t, piece, sizeof(piece));
	if (*len + n + 1 > *cap) {
		size_t nc = (*cap ? *cap * 2 : 256) + n;
		char *nb = realloc(*buf, nc);
		if (!nb)
			return -ENOMEM;
		*buf = nb;
		*cap = nc;
	}
	memcpy(*buf + *len, piece, n);
	*len += n;
	(*buf)[*len] = 0;
	return 0;
}

struct gen {
	uint32_t *toks;
	uint32_t n;
	char *text;
	size_t len, cap;
};

/*
 * Decode `steps` tokens after the prompt from kv, starting with `first`
 * (from the prefill logits). Stops early at BOS/EOS (a story's end).
 */
static int decode(const struct tl_model *m, struct tl_state *st, struct tl_kv *kv, uint32_t first,
		  uint32_t prev, uint32_t steps, float temp, struct tl_rng *rng, float *probs,
		  struct gen *g)
{
	uint32_t t = first;
	int r;
	for (uint32_t i = 0; i < steps; i++) {
		if (t == m->tok->bos || t == m->tok->eos)
			break;
		g->toks[g->n++] = t;
		if ((r = text_add(m->tok, &g->text, &g->len, &g->cap, prev, t)) < 0)
			return r;
		prev = t;
		if (i + 1 == steps)
			break;
		if (kv->len == kv->cap && (r = tl_kv_grow(kv, kv->cap + 16)) < 0)
			return r;
		if ((r = tl_forward(m, st, kv, t, NULL)) < 0)
			return r;
		t = tl_sample(tl_state_logits(st), m->cfg.vocab_size, temp, rng, probs);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = {0};
	struct tl_err err = {{0}};
	struct tl_model *m = NULL;
	struct tl_state *st = NULL;
	struct tl_kv *full = NULL, *ckv = NULL, *ref = NULL;
	struct skv_ctx *ctx = NULL;
	uint32_t *prompt = NULL;
	float *q = NULL, *probs = NULL, *logits0 = NULL;
	struct gen g = {0}, gf = {0};
	size_t np = 0;
	int r;

	r = parse_opts(argc, argv, &o);
	if (r)
		return r > 0 ? 0 : 2;
	r = tl_model_load(o.model, &m, &err);
	if (r < 0) {
		fprintf(stderr, "tiny-llama: %s\n", err.msg);
		return 1;
	}
	const struct tl_config *c = &m->cfg;
	size_t maxp = strlen(o.prompt) * 4 + 8;
	prompt = calloc(maxp, sizeof(*prompt));
	probs = calloc(c->vocab_size, sizeof(float));
	logits0 = calloc(c->vocab_size, sizeof(float));
	g.toks = calloc(o.steps + 1, sizeof(uint32_t));
	gf.toks = calloc(o.steps + 1, sizeof(uint32_t));
	if (!prompt || !probs || !logits0 || !g.toks || !gf.toks || tl_state_new(m, &st) < 0) {
		fprintf(stderr, "tiny-llama: out of memory\n");
		r = -ENOMEM;
		goto out;
	}
	if ((r = tl_tok_encode(m->tok, o.prompt, 1, prompt, maxp, &np)) < 0) {
		fprintf(stderr, "tiny-llama: cannot tokenize prompt: %s\n", strerror(-r));
		goto out;
	}
	uint32_t L = (uint32_t)np;
	uint32_t nq = o.compact ? tl_compact_n_q(&o.params, L) : 0;
	if ((r = tl_kv_new(c, c->n_kv_heads, L + o.steps + 1, &full)) < 0)
		goto out;
	if (nq &&
	    !(q = calloc((size_t)c->n_layers * c->n_heads * nq * c->head_dim, sizeof(float)))) {
		r = -ENOMEM;
		goto out;
	}
	struct tl_qcap qcap = {.q = q, .first = L - nq, .n = nq};
	if ((r = tl_prefill(m, st, full, prompt, L, nq ? &qcap : NULL)) < 0) {
		fprintf(stderr, "tiny-llama: prefill failed: %s\n", strerror(-r));
		goto out;
	}
	memcpy(logits0, tl_state_logits(st), c->vocab_size * sizeof(float));

	struct tl_rng rng;
	tl_rng_seed(&rng, o.seed);
	uint32_t first = tl_sample(logits0, c->vocab_size, o.temp, &rng, probs);
	uint32_t last = prompt[L - 1];

	if (!o.compact) {
		r = decode(m, st, full, first, last, o.steps, o.temp, &rng, probs, &g);
		if (r < 0)
			goto out;
		printf("%s%s\n", o.prompt, g.text ? g.text : "");
		goto out;
	}

	struct skv_error serr = {0};
	struct skv_plan plan;
	if ((r = skv_ctx_new(1, &ctx)) < 0) {
		fprintf(stderr, "tiny-llama: skv_ctx_new: %s\n", strerror(-r));
		goto out;
	}
	if (o.compare) {
		/* The full-cache reference continues from a copy of the prefilled cache. */
		if ((r = tl_kv_new(c, c->n_kv_heads, full->cap, &ref)) < 0)
			goto out;
		for (uint32_t l = 0; l < c->n_layers; l++) {
			size_t n = (size_t)c->n_kv_heads * full->cap;
			memcpy(ref->layers[l].k, full->layers[l].k,
			       n * c->head_dim * sizeof(float));
			memcpy(ref->layers[l].v, full->layers[l].v,
			       n * c->head_dim * sizeof(float));
			memcpy(ref->layers[l].pos, full->layers[l].pos, n * sizeof(int32_t));
		}
		ref->len = full->len;
		ref->next_pos = full->next_pos;
	}
	r = tl_compact(ctx, m, full, q, L - nq, nq, &o.params, o.reserve, &ckv, &plan, &serr);
	if (r < 0) {
		fprintf(stderr, "tiny-llama: compaction failed: %s\n", serr.msg);
		goto out;
	}
	fprintf(stderr, "tiny-llama: prompt %u tokens, kept %u per head x %u heads%s\n", L,
		plan.kept, plan.h_store, plan.bypass ? " (bypass)" : "");
	struct tl_rng rng2 = rng;
	if ((r = decode(m, st, ckv, first, last, o.steps, o.temp, &rng, probs, &g)) < 0)
		goto out;
	printf("%s%s\n", o.prompt, g.text ? g.text : "");
	if (o.compare) {
		struct tl_state *st2;
		if ((r = tl_state_new(m, &st2)) < 0)
			goto out;
		r = decode(m, st2, ref, first, last, o.steps, o.temp, &rng2, probs, &gf);
		tl_state_free(st2);
		if (r < 0)
			goto out;
		uint32_t prefix = 0, same = 0, n = g.n < gf.n ? g.n : gf.n;
		while (prefix < n && g.toks[prefix] == gf.toks[prefix])
			prefix++;
		for (uint32_t i = 0; i < n; i++)
			same += g.toks[i] == gf.toks[i];
		printf("--- full cache:\n%s%s\n", o.prompt, gf.text ? gf.text : "");
		printf("--- agreement: %u of %u tokens agree (first %u identical)\n", same,
		       g.n > gf.n ? g.n : gf.n, prefix);
	}
out:
	free(g.toks);
	free(g.text);
	free(gf.toks);
	free(gf.text);
	free(prompt);
	free(probs);
	free(logits0);
	free(q);
	tl_kv_free(full);
	tl_kv_free(ckv);
	tl_kv_free(ref);
	tl_state_free(st);
	skv_ctx_free(ctx);
	tl_model_free(m);
	return r < 0 ? 1 : 0;
}

// SPDX-License-Identifier: MIT
/* quality-common.c - see quality-common.h. */
#include "quality-common.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int q_parse(int argc, char **argv, const char *prog, struct q_opts *o)
{
	static char defpath[4096];
	const char *shared = getenv("SHARED");
	int c;

	snprintf(defpath, sizeof(defpath), "%s/models/stories260K.gguf",
		 shared && *shared ? shared : "../shared");
	*o = (struct q_opts){.path = getenv("SNAPKV_MODEL") ? getenv("SNAPKV_MODEL") : defpath,
			     .N = 24,
			     .L = 320,
			     .T = 64,
			     .seed = 1234};
	while ((c = getopt(argc, argv, "m:n:L:T:s:")) != -1) {
		switch (c) {
		case 'm':
			o->path = optarg;
			break;
		case 'n':
			o->N = (uint32_t)atoi(optarg);
			break;
		case 'L':
			o->L = (uint32_t)atoi(optarg);
			break;
		case 'T':
			o->T = (uint32_t)atoi(optarg);
			break;
		case 's':
			o->seed = strtoull(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr,
				"usage: %s [-m model] [-n prompts] [-L len] [-T steps] [-s seed]\n",
				prog);
			return 2;
		}
	}
	return 0;
}

int q_load(const char *prog, const char *path, struct tl_model **ret)
{
	struct tl_err err = {{0}};

	if (access(path, R_OK) != 0) {
		printf("%s: model %s not found; skipped (set SHARED or SNAPKV_MODEL)\n", prog,
		       path);
		return 1;
	}
	if (tl_model_load(path, ret, &err) < 0) {
		fprintf(stderr, "%s: %s\n", prog, err.msg);
		return -1;
	}
	return 0;
}

int q_prompt_init(struct q_prompt *p, const struct tl_model *m, uint32_t L, uint32_t T)
{
	const struct tl_config *mc = &m->cfg;
	const uint32_t V = mc->vocab_size;

	memset(p, 0, sizeof(*p));
	p->q = calloc((size_t)mc->n_layers * mc->n_heads * L * mc->head_dim, sizeof(float));
	p->probs = calloc(V, sizeof(float));
	p->ref_lp = calloc((size_t)T * V, sizeof(double));
	p->ref_top = calloc(T, sizeof(uint32_t));
	p->toks = calloc(L + T + 1, sizeof(uint32_t));
	if (!p->q || !p->probs || !p->ref_lp || !p->ref_top || !p->toks) {
		q_prompt_fini(p);
		return -1;
	}
	return 0;
}

void q_prompt_fini(struct q_prompt *p)
{
	free(p->q);
	free(p->probs);
	free(p->ref_lp);
	free(p->ref_top);
	free(p->toks);
	tl_kv_free(p->full);
	memset(p, 0, sizeof(*p));
}

/* A copy of the full cache to decode the reference in. */
static struct tl_kv *copy_kv(const struct tl_model *m, const struct tl_kv *f)
{
	struct tl_kv *k;

	if (tl_kv_new(&m->cfg, f->h_store, f->cap, &k) < 0)
		return NULL;
	for (uint32_t l = 0; l < f->n_layers; l++) {
		size_t n = (size_t)f->h_store * f->cap;
		memcpy(k->layers[l].k, f->layers[l].k, n * f->head_dim * sizeof(float));
		memcpy(k->layers[l].v, f->layers[l].v, n * f->head_dim * sizeof(float));
		memcpy(k->layers[l].pos, f->layers[l].pos, n * sizeof(int32_t));
	}
	k->len = f->len;
	k->next_pos = f->next_pos;
	return k;
}

int q_prompt_next(struct q_prompt *p, const struct tl_model *m, struct tl_state *st,
		  struct tl_rng *rng, uint32_t L, uint32_t T)
{
	const struct tl_config *mc = &m->cfg;
	const uint32_t V = mc->vocab_size;
	struct tl_qcap qc = {.q = p->q, .first = 0, .n = L};
	struct tl_kv *ref;

	tl_kv_free(p->full);
	p->full = NULL;
	if (tl_kv_new(mc, mc->n_kv_heads, L + T + 1, &p->full) < 0)
		return -1;
	/* the prompt's prefill is its sampling */
	p->toks[0] = m->tok->bos;
	for (uint32_t i = 0; i < L; i++) {
		if (tl_forward(m, st, p->full, p->toks[i], &qc) < 0)
			return -1;
		p->forwards++;
		if (i + 1 < L)
			p->toks[i + 1] = tl_sample(tl_state_logits(st), V, 1.0f, rng, p->probs);
	}
	/* y_0 from the prefill's logits, then T greedy steps */
	p->toks[L] = tl_argmax(tl_state_logits(st), V);
	ref = copy_kv(m, p->full);
	if (!ref)
		return -1;
	for (uint32_t i = 0; i < T; i++) {
		if (tl_forward(m, st, ref, p->toks[L + i], NULL) < 0) {
			tl_kv_free(ref);
			return -1;
		}
		p->forwards++;
		q_log_softmax(tl_state_logits(st), V, p->ref_lp + (size_t)i * V);
		p->ref_top[i] = tl_argmax(tl_state_logits(st), V);
		p->toks[L + i + 1] = p->ref_top[i];
	}
	tl_kv_free(ref);
	return 0;
}

void q_log_softmax(const float *x, uint32_t n, double *out)
{
	double mx = x[0], sum = 0, lse;

	for (uint32_t i = 1; i < n; i++)
		mx = x[i] > mx ? x[i] : mx;
	for (uint32_t i = 0; i < n; i++)
		sum += exp(x[i] - mx);
	lse = mx + log(sum);
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] - lse;
}

double q_kl(const double *lp, const double *lq, uint32_t n)
{
	double s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += exp(lp[i]) * (lp[i] - lq[i]);
	return s;
}

double q_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

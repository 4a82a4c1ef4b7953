// SPDX-License-Identifier: MIT
/*
 * bench-quality-budget: the budget modes of SPEC.md on a real model, at
 * equal memory and along the retained-mass target.
 *
 * Prompts are sampled from the model as in bench-quality (quality.c); the
 * full cache's greedy continuation of T tokens is the reference and every
 * compacted cache is teacher-forced through it: top-1 agreement and
 * KL(full || compacted) per step. Table 1 compares, at the memory of uniform
 * SnapKV at C (total kept slots N * H * C), uniform, layers (pyramid r 0.7
 * and 1.5), heads (AdaKV, a 0.2), mass-heads with tau bisected per prompt to
 * the same memory, and StreamingLLM (S 4). mass at equal memory is uniform
 * itself (C* = C). Table 2 follows mass and mass-heads along tau: mean kept
 * fraction against KL, and how often a fallback below 0.5 would fire.
 *
 *   bench-quality-budget [-m model.gguf] [-n prompts] [-L len] [-T steps] [-s seed]
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quality-common.h"
#include "tl-compact.h"
#include "tl-model.h"

#define WINDOW 8
static const uint32_t caps[] = {12, 24, 48};
#define N_CAP 3
enum { M_UNIFORM, M_PYR_05, M_PYR_2, M_HEADS, M_MASS_HEADS_EQ, M_STREAMING, N_EQ };
static const char *const eq_names[N_EQ] = {
    "uniform (snapkv avg k5)",
    "layers pyramid r 0.7",
    "layers pyramid r 1.5",
    "heads a 0.2",
    "mass-heads, tau to equal memory",
    "streamingllm S4",
};
static const float taus[] = {0.5f, 0.7f, 0.8f, 0.9f, 0.95f, 0.98f};
#define N_TAU (sizeof(taus) / sizeof(taus[0]))

struct acc {
	double kl, agree, kept_frac;
	uint64_t n, compactions, fallbacks;
	double last_prompt_kl; /* mean KL over the steps of the latest prompt */
};

/* A compact cache with per-head lengths where the mode is ragged. */
struct bcache {
	struct tl_kv *kv;
	struct tl_budget res;
};

static void bcache_free(struct bcache *b)
{
	tl_kv_free(b->kv);
	memset(b, 0, sizeof(*b));
}

static int budget_compact(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
			  const float *q, const struct skv_params *p, uint32_t reserve,
			  struct bcache *b, struct skv_error *err)
{
	memset(b, 0, sizeof(*b));
	return tl_compact_budget(ctx, m, full, q, 0, full->len, p, reserve, &b->kv, &b->res, err);
}

/* Teacher-forced T steps through b against the reference. */
static int score(const struct tl_model *m, struct tl_state *st, struct bcache *b,
		 const uint32_t *toks, uint32_t T, const double *ref_lp, const uint32_t *ref_top,
		 double *lp, struct acc *a, double full_slots)
{
	const uint32_t V = m->cfg.vocab_size;
	double pk = 0;
	for (uint32_t i = 0; i < T; i++) {
		if (tl_forward(m, st, b->kv, toks[i], NULL) < 0)
			return -1;
		q_log_softmax(tl_state_logits(st), V, lp);
		double k = q_kl(ref_lp + (size_t)i * V, lp, V);
		a->kl += k;
		pk += k;
		a->agree += tl_argmax(tl_state_logits(st), V) == ref_top[i];
		a->n++;
	}
	a->last_prompt_kl = pk / T;
	a->kept_frac += (double)b->res.kept_total / full_slots;
	a->compactions++;
	a->fallbacks += b->res.fallback ? 1 : 0;
	return 0;
}

static void params_for(struct skv_params *p, int mode, uint32_t C, uint32_t L)
{
	skv_params_init(p);
	p->window = WINDOW;
	p->capacity = C;
	switch (mode) {
	case M_PYR_05:
	case M_PYR_2:
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->pyramid_r = mode == M_PYR_05 ? 0.7f : 1.5f;
		break;
	case M_HEADS:
		p->budget_mode = SKV_BUDGET_HEADS;
		p->head_floor = 0.2f;
		break;
	case M_MASS_HEADS_EQ:
		p->budget_mode = SKV_BUDGET_MASS_HEADS;
		p->c_min = WINDOW + 1;
		p->c_max = L;
		break;
	case M_STREAMING:
		p->policy = SKV_POLICY_STREAMINGLLM;
		p->sinks = 4;
		break;
	default:
		break;
	}
}

/* mass-heads at the memory of uniform C: the largest tau whose total kept
 * slots do not exceed N * H * C (the total is monotone in tau). */
static int mass_heads_equal(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
			    const float *q, uint32_t C, uint32_t T, struct bcache *ret)
{
	const uint64_t target = (uint64_t)m->cfg.n_layers * m->cfg.n_heads * C;
	struct skv_params p;
	struct skv_error e;
	float lo = 0.0f, hi = 1.0f;

	params_for(&p, M_MASS_HEADS_EQ, C, full->len);
	for (int it = 0; it < 24; it++) {
		struct bcache b;
		p.tau = (lo + hi) / 2;
		if (p.tau <= 0)
			break;
		if (budget_compact(ctx, m, full, q, &p, 0, &b, &e) < 0)
			return -1;
		if (b.res.kept_total <= target)
			lo = p.tau;
		else
			hi = p.tau;
		bcache_free(&b);
	}
	p.tau = lo > 0 ? lo : 1e-6f;
	return budget_compact(ctx, m, full, q, &p, T, ret, &e);
}

int main(int argc, char **argv)
{
	struct q_opts o;
	struct q_prompt pr;
	int c = q_parse(argc, argv, "bench-quality-budget", &o);

	if (c)
		return c;
	const uint32_t N = o.N, L = o.L, T = o.T;
	const uint64_t seed = o.seed;
	struct tl_model *m;
	c = q_load("bench-quality-budget", o.path, &m);
	if (c)
		return c < 0 ? 1 : 0;
	const struct tl_config *mc = &m->cfg;
	const uint32_t V = mc->vocab_size;
	if (N == 0 || L < 64 || T == 0 || L + T + 1 > 512) {
		fprintf(stderr, "bench-quality-budget: need N > 0, L >= 64, L + T < 512\n");
		return 2;
	}
	static struct acc eq[N_EQ][N_CAP], tc[2][N_TAU];
	/* per-prompt KL minus uniform's at the same memory: sum, squares, wins */
	static double dsum[N_EQ][N_CAP], dsq[N_EQ][N_CAP];
	static uint32_t dwin[N_EQ][N_CAP];
	struct skv_ctx *ctx;
	struct tl_state *st;
	if (skv_ctx_new(1, &ctx) < 0 || tl_state_new(m, &st) < 0)
		return 1;
	double *lp = calloc(V, sizeof(double));
	if (!lp || q_prompt_init(&pr, m, L, T) < 0)
		return 1;
	const float *q = pr.q;
	const double *ref_lp = pr.ref_lp;
	const uint32_t *ref_top = pr.ref_top, *toks = pr.toks;
	const double full_slots = (double)mc->n_layers * mc->n_heads * L;
	struct tl_rng rng;
	tl_rng_seed(&rng, seed);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (uint32_t pi = 0; pi < N; pi++) {
		if (q_prompt_next(&pr, m, st, &rng, L, T) < 0)
			return 1;
		const struct tl_kv *full = pr.full;
		for (int mi = 0; mi < N_EQ; mi++)
			for (uint32_t ki = 0; ki < N_CAP; ki++) {
				struct bcache b;
				struct skv_params p;
				struct skv_error e = {0};
				int r;
				if (mi == M_MASS_HEADS_EQ) {
					r = mass_heads_equal(ctx, m, full, q, caps[ki], T, &b);
				} else {
					params_for(&p, mi, caps[ki], L);
					r = budget_compact(ctx, m, full, q, &p, T, &b, &e);
				}
				if (r < 0) {
					fprintf(stderr, "bench-quality-budget: %s C %u: %s\n",
						eq_names[mi], caps[ki], e.msg);
					return 1;
				}
				if (score(m, st, &b, toks + L, T, ref_lp, ref_top, lp, &eq[mi][ki],
					  full_slots) < 0)
					return 1;
				bcache_free(&b);
			}
		for (int mi = 1; mi < N_EQ; mi++)
			for (uint32_t ki = 0; ki < N_CAP; ki++) {
				double d =
				    eq[mi][ki].last_prompt_kl - eq[M_UNIFORM][ki].last_prompt_kl;
				dsum[mi][ki] += d;
				dsq[mi][ki] += d * d;
				dwin[mi][ki] += d < 0;
			}
		for (int md = 0; md < 2; md++)
			for (uint32_t ti = 0; ti < N_TAU; ti++) {
				struct bcache b;
				struct skv_params p;
				struct skv_error e = {0};
				skv_params_init(&p);
				p.window = WINDOW;
				p.budget_mode = md ? SKV_BUDGET_MASS_HEADS : SKV_BUDGET_MASS;
				p.tau = taus[ti];
				p.c_min = WINDOW + 1;
				p.c_max = L;
				p.c_step = 4;
				p.fallback_below = 0.5f;
				if (budget_compact(ctx, m, full, q, &p, T, &b, &e) < 0) {
					fprintf(stderr, "bench-quality-budget: tau %g: %s\n",
						(double)taus[ti], e.msg);
					return 1;
				}
				if (score(m, st, &b, toks + L, T, ref_lp, ref_top, lp, &tc[md][ti],
					  full_slots) < 0)
					return 1;
				bcache_free(&b);
			}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("budget modes at equal memory: %u prompts x %u tokens sampled from the model "
	       "(seed %llu), %u-token greedy continuation of the full cache, W = %d, gqa expand;\n"
	       "top-1 agreement %% / mean KL(full || compacted) in nats (kept fraction of the "
	       "full cache)\n\n| mode |",
	       N, L, (unsigned long long)seed, T, WINDOW);
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf(" memory of C = %u |", caps[ki]);
	printf("\n|---|");
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf("---|");
	printf("\n");
	for (int mi = 0; mi < N_EQ; mi++) {
		printf("| %s |", eq_names[mi]);
		for (uint32_t ki = 0; ki < N_CAP; ki++) {
			const struct acc *a = &eq[mi][ki];
			printf(" %.1f%% / %.4f (%.3f) |", 100.0 * a->agree / a->n, a->kl / a->n,
			       a->kept_frac / a->compactions);
		}
		printf("\n");
	}
	printf("\npaired with uniform at the same memory: mean per-prompt KL difference ± "
	       "standard error (prompts where the mode's KL is lower)\n\n| mode |");
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf(" memory of C = %u |", caps[ki]);
	printf("\n|---|");
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf("---|");
	printf("\n");
	for (int mi = 1; mi < N_EQ; mi++) {
		printf("| %s |", eq_names[mi]);
		for (uint32_t ki = 0; ki < N_CAP; ki++) {
			double md = dsum[mi][ki] / N;
			double var = N > 1 ? (dsq[mi][ki] - N * md * md) / (N - 1) : 0;
			printf(" %+.4f ± %.4f (%u/%u) |", md, sqrt(var > 0 ? var : 0) / sqrt(N),
			       dwin[mi][ki], N);
		}
		printf("\n");
	}
	printf("\nretained-mass targets (C_min %d, C_max L, mass step 4, fallback below 0.5): "
	       "mean kept fraction / top-1 / KL / fallbacks\n\n| tau | mass | mass-heads |\n"
	       "|---|---|---|\n",
	       WINDOW + 1);
	for (uint32_t ti = 0; ti < N_TAU; ti++) {
		printf("| %.2f |", (double)taus[ti]);
		for (int md = 0; md < 2; md++) {
			const struct acc *a = &tc[md][ti];
			printf(" %.3f / %.1f%% / %.4f / %llu |", a->kept_frac / a->compactions,
			       100.0 * a->agree / a->n, a->kl / a->n,
			       (unsigned long long)a->fallbacks);
		}
		printf("\n");
	}
	printf("\n%.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
	q_prompt_fini(&pr);
	free(lp);
	tl_state_free(st);
	skv_ctx_free(ctx);
	tl_model_free(m);
	return 0;
}

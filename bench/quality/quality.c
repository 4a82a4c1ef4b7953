// SPDX-License-Identifier: MIT
/*
 * bench-quality: what compaction does to a real model's output.
 *
 * N prompts of L tokens are sampled from the model itself (from BOS, fixed
 * seed, temperature 1). For each, the full cache's greedy continuation of T
 * tokens is the reference. Then, for every policy configuration, the prompt
 * cache is compacted with libskv and the continuation is teacher-forced
 * through the compact cache (the first token comes from the full prefill
 * logits, as a serving engine does). At each of the T steps the compacted
 * model's next-token distribution is compared with the full cache's:
 * top-1 agreement and KL(full || compacted), averaged over steps and prompts.
 *
 *   bench-quality [-m model.gguf] [-n prompts] [-L prompt_len] [-T steps] [-s seed]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quality-common.h"
#include "tl-compact.h"
#include "tl-model.h"

struct cfg {
	const char *name;
	enum skv_policy policy;
	enum skv_pooling pool;
	uint32_t kernel;
};

static const struct cfg cfgs[] = {
    {"snapkv avg k5", SKV_POLICY_SNAPKV, SKV_POOL_AVG, 5},
    {"snapkv max k7", SKV_POLICY_SNAPKV, SKV_POOL_MAX, 7},
    {"h2o", SKV_POLICY_H2O, SKV_POOL_AVG, 1},
    {"streamingllm S4", SKV_POLICY_STREAMINGLLM, SKV_POOL_AVG, 1},
    {"window", SKV_POLICY_WINDOW, SKV_POOL_AVG, 1},
};
#define N_CFG (sizeof(cfgs) / sizeof(cfgs[0]))
static const uint32_t caps[] = {12, 16, 24, 48};
#define N_CAP (sizeof(caps) / sizeof(caps[0]))
static const enum skv_gqa modes[] = {SKV_GQA_EXPAND, SKV_GQA_GROUP};
#define N_MODE 2
#define WINDOW 8

struct acc {
	double kl;
	double agree;
	uint64_t n;
	double kl_p, kl_p2; /* sum and sum of squares of per-prompt mean KL */
	double pos_sum;	    /* kept prompt positions, to see where a policy looks */
	uint64_t pos_n;
	uint32_t prompts;
};

/* The header of a results table: a column per capacity. */
static void table_head(void)
{
	printf("| policy | gqa |");
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf(" C = %u |", caps[ki]);
	printf("\n|---|---|");
	for (uint32_t ki = 0; ki < N_CAP; ki++)
		printf("---|");
	printf("\n");
}

/* The first two cells of a results row: policy and GQA mode. */
static void row_label(uint32_t ci, uint32_t mi)
{
	printf("| %s | %s |", cfgs[ci].name, modes[mi] == SKV_GQA_EXPAND ? "expand" : "group");
}

int main(int argc, char **argv)
{
	struct q_opts o;
	struct q_prompt pr;
	int c = q_parse(argc, argv, "bench-quality", &o);

	if (c)
		return c;
	const uint32_t N = o.N, L = o.L, T = o.T;
	const uint64_t seed = o.seed;
	struct tl_model *m;
	c = q_load("bench-quality", o.path, &m);
	if (c)
		return c < 0 ? 1 : 0;
	const struct tl_config *mc = &m->cfg;
	const uint32_t V = mc->vocab_size;
	if (N == 0 || L < 2 * WINDOW || T == 0 || L + T + 1 > 512) {
		fprintf(stderr,
			"bench-quality: need N > 0, L >= %d, L + T < 512 (trained length)\n",
			2 * WINDOW);
		return 2;
	}

	struct acc accs[N_CFG][N_MODE][N_CAP];
	memset(accs, 0, sizeof(accs));
	struct skv_ctx *ctx;
	if (skv_ctx_new(1, &ctx) < 0)
		return 1;
	struct tl_state *st;
	if (tl_state_new(m, &st) < 0)
		return 1;
	double *lp = calloc(V, sizeof(double));
	double *pkl = calloc((size_t)N * N_CFG * N_MODE * N_CAP, sizeof(double));
	if (!lp || !pkl || q_prompt_init(&pr, m, L, T) < 0)
		return 1;
	float *q = pr.q;
	double *ref_lp = pr.ref_lp;
	uint32_t *ref_top = pr.ref_top, *toks = pr.toks;

	struct tl_rng rng;
	tl_rng_seed(&rng, seed);
	double t0 = q_now();
	for (uint32_t pi = 0; pi < N; pi++) {
		if (q_prompt_next(&pr, m, st, &rng, L, T) < 0)
			return 1;
		struct tl_kv *full = pr.full;
		if (pi == 0) {
			char piece[TL_TOK_MAX_PIECE + 8];
			printf("prompt 0 (first 48 of %u tokens):", L);
			for (uint32_t i = 1; i < 48; i++) {
				tl_tok_decode(m->tok, toks[i - 1], toks[i], piece, sizeof(piece));
				printf("%s", piece);
			}
			printf(" ...\n");
		}

		for (uint32_t ci = 0; ci < N_CFG; ci++)
			for (uint32_t mi = 0; mi < N_MODE; mi++)
				for (uint32_t ki = 0; ki < N_CAP; ki++) {
					struct skv_params p;
					struct skv_error serr = {0};
					struct skv_plan plan;
					struct tl_kv *kv;
					skv_params_init(&p);
					p.policy = cfgs[ci].policy;
					p.pooling = cfgs[ci].pool;
					p.kernel = cfgs[ci].kernel;
					p.gqa = modes[mi];
					p.capacity = caps[ki];
					p.window = WINDOW;
					p.sinks = 4;
					int r = tl_compact(ctx, m, full, q, 0, L, &p, T, &kv, &plan,
							   &serr);
					if (r < 0) {
						fprintf(stderr, "bench-quality: %s C=%u: %s\n",
							cfgs[ci].name, caps[ki], serr.msg);
						return 1;
					}
					struct acc *a = &accs[ci][mi][ki];
					double kl_prompt = 0;
					for (uint32_t l = 0; l < kv->n_layers; l++)
						for (uint32_t h = 0; h < kv->h_store; h++)
							for (uint32_t i = 0; i < kv->len; i++)
								a->pos_sum +=
								    kv->layers[l]
									.pos[h * kv->layers[l]
										     .pos_stride +
									     i];
					a->pos_n += (uint64_t)kv->n_layers * kv->h_store * kv->len;
					for (uint32_t i = 0; i < T; i++) {
						if (tl_forward(m, st, kv, toks[L + i], NULL) < 0)
							return 1;
						pr.forwards++;
						const float *lg = tl_state_logits(st);
						q_log_softmax(lg, V, lp);
						double k = q_kl(ref_lp + (size_t)i * V, lp, V);
						a->kl += k;
						kl_prompt += k;
						a->agree += tl_argmax(lg, V) == ref_top[i];
						a->n++;
					}
					kl_prompt /= T;
					pkl[(((size_t)pi * N_CFG + ci) * N_MODE + mi) * N_CAP +
					    ki] = kl_prompt;
					a->kl_p += kl_prompt;
					a->kl_p2 += kl_prompt * kl_prompt;
					a->prompts++;
					tl_kv_free(kv);
				}
	}
	double el = q_now() - t0;

	printf(
	    "\nteacher-forced quality: %u prompts x %u tokens sampled from the model "
	    "(seed %llu, temperature 1),\n%u-token greedy continuation of the full cache; W = %d; "
	    "top-1 agreement %% / mean KL(full || compacted) in nats ± its standard error over "
	    "prompts\n\n",
	    N, L, (unsigned long long)seed, T, WINDOW);
	table_head();
	for (uint32_t ci = 0; ci < N_CFG; ci++)
		for (uint32_t mi = 0; mi < N_MODE; mi++) {
			row_label(ci, mi);
			for (uint32_t ki = 0; ki < N_CAP; ki++) {
				const struct acc *a = &accs[ci][mi][ki];
				/* Standard error of the mean over prompts (steps within one
				 * prompt are not independent). */
				double mp = a->kl_p / a->prompts;
				double var = a->prompts > 1 ? (a->kl_p2 - a->prompts * mp * mp) /
								  (a->prompts - 1)
							    : 0;
				double se = sqrt(var > 0 ? var : 0) / sqrt(a->prompts);
				printf(" %.1f%% / %.4f ± %.4f |", 100.0 * a->agree / a->n,
				       a->kl / a->n, se);
			}
			printf("\n");
		}
	/* Paired against a plain window of the same budget and mode: the prompts
	 * are shared, so the per-prompt difference removes their difficulty. */
	printf("\npaired with window at the same C and gqa: mean KL difference ± standard "
	       "error over prompts (prompts where the policy's KL is lower)\n\n");
	table_head();
	const uint32_t wi = N_CFG - 1; /* window */
	for (uint32_t ci = 0; ci < wi; ci++)
		for (uint32_t mi = 0; mi < N_MODE; mi++) {
			row_label(ci, mi);
			for (uint32_t ki = 0; ki < N_CAP; ki++) {
				double sd = 0, sd2 = 0;
				uint32_t wins = 0;
				for (uint32_t pi = 0; pi < N; pi++) {
					double d =
					    pkl[(((size_t)pi * N_CFG + ci) * N_MODE + mi) * N_CAP +
						ki] -
					    pkl[(((size_t)pi * N_CFG + wi) * N_MODE + mi) * N_CAP +
						ki];
					sd += d;
					sd2 += d * d;
					wins += d < 0;
				}
				double md = sd / N;
				double var = N > 1 ? (sd2 - N * md * md) / (N - 1) : 0;
				printf(" %+.4f ± %.4f (%u/%u) |", md,
				       sqrt(var > 0 ? var : 0) / sqrt(N), wins, N);
			}
			printf("\n");
		}
	printf("\nmean original position of the kept prompt slots (L = %u)\n\n", L);
	table_head();
	for (uint32_t ci = 0; ci < N_CFG; ci++)
		for (uint32_t mi = 0; mi < N_MODE; mi++) {
			row_label(ci, mi);
			for (uint32_t ki = 0; ki < N_CAP; ki++)
				printf(" %.0f |",
				       accs[ci][mi][ki].pos_sum / accs[ci][mi][ki].pos_n);
			printf("\n");
		}
	printf("\n%llu forwards, %u compactions in %.1f s\n", (unsigned long long)pr.forwards,
	       N * (unsigned)(N_CFG * N_MODE * N_CAP), el);

	q_prompt_fini(&pr);
	free(lp);
	free(pkl);
	tl_state_free(st);
	skv_ctx_free(ctx);
	tl_model_free(m);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * quality-common.h - what bench-quality and bench-quality-budget share: the
 * options, loading the model, sampling a prompt from it with its full-cache
 * greedy continuation as the reference, and the distances to it.
 */
#ifndef QUALITY_COMMON_H
#define QUALITY_COMMON_H

#include <stdint.h>

#include "tl-model.h"

struct q_opts {
	const char *path; /* the model (default: $SNAPKV_MODEL, else $SHARED/models/..) */
	uint32_t N, L, T; /* prompts, prompt length, continuation steps */
	uint64_t seed;
};

/* Defaults, then -m -n -L -T -s. 0, or 2 after printing prog's usage. */
int q_parse(int argc, char **argv, const char *prog, struct q_opts *o);

/* 0 loaded; 1 when the model file is absent (said, nothing to measure);
 * -1 when it does not load (said). */
int q_load(const char *prog, const char *path, struct tl_model **ret);

/* A prompt of L tokens sampled from the model (from BOS, temperature 1) and
 * its reference: the full cache's greedy continuation of T tokens. */
struct q_prompt {
	float *q;	    /* [layers][H_q][L][D]: the prompt's queries */
	float *probs;	    /* [V] sampling scratch */
	double *ref_lp;	    /* [T][V] reference log-probabilities */
	uint32_t *ref_top;  /* [T] reference argmax */
	uint32_t *toks;	    /* [L + T + 1]: prompt, then the reference tokens */
	struct tl_kv *full; /* the prompt's cache (room for T + 1 more) */
	uint64_t forwards;  /* model steps taken so far */
};

int q_prompt_init(struct q_prompt *p, const struct tl_model *m, uint32_t L, uint32_t T);
void q_prompt_fini(struct q_prompt *p);
/* Sample the next prompt; frees the previous one's cache. 0 or -1. */
int q_prompt_next(struct q_prompt *p, const struct tl_model *m, struct tl_state *st,
		  struct tl_rng *rng, uint32_t L, uint32_t T);

void q_log_softmax(const float *x, uint32_t n, double *out);
double q_kl(const double *lp, const double *lq, uint32_t n);
double q_now(void);

#endif /* QUALITY_COMMON_H */

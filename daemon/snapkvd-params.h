/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-params.h - the parameters a CompactRequest asks for, read into
 * the job as validation's first steps (snapkvd-request.c calls them in
 * order): the SnapKV parameters, the budget mode's fields, the decision
 * group's, the budget mode's rules and the room they need, and the
 * scaling of C (and a mode's own budgets) under memory pressure. Each
 * says which checks it owns; the values skv_plan() judges are left to it.
 * 0, or -errno with the reason in err; nothing is held on failure.
 */
#ifndef SNAPKVD_PARAMS_H
#define SNAPKVD_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/snapkv.pb-c.h"
#include "skv.h"
#include "snapkvd-forward.h"

struct snapkvd_request_env;

/* Params (NULL: the defaults) into ret: the protected ranges' count and
 * presence. */
int snapkvd_params_read(const Snapkv__V1__Params *p, struct skv_params *ret, char *err,
			size_t errlen);
/* The budget mode's fields (CompactRequest 120-129) into p. */
int snapkvd_params_read_budget(const Snapkv__V1__CompactRequest *req, struct skv_params *p,
			       char *err, size_t errlen);
/* The decision-group fields (CompactRequest 130-132) into j->gm. */
int snapkvd_params_read_group(const struct snapkvd_request_env *env,
			      const Snapkv__V1__CompactRequest *req, struct snapkvd_job *j,
			      char *err, size_t errlen);
/* Not today's single C: a mode other than uniform, or a fallback. */
bool snapkvd_params_budgeted(const struct skv_params *p);
/* A budget mode's per-layer rules, its room (plan->kept) and layout. */
int snapkvd_params_check_budget(struct snapkvd_job *j, const Snapkv__V1__CompactRequest *req,
				struct skv_plan *plan, char *err, size_t errlen);
/* Pressure: C (and a mode's budgets) scaled by the factor of `level` (the
 * current one, or a decision group's first member's). */
void snapkvd_params_scale(const struct snapkvd_policy *ops, int level, struct skv_params *p,
			  bool *ret_scaled);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-group.h - decision groups (SPEC.md "Budgets beyond one C"):
 * COMPACT requests with the same group key and size from one tenant,
 * decided together. Tensor-parallel ranks of one engine each hold some of
 * the heads but must keep the same number of tokens: in mass mode C* is the
 * largest of the members' own C* (the smallest ladder C meeting tau on every
 * member), and the fallback applies to every member when one member's mass
 * at C* is below fallback_below.
 *
 * A member's job runs in two steps (skv_compact_begin/_end on the host;
 * on the CUDA backend a whole compaction for its own choice, then one for
 * the group's where that differs). After the first it arrives at its group
 * and is parked; the last member to arrive decides for all (host-side
 * arithmetic on the members' results) and releases them to their second
 * step. A group whose
 * members do not all arrive by its deadline, one of whose members failed
 * or whose session ended, fails every member (nothing is kept) and leaves
 * the registry at once, so the key may be used again.
 *
 * The registry has its own lock: the loop thread joins jobs at admission
 * and sweeps deadlines, workers arrive. It never calls the compactor: it
 * hands the jobs it releases back to its caller.
 */
#ifndef SNAPKVD_GROUP_H
#define SNAPKVD_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"
#include "snapkvd-metrics.h"

struct snapkvd_groups;
struct snapkvd_group;
struct skv_pending;

#define SNAPKVD_GROUP_KEY_MAX 64 /* bytes of a decision group's key */

/*
 * A job's membership of its decision group, embedded in the job: what the
 * request asked for (key, size, wait; validation fills them) and, once
 * joined at admission, the group; a member runs in two steps: the first
 * (skv_compact_begin, `pending` holds its state) and, once the group has
 * decided (`decided`, C* and the fallback for all), the second. No
 * pressure scaling: members must agree on their budgets.
 */
struct snapkvd_group_member {
	char key[SNAPKVD_GROUP_KEY_MAX + 1];
	uint32_t size, timeout_ms;
	struct snapkvd_group *group;
	struct skv_pending *pending;
	/* the CUDA backend's first step (no pending): the member's own choice
	 * and the smallest retained mass at it (gpu_step set by its runner) */
	bool gpu_step, own_fallback;
	uint32_t own_c_star;
	float own_min_mass;
	bool decided, fallback;
	uint32_t c_star;
	uint64_t wait_ns; /* first scored member to the last */
};

/* The membership ends with its job: the first step's state freed, the
 * group's reference dropped. */
void snapkvd_group_member_clear(struct snapkvd_group_member *m);

/* Counters for the metrics (all since start). */
struct snapkvd_group_stats {
	uint64_t decided;   /* groups decided */
	uint64_t timeouts;  /* groups failed at their deadline */
	uint64_t failed;    /* groups failed otherwise (a member's error or end) */
	uint64_t fallbacks; /* decided groups that fell back */
	/* decided groups: first scored member to the last, seconds */
	struct snapkvd_histogram wait;
	unsigned pending; /* groups not decided yet */
	unsigned parked;  /* jobs parked in them */
};
/* The upper bounds of wait_le, in ms. */
#define SNAPKVD_GROUP_WAIT_LE_MS                                                                   \
	{                                                                                          \
		1, 10, 100, 1000, 10000, 60000                                                     \
	}

int snapkvd_groups_new(struct snapkvd_groups **ret);
/* Every group has been swept (snapkvd_groups_sweep with `all`) and every job
 * freed before. */
void snapkvd_groups_free(struct snapkvd_groups *g);

/*
 * Job j (validated and admitted, j->gm's key, size and timeout set) joins
 * its tenant's group of that key (keys are per tenant: another uid's group
 * of the same key is another group), created when none is pending: the same
 * size, shape, K/V dtypes and parameters (scaled at the group's pressure
 * level) as the members before it, at most group_size members,
 * at most max_tenant_groups pending groups of one uid. 0, or -errno with the
 * reason (naming the field or limit) in err; nothing changed then.
 */
int snapkvd_groups_join(struct snapkvd_groups *g, struct snapkvd_job *j, uint32_t uid,
			unsigned max_tenant_groups, uint64_t now_ns, char *err, size_t errlen);

/*
 * The pressure level the open group of (uid, key) was created at, into
 * *ret_level: a later member is scaled at it, so all agree. 0, or -ENOENT
 * when no such group is open (the member will create it). Loop thread.
 */
int snapkvd_groups_level(struct snapkvd_groups *g, uint32_t uid, const char *key, int *ret_level);
/*
 * Job j has run its first step (j->status says how). Returns the jobs this
 * releases, linked by ->next: none while the group waits for others; every
 * parked member once the last one arrives (decided: j->gm.decided, the group's
 * C* and fallback set, status 0) or once the group failed (status < 0, the
 * reason in err). Any thread.
 */
struct snapkvd_job *snapkvd_groups_arrive(struct snapkvd_groups *g, struct snapkvd_job *j,
					  uint64_t now_ns);

/*
 * Groups past their deadline, or with a parked member whose session ended,
 * or every pending group when `all` (the daemon stops): failed; returns
 * the parked jobs released (status < 0), linked by ->next. Loop thread.
 */
struct snapkvd_job *snapkvd_groups_sweep(struct snapkvd_groups *g, uint64_t now_ns, bool all);

/* The job is freed: its group loses a member reference. */
void snapkvd_group_put(struct snapkvd_group *grp);

void snapkvd_groups_stats(struct snapkvd_groups *g, struct snapkvd_group_stats *ret);

#endif

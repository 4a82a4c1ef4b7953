// SPDX-License-Identifier: MIT
/*
 * snapkvd-group.c - decision groups; see snapkvd-group.h.
 */
#include "snapkvd-group.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-job.h"

enum group_state { GROUP_OPEN, GROUP_DECIDED, GROUP_FAILED };

struct snapkvd_group {
	struct snapkvd_groups *reg;
	struct snapkvd_group *next; /* in the registry while OPEN */
	char key[SNAPKVD_GROUP_KEY_MAX + 1];
	uint32_t uid, size;
	unsigned refs;	  /* member jobs not freed yet */
	unsigned joined;  /* members admitted */
	unsigned arrived; /* members parked: parked[0 .. arrived) */
	struct snapkvd_job **parked;
	struct skv_shape shape; /* of the first member: all share them */
	struct skv_params params;
	uint32_t layers;
	bool paged;
	enum skv_dtype k_dtype, v_dtype;
	int pressure_level; /* every member is scaled at this level */
	uint64_t deadline_ns, first_arrival_ns;
	enum group_state state;
	int fail_status;
	char fail_msg[256];
};

struct snapkvd_groups {
	pthread_mutex_t mu;
	struct snapkvd_group *open; /* pending groups */
	struct snapkvd_group_stats st;
};

int snapkvd_groups_new(struct snapkvd_groups **ret)
{
	struct snapkvd_groups *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	snapkvd_histogram_init_seconds(&g->st.wait);
	*ret = g;
	return 0;
}

static void group_free(struct snapkvd_group *grp)
{
	free(grp->parked);
	free(grp);
}

void snapkvd_groups_free(struct snapkvd_groups *g)
{
	if (!g)
		return;
	/* only groups no job refers to can remain: their members never arrived
	 * because they were never admitted past the join */
	while (g->open) {
		struct snapkvd_group *n = g->open->next;

		group_free(g->open);
		g->open = n;
	}
	pthread_mutex_destroy(&g->mu);
	free(g);
}

/* ------------------------------------------------------------------ join */

#define SAME(field, what)                                                                          \
	do {                                                                                       \
		if (a->field != b->field)                                                          \
			return snprintf(err, errlen, "%s %g differs from the group's %g", what,    \
					(double)b->field, (double)a->field),                       \
			       -EINVAL;                                                            \
	} while (0)

/* A member's K or V dtype (its layers share one; none before its tensors). */
static enum skv_dtype member_dtype(const struct snapkvd_job *j, bool v)
{
	if (!j->in)
		return SKV_DTYPE_UNSPECIFIED;
	return v ? j->in[0].v.dtype : j->in[0].k.dtype;
}

static const char *dtype_name(enum skv_dtype dt)
{
	const char *n = skv_dtype_name(dt);

	return n ? n : "unset";
}

/* Whether member b agrees with the group's first member a on the shape and
 * every parameter of the budget; names the first difference. */
static int same_member(const struct snapkvd_group *a, const struct snapkvd_job *b, char *err,
		       size_t errlen)
{
	const struct skv_params *ap = &a->params, *bp = &b->params;

	SAME(layers, "layers");
	SAME(shape.prompt_len, "prompt_len");
	SAME(shape.h_q, "h_q");
	SAME(shape.h_kv, "h_kv");
	SAME(shape.head_dim, "head_dim");
	SAME(shape.n_q, "n_q");
	if (a->paged != b->paged)
		return snprintf(err, errlen, "out_layout differs from the group's (paged or not)"),
		       -EINVAL;
	if (a->k_dtype != member_dtype(b, false) || a->v_dtype != member_dtype(b, true))
		return snprintf(err, errlen, "K/V dtype %s/%s differs from the group's %s/%s",
				dtype_name(member_dtype(b, false)),
				dtype_name(member_dtype(b, true)), dtype_name(a->k_dtype),
				dtype_name(a->v_dtype)),
		       -EINVAL;
	if (ap->budget_mode != bp->budget_mode)
		return snprintf(err, errlen, "budget mode %s differs from the group's %s",
				skv_budget_name(bp->budget_mode), skv_budget_name(ap->budget_mode)),
		       -EINVAL;
	{
		const struct skv_params *a = ap, *b = bp;

		SAME(policy, "policy");
		SAME(window, "window");
		SAME(budget, "budget C");
		SAME(kernel, "kernel");
		SAME(pooling, "pooling");
		SAME(gqa, "gqa");
		SAME(sinks, "sinks");
		SAME(tau, "tau");
		SAME(c_min, "C_min");
		SAME(c_max, "C_max");
		SAME(c_step, "step");
		SAME(pyramid_r, "pyramid r");
		SAME(fallback_below, "fallback_below");
		SAME(n_layer_caps, "the per-layer list's length");
		SAME(n_protected, "protected ranges");
		if (memcmp(a->layer_caps, b->layer_caps,
			   a->n_layer_caps * sizeof(a->layer_caps[0])))
			return snprintf(err, errlen, "the per-layer list differs from the group's"),
			       -EINVAL;
		if (memcmp(a->protected_ranges, b->protected_ranges,
			   a->n_protected * sizeof(a->protected_ranges[0])))
			return snprintf(err, errlen, "protected ranges differ from the group's"),
			       -EINVAL;
	}
	return 0;
}
#undef SAME

/* Keys are per tenant: two tenants' groups of one key are two groups. */
static struct snapkvd_group *find_open(struct snapkvd_groups *g, uint32_t uid, const char *key)
{
	for (struct snapkvd_group *grp = g->open; grp; grp = grp->next)
		if (grp->uid == uid && !strcmp(grp->key, key))
			return grp;
	return NULL;
}

int snapkvd_groups_level(struct snapkvd_groups *g, uint32_t uid, const char *key, int *ret_level)
{
	struct snapkvd_group *grp;
	int r = -ENOENT;

	pthread_mutex_lock(&g->mu);
	grp = find_open(g, uid, key);
	if (grp) {
		*ret_level = grp->pressure_level;
		r = 0;
	}
	pthread_mutex_unlock(&g->mu);
	return r;
}

static unsigned tenant_open(struct snapkvd_groups *g, uint32_t uid)
{
	unsigned n = 0;

	for (struct snapkvd_group *grp = g->open; grp; grp = grp->next)
		n += grp->uid == uid;
	return n;
}

static int group_create(struct snapkvd_groups *g, const struct snapkvd_job *j, uint32_t uid,
			uint64_t now_ns, struct snapkvd_group **ret)
{
	struct snapkvd_group *grp = calloc(1, sizeof(*grp));

	if (!grp || !(grp->parked = calloc(j->gm.size, sizeof(*grp->parked)))) {
		free(grp);
		return -ENOMEM;
	}
	grp->reg = g;
	snprintf(grp->key, sizeof(grp->key), "%s", j->gm.key);
	grp->uid = uid;
	grp->size = j->gm.size;
	grp->shape = j->shape;
	grp->params = j->params;
	grp->layers = j->layers;
	grp->paged = j->paged;
	grp->k_dtype = member_dtype(j, false);
	grp->v_dtype = member_dtype(j, true);
	grp->pressure_level = j->pressure_level;
	grp->deadline_ns = now_ns + (uint64_t)j->gm.timeout_ms * 1000000ull;
	grp->next = g->open;
	g->open = grp;
	g->st.pending++;
	*ret = grp;
	return 0;
}

static int join_locked(struct snapkvd_groups *g, struct snapkvd_job *j, uint32_t uid,
		       unsigned max_tenant_groups, uint64_t now_ns, char *err, size_t errlen)
{
	struct snapkvd_group *grp = find_open(g, uid, j->gm.key);
	int r;

	if (!grp) {
		if (tenant_open(g, uid) >= max_tenant_groups) {
			snprintf(err, errlen,
				 "decision group '%s': this tenant already has %u undecided groups "
				 "(max_tenant_groups)",
				 j->gm.key, max_tenant_groups);
			return -EUSERS;
		}
		r = group_create(g, j, uid, now_ns, &grp);
		if (r < 0)
			return snprintf(err, errlen, "out of memory for a decision group"), r;
	} else if (grp->size != j->gm.size) {
		snprintf(err, errlen,
			 "decision group '%s': group_size %u differs from the group's %u",
			 j->gm.key, j->gm.size, grp->size);
		return -EINVAL;
	} else if (grp->joined >= grp->size) {
		snprintf(err, errlen, "decision group '%s' already has its %u members", j->gm.key,
			 grp->size);
		return -EEXIST;
	} else {
		char why[200];

		r = same_member(grp, j, why, sizeof(why));
		if (r < 0)
			return snprintf(err, errlen, "decision group '%s': %s", j->gm.key, why), r;
	}
	grp->joined++;
	grp->refs++;
	j->gm.group = grp;
	return 0;
}

int snapkvd_groups_join(struct snapkvd_groups *g, struct snapkvd_job *j, uint32_t uid,
			unsigned max_tenant_groups, uint64_t now_ns, char *err, size_t errlen)
{
	int r;

	pthread_mutex_lock(&g->mu);
	r = join_locked(g, j, uid, max_tenant_groups, now_ns, err, errlen);
	pthread_mutex_unlock(&g->mu);
	return r;
}

/* ------------------------------------------------ decide, fail, release */

static void unlist(struct snapkvd_groups *g, struct snapkvd_group *grp)
{
	for (struct snapkvd_group **pp = &g->open; *pp; pp = &(*pp)->next)
		if (*pp == grp) {
			*pp = grp->next;
			grp->next = NULL;
			g->st.pending--;
			return;
		}
}

/* The parked jobs as a list, the group emptied. */
static struct snapkvd_job *release(struct snapkvd_groups *g, struct snapkvd_group *grp)
{
	struct snapkvd_job *list = NULL;

	for (unsigned i = grp->arrived; i-- > 0;) {
		grp->parked[i]->next = list;
		list = grp->parked[i];
		grp->parked[i] = NULL;
	}
	g->st.parked -= grp->arrived;
	grp->arrived = 0;
	return list;
}

static void fail_job(struct snapkvd_job *j, const struct snapkvd_group *grp)
{
	if (j->status < 0)
		return; /* its own failure says more */
	j->status = grp->fail_status;
	snprintf(j->err, sizeof(j->err), "%s", grp->fail_msg);
}

/* Every member fails: the parked ones now, the others when they arrive. */
static struct snapkvd_job *fail_group(struct snapkvd_groups *g, struct snapkvd_group *grp,
				      int status, bool timeout)
{
	grp->state = GROUP_FAILED;
	grp->fail_status = status;
	unlist(g, grp);
	if (timeout)
		g->st.timeouts++;
	else
		g->st.failed++;
	for (unsigned i = 0; i < grp->arrived; i++)
		fail_job(grp->parked[i], grp);
	return release(g, grp);
}

/* A member's own C* (mass: its smallest ladder C meeting tau; uniform: C;
 * layers: 0). */
static uint32_t member_c_star(const struct snapkvd_job *j)
{
	return j->gm.gpu_step ? j->gm.own_c_star : skv_pending_c_star(j->gm.pending);
}

/*
 * Whether a member's smallest retained mass at the group's C* is below
 * tau_f. A CUDA member knows it at its own C* only: there when C* is its own;
 * above its own C* (mass mode; its own C* is then below C_max, so it met
 * tau there) the curves are non-decreasing, so its mass there is >= tau >=
 * tau_f (snapkvd-params.c refuses tau_f > tau for such groups): not below.
 */
static bool member_below(const struct snapkvd_job *j, uint32_t c, float tau_f)
{
	if (!j->gm.gpu_step)
		return skv_pending_min_mass(j->gm.pending, c) < tau_f;
	return c == j->gm.own_c_star && j->gm.own_min_mass < tau_f;
}

/* C* and the fallback for every member, all parked. */
static struct snapkvd_job *decide(struct snapkvd_groups *g, struct snapkvd_group *grp,
				  uint64_t now_ns)
{
	const float tau_f = grp->params.fallback_below;
	uint32_t c = 0;
	bool fall = false;

	for (unsigned i = 0; i < grp->arrived; i++) {
		uint32_t own = member_c_star(grp->parked[i]);
		c = own > c ? own : c;
	}
	for (unsigned i = 0; tau_f > 0.0f && !fall && i < grp->arrived; i++)
		fall = member_below(grp->parked[i], c, tau_f);
	uint64_t waited = now_ns - grp->first_arrival_ns;
	for (unsigned i = 0; i < grp->arrived; i++) {
		struct snapkvd_job *j = grp->parked[i];

		j->gm.decided = true;
		j->gm.c_star = c;
		j->gm.fallback = fall;
		j->gm.wait_ns = waited;
	}
	grp->state = GROUP_DECIDED;
	unlist(g, grp);
	g->st.decided++;
	g->st.fallbacks += fall;
	snapkvd_histogram_observe(&g->st.wait, (double)waited / 1e9);
	return release(g, grp);
}

/* Whether a parked member's session has ended or the engine cancelled it:
 * the job's flags, read as data (the group calls nothing of the job's; see
 * snapkvd-job.h) */
static bool session_ended(const struct snapkvd_job *j)
{
	return __atomic_load_n(&j->cancel_req, __ATOMIC_ACQUIRE) ||
	       (j->cancel && __atomic_load_n(j->cancel, __ATOMIC_ACQUIRE));
}

/* Whether a parked member has ended (its reason then in fail_msg): the
 * arrival and the sweep ask the same. */
static bool member_ended(struct snapkvd_group *grp)
{
	for (unsigned i = 0; i < grp->arrived; i++)
		if (session_ended(grp->parked[i])) {
			snprintf(
			    grp->fail_msg, sizeof(grp->fail_msg),
			    "decision group '%s': a member's session ended or it was cancelled; "
			    "nothing kept",
			    grp->key);
			return true;
		}
	return false;
}

static struct snapkvd_job *arrive_locked(struct snapkvd_groups *g, struct snapkvd_job *j,
					 uint64_t now_ns)
{
	struct snapkvd_group *grp = j->gm.group;

	j->next = NULL;
	if (grp->state == GROUP_FAILED) {
		fail_job(j, grp);
		return j;
	}
	if (j->status < 0 || (!j->gm.pending && !j->gm.gpu_step)) {
		snprintf(grp->fail_msg, sizeof(grp->fail_msg),
			 "decision group '%s': another member failed (%.100s); nothing kept",
			 grp->key, j->status < 0 ? j->err : "no pending compaction");
		if (j->status == 0) {
			j->status = -EIO;
			snprintf(j->err, sizeof(j->err), "%s", grp->fail_msg);
		}
		struct snapkvd_job *list = fail_group(g, grp, -ECANCELED, false);
		j->next = list;
		return j;
	}
	if (grp->arrived == 0)
		grp->first_arrival_ns = now_ns;
	grp->parked[grp->arrived++] = j;
	g->st.parked++;
	/* a member whose session ended fails the group now, not at the next
	 * sweep: a group is never decided with a dead member */
	if (member_ended(grp))
		return fail_group(g, grp, -ECANCELED, false);
	if (grp->arrived < grp->size)
		return NULL;
	return decide(g, grp, now_ns);
}

struct snapkvd_job *snapkvd_groups_arrive(struct snapkvd_groups *g, struct snapkvd_job *j,
					  uint64_t now_ns)
{
	struct snapkvd_job *list;

	pthread_mutex_lock(&g->mu);
	list = arrive_locked(g, j, now_ns);
	pthread_mutex_unlock(&g->mu);
	return list;
}

/* Why grp fails now (0: it does not). */
static int sweep_reason(struct snapkvd_group *grp, uint64_t now_ns, bool all)
{
	if (all) {
		snprintf(grp->fail_msg, sizeof(grp->fail_msg),
			 "decision group '%s': the daemon is shutting down; nothing kept",
			 grp->key);
		return -ESHUTDOWN;
	}
	if (member_ended(grp))
		return -ECANCELED;
	if (now_ns >= grp->deadline_ns) {
		snprintf(grp->fail_msg, sizeof(grp->fail_msg),
			 "decision group '%s': %u of %u members arrived before its timeout "
			 "(group_timeout_ms); nothing kept",
			 grp->key, grp->arrived, grp->size);
		return -ETIMEDOUT;
	}
	return 0;
}

struct snapkvd_job *snapkvd_groups_sweep(struct snapkvd_groups *g, uint64_t now_ns, bool all)
{
	struct snapkvd_job *out = NULL, **tail = &out;

	pthread_mutex_lock(&g->mu);
	for (struct snapkvd_group *grp = g->open, *n; grp; grp = n) {
		int why;

		n = grp->next;
		why = sweep_reason(grp, now_ns, all);
		if (!why)
			continue;
		*tail = fail_group(g, grp, why, why == -ETIMEDOUT);
		while (*tail)
			tail = &(*tail)->next;
		if (!grp->refs) /* nobody joined past creation */
			group_free(grp);
	}
	pthread_mutex_unlock(&g->mu);
	return out;
}

void snapkvd_group_put(struct snapkvd_group *grp)
{
	struct snapkvd_groups *g;
	bool gone;

	if (!grp)
		return;
	g = grp->reg;
	pthread_mutex_lock(&g->mu);
	/* an OPEN group whose last reference goes (a member freed before it
	 * arrived: never, as every run arrives) stays listed until swept */
	gone = --grp->refs == 0 && grp->state != GROUP_OPEN;
	pthread_mutex_unlock(&g->mu);
	if (gone)
		group_free(grp);
}

void snapkvd_group_member_clear(struct snapkvd_group_member *m)
{
	skv_pending_free(m->pending);
	m->pending = NULL;
	snapkvd_group_put(m->group);
	m->group = NULL;
}

void snapkvd_groups_stats(struct snapkvd_groups *g, struct snapkvd_group_stats *ret)
{
	pthread_mutex_lock(&g->mu);
	*ret = g->st;
	pthread_mutex_unlock(&g->mu);
}

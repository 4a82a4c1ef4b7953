// SPDX-License-Identifier: MIT
/* snapkvd-job.c - see snapkvd-job.h. */
#include "snapkvd-job.h"

#include <stdlib.h>

#include "snapkvd-buffer.h"
#include "snapkvd-clock.h"
#include "snapkvd-group.h"
#include "snapkvd-kvpool.h"

struct snapkvd_job *snapkvd_job_new(enum snapkvd_job_kind kind, struct snapkvd_session *s,
				    const struct snapkvd_origin *o)
{
	struct snapkvd_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->kind = kind;
	j->s = s;
	j->origin = *o;
	j->t_start = snapkvd_now_ns();
	return j;
}

void snapkvd_job_free(struct snapkvd_job *j)
{
	if (!j)
		return;
	for (unsigned i = 0; i < j->n_bufs; i++)
		snapkvd_buffer_unref(j->bufs[i]);
	free(j->bufs);
	for (unsigned i = 0; i < 2; i++)
		if (j->kvpool[i])
			j->kvpool[i]->busy--;
	free(j->in);
	free(j->out);
	free(j->block_table);
	free(j->out_table);
	free(j->wb_table);
	free(j->wb_pools);
	free(j->wb_base);
	free(j->wb_k_off);
	free(j->wb_v_off);
	snapkvd_cache_free(j->cache);
	snapkvd_group_member_clear(&j->gm);
	free(j->g.old_k);
	free(j->g.old_v);
	free(j->g.old_pos);
	free(j);
}

void snapkvd_job_hold(struct snapkvd_job *j, struct snapkvd_buffer *b)
{
	for (unsigned i = 0; i < j->n_bufs; i++)
		if (j->bufs[i] == b)
			return;
	j->bufs[j->n_bufs++] = b;
	b->refs++;
}

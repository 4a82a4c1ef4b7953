/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-admission.h - the one place a validated job is admitted: the
 * pressure policy brought up to date, its admission rule, the tenant's and
 * the pool's bytes reserved, the region placed in the session's arena.
 * Runs only after snapkvd-request.c has accepted the request.
 */
#ifndef SNAPKVD_ADMISSION_H
#define SNAPKVD_ADMISSION_H

#include <stddef.h>

#include "snapkvd-forward.h"

/* A COMPACT job: 0 (bytes reserved in j->resv, region placed, outputs
 * pointed at it), or -errno with the reason in err and nothing held. */
int snapkvd_admission_compact(struct snapkvd_server *srv, struct snapkvd_session *s,
			      struct snapkvd_job *j, char *err, size_t errlen);
/* A GROW job (j->g sized): its new region reserved and placed at j->g.off. */
int snapkvd_admission_grow(struct snapkvd_server *srv, struct snapkvd_session *s,
			   struct snapkvd_job *j, char *err, size_t errlen);

#endif

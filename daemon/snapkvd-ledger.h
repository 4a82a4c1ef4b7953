/* SPDX-License-Identifier: MIT */
/* snapkvd-ledger.h - the capacity ledger of one cache, per SPEC.md. */
#ifndef SNAPKVD_LEDGER_H
#define SNAPKVD_LEDGER_H

#include "snapkvd-server.h"

/* Sum of the ledgers of every cache of the server. */
struct snapkvd_ledger_total {
	uint64_t native_full, compact, index, reserved;
	uint64_t caches;
};

void snapkvd_ledger_totals(struct snapkvd_server *srv, struct snapkvd_ledger_total *ret);

#endif

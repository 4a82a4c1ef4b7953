/* SPDX-License-Identifier: MIT */
/*
 * skv-ledger-json.h - the JSON form of the capacity ledger, built from the
 * admin LEDGER reply. One builder for `snapkvctl ledger --json` and the
 * snapshot snapkvd hands its pressure hooks (SNAPKV_LEDGER_JSON), so both
 * always carry the same schema.
 */
#ifndef SKV_LEDGER_JSON_H
#define SKV_LEDGER_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "proto/snapkv.pb-c.h"

/* "group" or "expand" */
const char *skv_ledger_gqa_name(int gqa);

/* compact / native-full of b; -1 when there is nothing to compare with */
double skv_ledger_ratio(const Snapkv__V1__LedgerBytes *b);

/*
 * {"pool": {...}, "tenants": [...], "caches": [...]} of a LEDGER reply
 * (docs/operations.md documents the keys); a new reference, NULL when out
 * of memory.
 */
json_t *skv_ledger_json(const Snapkv__V1__AdminReply *r);

/*
 * A cache's budget keys onto e: budget_mode (a cache from before the modes
 * reads "uniform"), layer_kept, layer_mass_min, layer_mass_mean (null: no
 * observation rows), and for a budget mode c_star, fallback, ragged,
 * kept_min, kept_mean.
 */
void skv_ledger_budget_json(json_t *e, const Snapkv__V1__CacheLedger *c);

/* "uniform", "layers", "heads", "mass", "mass-heads" of a wire BudgetMode
 * (UNSPECIFIED: "uniform"); "unknown" otherwise. */
const char *skv_ledger_budget_name(int mode);

#endif

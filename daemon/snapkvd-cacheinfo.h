// SPDX-License-Identifier: MIT
/*
 * snapkvd-cacheinfo.h - the CacheInfo of a cache (COMPACT, GROW, APPEND
 * replies), owning nothing: its arrays point into the cache, so the message
 * lives no longer than the cache does unchanged.
 */
#ifndef SNAPKVD_CACHEINFO_H
#define SNAPKVD_CACHEINFO_H

#include <stddef.h>

#include "proto/snapkv.pb-c.h"

struct snapkvd_cache;

/* ci (initialised) describes cache c: shape, offsets, ledger figures, the
 * paged block format and the budget mode's outcome where they apply. */
void snapkvd_cacheinfo_fill(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci);

/* An upper bound of the packed Response carrying c's CacheInfo: its arrays
 * as they are, every varint a later placement may widen at its widest. */
size_t snapkvd_cacheinfo_reply_bound(const struct snapkvd_cache *c);

#endif

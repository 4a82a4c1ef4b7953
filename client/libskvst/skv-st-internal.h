/* SPDX-License-Identifier: MIT */
/*
 * skv-st-internal.h - shared by the files of libskvst (skv-safetensors.c,
 * skv-st-compact.c); not part of its interface.
 */
#ifndef SKV_ST_INTERNAL_H
#define SKV_ST_INTERNAL_H

#include "skv-safetensors.h"

/* Format the message into err (when given) and return r. */
int skv_st__fail(struct skv_st_error *err, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* SKV_ST_INTERNAL_H */

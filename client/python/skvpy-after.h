/* SPDX-License-Identifier: MIT */
/*
 * skvpy-after.h - compact()/submit()'s after=: the prefill the compaction
 * must wait for, mapped onto the description's prefill wait (snapkv.h's
 * SKV_WAIT_CUDA_IPC_EVENT, SKV_WAIT_CUDA_FLAG):
 *   after=event                  a torch.cuda.Event(interprocess=True) (any
 *                                object whose ipc_handle() gives the 64
 *                                bytes of a cudaIpcEventHandle_t), recorded
 *                                after the prefill
 *   after=handle                 those 64 bytes themselves
 *   after=(tensor, offset, value) a u32 flag at byte `offset` of a CUDA
 *                                tensor registered with the client: the
 *                                daemon's stream waits until it is >= value
 * each optionally with a last element timeout_ms ((event, ms),
 * (tensor, offset, value, ms); 0: the daemon's prefill_wait_max_ms).
 */
#ifndef SKVPY_AFTER_H
#define SKVPY_AFTER_H

#include <Python.h>

struct skvpy_client;
struct skv_compact_desc;

/* after (NULL or None: no wait) into d's wait fields; -1 with TypeError or
 * ValueError naming after= and what it takes. */
int skvpy_after_parse(struct skvpy_client *cl, PyObject *after, struct skv_compact_desc *d);

#endif

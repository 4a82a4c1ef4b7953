/* SPDX-License-Identifier: MIT */
/*
 * skvpy-mapping.h - snapkv.Mapping: memory the module maps itself and that
 * tensors and arrays point into (through the buffer protocol, which
 * torch.frombuffer and numpy.frombuffer take; they keep the object, so the
 * mapping lives as long as any tensor over it).
 *
 * Two kinds:
 * - a buffer: a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW) of its own,
 *   mapped read-write, created by Client.empty(); any client can register
 *   its fd with the daemon. Every live buffer is on one list, so that a
 *   tensor's address finds the buffer it lies in.
 * - an arena alias: a second mapping of the pages of a session's arena
 *   (mremap with old size 0 on libsnapkv's MAP_SHARED mapping), so that
 *   compact K/V tensors stay valid after the client is closed or the daemon
 *   died (libsnapkv unmaps its own mapping on close; the memfd's pages stay
 *   while any mapping holds them).
 */
#ifndef SKVPY_MAPPING_H
#define SKVPY_MAPPING_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

struct skvpy_mapping {
	PyObject_HEAD void *data;
	size_t size; /* bytes mapped */
	int fd;	     /* buffers: the memfd; aliases: -1 */
	Py_ssize_t exports;
	struct skvpy_mapping *next, *prev; /* buffers only: the module's list */
};

extern PyTypeObject skvpy_mapping_type;

/* Limit on one buffer from Client.empty(): 1 TiB. */
#define SKVPY_MAX_BUFFER_BYTES (1ull << 40)

/* A new buffer of size bytes (rounded up to pages). NULL with an exception set. */
struct skvpy_mapping *skvpy_mapping_memfd(size_t size);
/*
 * Alias the whole mapping that contains p (found in /proc/self/maps):
 * *ret_base is that mapping's start, the alias has the same size.
 */
struct skvpy_mapping *skvpy_mapping_alias(const void *p, uintptr_t *ret_base);
/* The buffer holding [lo, hi), or NULL (no exception). */
struct skvpy_mapping *skvpy_mapping_find(uintptr_t lo, uintptr_t hi);
/* Map the buffer's own memfd again over [offset, offset + len), MAP_FIXED. 0 or -errno. */
int skvpy_mapping_restore(struct skvpy_mapping *m, size_t offset, size_t len);

int skvpy_mapping_init(PyObject *module);

#endif

// SPDX-License-Identifier: MIT
#include "skvpy-mapping.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "skvpy-error.h"

static struct skvpy_mapping *buffers; /* every live memfd buffer (under the GIL) */

static struct skvpy_mapping *mapping_alloc(void)
{
	struct skvpy_mapping *m = PyObject_New(struct skvpy_mapping, &skvpy_mapping_type);

	if (!m)
		return NULL;
	m->data = NULL;
	m->size = 0;
	m->fd = -1;
	m->exports = 0;
	m->next = m->prev = NULL;
	return m;
}

struct skvpy_mapping *skvpy_mapping_memfd(size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct skvpy_mapping *m;
	int fd, r;

	if (size == 0 || size > SKVPY_MAX_BUFFER_BYTES) {
		PyErr_Format(PyExc_ValueError, "buffer of %zu bytes: 1 .. %llu allowed", size,
			     (unsigned long long)SKVPY_MAX_BUFFER_BYTES);
		return NULL;
	}
	size = (size + page - 1) / page * page;
	fd = memfd_create("snapkv-py", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return skvpy_error(errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		r = errno;
		close(fd);
		return skvpy_error(r, "memfd of %zu bytes: %s", size, strerror(r));
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = errno;
		close(fd);
		return skvpy_error(r, "mmap of %zu bytes: %s", size, strerror(r));
	}
	m = mapping_alloc();
	if (!m) {
		munmap(p, size);
		close(fd);
		return NULL;
	}
	m->data = p;
	m->size = size;
	m->fd = fd;
	m->next = buffers;
	if (buffers)
		buffers->prev = m;
	buffers = m;
	return m;
}

/* The [start, end) of the mapping holding p, from /proc/self/maps. */
static int find_vma(uintptr_t p, uintptr_t *ret_start, uintptr_t *ret_end)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "re");
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		uintmax_t s, e;
		if (sscanf(line, "%jx-%jx", &s, &e) == 2 && p >= s && p < e) {
			*ret_start = (uintptr_t)s;
			*ret_end = (uintptr_t)e;
			r = 0;
			break;
		}
		/* a line longer than the buffer: skip its rest */
		while (!strchr(line, '\n') && fgets(line, sizeof(line), f))
			;
	}
	fclose(f);
	return r;
}

struct skvpy_mapping *skvpy_mapping_alias(const void *p, uintptr_t *ret_base)
{
	uintptr_t s = 0, e = 0;
	struct skvpy_mapping *m;
	int r = find_vma((uintptr_t)p, &s, &e);

	if (r < 0)
		return skvpy_error(r, "the arena mapping was not found in /proc/self/maps");
	void *a = mremap((void *)s, 0, e - s, MREMAP_MAYMOVE);
	if (a == MAP_FAILED)
		return skvpy_error(errno, "aliasing the arena (mremap): %s", strerror(errno));
	m = mapping_alloc();
	if (!m) {
		munmap(a, e - s);
		return NULL;
	}
	m->data = a;
	m->size = e - s;
	*ret_base = s;
	return m;
}

struct skvpy_mapping *skvpy_mapping_find(uintptr_t lo, uintptr_t hi)
{
	for (struct skvpy_mapping *m = buffers; m; m = m->next) {
		uintptr_t b = (uintptr_t)m->data;
		if (lo >= b && hi >= lo && hi <= b + m->size)
			return m;
	}
	return NULL;
}

int skvpy_mapping_restore(struct skvpy_mapping *m, size_t offset, size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	if (m->fd < 0 || offset % page || offset > m->size || len > m->size - offset)
		return -EINVAL;
	len = (len + page - 1) / page * page;
	if (len > m->size - offset)
		return -EINVAL;
	void *p = mmap((char *)m->data + offset, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED, m->fd, (off_t)offset);
	return p == MAP_FAILED ? -errno : 0;
}

static void mapping_dealloc(struct skvpy_mapping *m)
{
	if (m->fd >= 0) {
		if (m->prev)
			m->prev->next = m->next;
		else if (buffers == m)
			buffers = m->next;
		if (m->next)
			m->next->prev = m->prev;
		close(m->fd);
	}
	if (m->data)
		munmap(m->data, m->size);
	PyObject_Free(m);
}

static int mapping_getbuffer(struct skvpy_mapping *m, Py_buffer *view, int flags)
{
	if (PyBuffer_FillInfo(view, (PyObject *)m, m->data, (Py_ssize_t)m->size, 0, flags) < 0)
		return -1;
	m->exports++;
	return 0;
}

static void mapping_releasebuffer(struct skvpy_mapping *m, Py_buffer *view)
{
	(void)view;
	m->exports--;
}

static PyObject *mapping_repr(struct skvpy_mapping *m)
{
	return PyUnicode_FromFormat("<snapkv.Mapping %s of %zu bytes at %p>",
				    m->fd >= 0 ? "memfd buffer" : "arena alias", m->size, m->data);
}

static PyObject *mapping_get_size(struct skvpy_mapping *m, void *closure)
{
	(void)closure;
	return PyLong_FromSize_t(m->size);
}

static PyObject *mapping_get_address(struct skvpy_mapping *m, void *closure)
{
	(void)closure;
	return PyLong_FromVoidPtr(m->data);
}

static PyGetSetDef mapping_getset[] = {
    {"size", (getter)mapping_get_size, NULL, "bytes mapped", NULL},
    {"address", (getter)mapping_get_address, NULL, "address of the first byte", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyBufferProcs mapping_as_buffer = {
    .bf_getbuffer = (getbufferproc)mapping_getbuffer,
    .bf_releasebuffer = (releasebufferproc)mapping_releasebuffer,
};

PyTypeObject skvpy_mapping_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Mapping",
    .tp_basicsize = sizeof(struct skvpy_mapping),
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_repr = (reprfunc)mapping_repr,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory tensors point into: a registered memfd buffer (Client.empty()) or\n"
	      "an alias of a session's arena. Kept alive by every tensor over it.",
    .tp_getset = mapping_getset,
};

int skvpy_mapping_init(PyObject *module)
{
	if (PyType_Ready(&skvpy_mapping_type) < 0)
		return -1;
	Py_INCREF(&skvpy_mapping_type);
	if (PyModule_AddObject(module, "Mapping", (PyObject *)&skvpy_mapping_type) < 0) {
		Py_DECREF(&skvpy_mapping_type);
		return -1;
	}
	return 0;
}

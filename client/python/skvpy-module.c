// SPDX-License-Identifier: MIT
/*
 * skvpy-module.c - the snapkv Python module: snapkvd's engine API
 * (libsnapkv) for Python engines that hold K/V in torch tensors or numpy
 * arrays. See client/python/README.md.
 */
#include <Python.h>

#include "skvpy-cache.h"
#include "skvpy-client.h"
#include "skvpy-error.h"
#include "skvpy-mapping.h"
#include "skvpy-pool.h"
#include "skvpy-request.h"

static struct PyModuleDef snapkv_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "snapkv",
    .m_doc = "snapkvd for Python engines: Client, Cache, Request, Error (over libsnapkv).\n"
	     "\n"
	     "Ownership. A request's inputs, and its writeback destination blocks, belong\n"
	     "to the daemon from submit() until wait() or cancel() has returned: the engine\n"
	     "must not write them or hand them to another sequence before. cancel() stops\n"
	     "the compaction and returns once nothing of it can be written any more (it\n"
	     "says 'unwritten', 'stopped' or 'completed'). A Request dropped before it\n"
	     "finished is cancelled the same way (within the client's timeout; past it,\n"
	     "abandoned: its cache released when its completion arrives). close() (and the\n"
	     "end of a with block) returns only after every write of the session is\n"
	     "fenced: requests still in flight are cancelled and waited for.\n"
	     "A Cache whose paged blocks are mapped over an engine buffer (map_blocks)\n"
	     "is not released by release(), which raises\n"
	     "snapkv.Error(EBUSY) until unmap_blocks() has put the buffer's own pages back:\n"
	     "the daemon reuses the region, and writes into the pool would land in a later\n"
	     "cache. Releases the program did not ask for in words (garbage collection, the\n"
	     "end of a with block, close()) unmap first, then release.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit_snapkv(void)
{
	PyObject *m = PyModule_Create(&snapkv_module);

	if (!m)
		return NULL;
	if (skvpy_error_init(m) < 0 || skvpy_mapping_init(m) < 0 || skvpy_client_init_type(m) < 0 ||
	    skvpy_cache_init_type(m) < 0 || skvpy_request_init_type(m) < 0 ||
	    skvpy_pool_init_type(m) < 0 ||
	    PyModule_AddStringConstant(m, "__version__", SKV_VERSION) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

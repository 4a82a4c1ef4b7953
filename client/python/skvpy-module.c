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
#include "skvpy-request.h"

static struct PyModuleDef snapkv_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "snapkv",
    .m_doc = "snapkvd for Python engines: Client, Cache, Request, Error (over libsnapkv).\n"
	     "\n"
	     "Ownership. A Request dropped before it finished is abandoned: its cache is\n"
	     "released when its completion arrives (libsnapkv sees it on the client's next\n"
	     "call), never kept until close(). A Cache whose paged blocks are mapped over an\n"
	     "engine buffer (map_blocks) is not released by release(), which raises\n"
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
	    PyModule_AddStringConstant(m, "__version__", SKV_VERSION) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

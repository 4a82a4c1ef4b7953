# SPDX-License-Identifier: MIT
# CUDA backend (kernels/cuda/).
#  - libskv-backend.a: the dlopen() loader (skv-backend.h), plain C, built on
#    every machine; the daemon links it for `--backend cuda`.
#  - libskv-cuda.so: the plugin (skv-cuda.h), built when CUDA=1 (nvcc found;
#    CUDA=0 skips it). CUDA runtime linked statically, driver reached at run
#    time: no link-time dependency on libcuda.
# CUDA_ARCHS picks the SASS targets (default 90: H100/H200); PTX of the last
# one is embedded too, so newer GPUs JIT it. `make CUDA_ARCHS="80 90"` adds A100.

LIBSKVBACKEND := $(BUILD)/libskv-backend.a
LIBSKVCUDA    := $(BUILD)/libskv-cuda.so

SKVB_OBJS := $(BUILD)/kernels/cuda/skv-cuda-loader.o
OBJS += $(SKVB_OBJS)
LIBS += $(LIBSKVBACKEND)

$(LIBSKVBACKEND): $(SKVB_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

# The loader's CUnit test runs everywhere: on a machine without a driver it
# proves the clean -ENODEV/-ENOENT failure.
SKVB_TEST := $(BUILD)/kernels/cuda/test-skv-cuda-loader
OBJS += $(SKVB_TEST).o
TESTS += $(SKVB_TEST)
TEST_SCRIPTS += kernels/cuda/test-plugin-deps.sh

$(SKVB_TEST): $(SKVB_TEST).o $(LIBSKVBACKEND)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(CUNIT_LIBS) $(LDFLAGS)

ifeq ($(CUDA),1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_INC   := -I$(CUDA_HOME)/include
CUDA_LIBDIR := $(CUDA_HOME)/lib64
CUDA_ARCHS ?= 90
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	-gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
# The same warning flags as `make cuda-check`, plus PIC for the shared object.
NVCCFLAGS  := -std=c++17 -O2 $(NVCC_GENCODE) -Ikernels -I. -Xcompiler -fPIC,-Wall,-Wextra,-Werror \
	-Werror all-warnings -MMD -MP
# Static cudart and the programs that link it need these from libc.
CUDART_STATIC := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lpthread

SKVCUDA_CU   := score select budget gather skv-cuda-ctx skv-cuda-copy skv-cuda-compact
SKVCUDA_CUO  := $(SKVCUDA_CU:%=$(BUILD)/kernels/cuda/%.cu.o)
SKVCUDA_COBJ := $(BUILD)/kernels/cuda/skv-cuda-dev.o
OBJS += $(SKVCUDA_COBJ)
-include $(SKVCUDA_CUO:.o=.d)

$(SKVCUDA_COBJ): CFLAGS_BASE += $(CUDA_INC)

$(BUILD)/kernels/cuda/%.cu.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

LIBS += $(LIBSKVCUDA)
INSTALL_LIBS += $(LIBSKVCUDA)
# skv-backend.h is the daemon's internal view of the plugin: not installed.
INSTALL_HEADERS += kernels/cuda/skv-cuda.h

$(LIBSKVCUDA): $(SKVCUDA_CUO) $(SKVCUDA_COBJ) $(LIBSKV) kernels/cuda/skv-cuda.map
	$(NVCC) -shared -cudart static $(NVCC_GENCODE) -o $@ $(SKVCUDA_CUO) $(SKVCUDA_COBJ) \
		$(LIBSKV) -Xlinker --version-script=kernels/cuda/skv-cuda.map -Xlinker -z,defs \
		-Xlinker -soname,libskv-cuda.so \
		-Xlinker -Bsymbolic -ldl -lrt -lpthread
endif

# gpuq — build, test and GPU check.
#
#   make            build/gpuqd, build/gpuq, build/libgpuq.a (+ include/), the tests
#   make test       the whole suite (GPU tests report themselves skipped without a GPU)
#   make gpu-check  on a GPU machine: runs what is already in build/, never rebuilds
#   make demo       builds, starts a private daemon, runs the main jobs, stops it
#   make fuzz       libFuzzer target for the frame -> msgpack -> request decoder; run it as
#                   build/fuzz-decode NEWDIR tests/fuzz/corpus (new inputs go to NEWDIR)
#   make asan tsan  sanitizer builds (in build-asan/, build-tsan/) running the tests
#
# libuv and msgpack-c are linked statically and cudart statically, NCCL
# dynamically, so one build runs here and on a GPU server that has neither
# library installed (see docs/ARCHITECTURE.md, "Build").

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
# NCCL: $(NCCL_HOME) if set, else CUDA's own lib dir, else the distribution's.
NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
NCCL_LIBDIR ?= $(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so* $(NCCL_HOME)/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so*))
LIBDIR_STATIC ?= $(shell pkg-config --variable=libdir libuv 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)

BUILD ?= build
CC ?= gcc
SAN ?=
OPT ?= -O2
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS ?= $(OPT) -g
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(SAN) -pthread -I. -I$(CUDA_HOME)/include -MMD -MP
# sm_80 and sm_90 machine code, plus PTX that newer GPUs compile at load.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -Wall,-Wextra,-Werror -MMD -MP
STATIC_LIBS := $(LIBDIR_STATIC)/libuv_a.a $(LIBDIR_STATIC)/libmsgpackc.a
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
# NCCL link flags
# NCCL is linked dynamically (libnccl.so.2), with an rpath to the directory
# found here so that the binaries run on this machine; where that directory
# does not exist the loader finds libnccl.so.2 through ldconfig (the GPU
# machine's /usr/lib/x86_64-linux-gnu). NCCL_LIBDIR may name the library or
# its directory.
NCCL_LIB_DIR := $(patsubst %/,%,$(if $(findstring libnccl.so,$(notdir $(NCCL_LIBDIR))),$(dir $(NCCL_LIBDIR)),$(NCCL_LIBDIR)))
NCCL_CFLAGS := $(addprefix -I,$(addsuffix /include,$(filter-out /usr $(CUDA_HOME),$(NCCL_HOME))))
NCCL_LIBS := $(if $(NCCL_LIB_DIR),-L$(NCCL_LIB_DIR) -Xlinker -rpath -Xlinker $(NCCL_LIB_DIR)) -lnccl
LDLIBS := $(STATIC_LIBS) $(CUDA_LIBS) -lstdc++ -lm -pthread
LDLIBS += $(NCCL_LIBS)
ALL_CFLAGS += $(NCCL_CFLAGS)

PROTOCOL_SRC := $(sort $(wildcard protocol/*.c))
DAEMON_SRC := $(filter-out daemon/main.c,$(sort $(wildcard daemon/*.c)))
WORKERS_SRC := $(sort $(wildcard workers/*.c workers/*/*.c))
WORKERS_SRC := $(filter-out workers/faults/%,$(WORKERS_SRC))
KERNELS_SRC := $(sort $(wildcard kernels/*.cu))
LIBGPUQ_SRC := client/lib/libgpuq.c client/lib/libgpuq_collective.c client/lib/libgpuq_share.c \
	client/lib/libgpuq_revocable.c client/lib/libgpuq_cuda.c
CLI_SRC := $(sort $(wildcard client/cli/*.c client/bench/*.c))
UNIT_SRC := $(sort $(wildcard tests/unit/*.c))
ITEST_SRC := $(sort $(wildcard tests/integration/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(filter %.c,$(1))) $(patsubst %.cu,$(BUILD)/obj/%.o,$(filter %.cu,$(1)))

PROTOCOL_OBJ := $(call obj,$(PROTOCOL_SRC))
CORE_OBJ := $(call obj,$(DAEMON_SRC) $(WORKERS_SRC) $(KERNELS_SRC)) $(PROTOCOL_OBJ)
LIBGPUQ_OBJ := $(call obj,$(LIBGPUQ_SRC)) $(PROTOCOL_OBJ)

BINARIES := $(BUILD)/gpuqd $(BUILD)/gpuq $(BUILD)/libgpuq.a $(BUILD)/include/gpuq.h \
            $(BUILD)/tests/unit $(BUILD)/tests/itest $(BUILD)/tests/kernels_selftest \
            $(BUILD)/tests/copy_selftest $(BUILD)/tests/attach_selftest

.PHONY: all test gpu-check demo fuzz asan tsan clean deps
all: $(BINARIES)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The texts NVRTC compiles chain kernels with, linked in by the assembler's .incbin.
$(BUILD)/obj/workers/chain/chain_prelude.o: kernels/chain_ops.cuh kernels/chain_abi.h kernels/chain_reduce.h

$(BUILD)/gpuqd: $(BUILD)/obj/daemon/main.o $(CORE_OBJ)
	$(CC) $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/libgpuq.a: $(LIBGPUQ_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The public headers, laid out as an installed program includes them.
$(BUILD)/include/gpuq.h: client/lib/gpuq.h protocol/msg.h protocol/protocol.h
	@mkdir -p $(BUILD)/include/protocol
	cp client/lib/gpuq.h $(BUILD)/include/gpuq.h
	cp protocol/msg.h protocol/protocol.h $(BUILD)/include/protocol/

$(BUILD)/gpuq: $(call obj,$(CLI_SRC)) $(BUILD)/libgpuq.a
	$(CC) $(SAN) -o $@ $^ $(STATIC_LIBS) -lm -ldl -pthread

$(BUILD)/tests/unit: $(call obj,$(UNIT_SRC) tests/harness.c) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/itest: $(call obj,$(ITEST_SRC) tests/harness.c workers/backend/host_patterns.c daemon/state_record.c) $(BUILD)/libgpuq.a
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(STATIC_LIBS) -lm -ldl -pthread

# Kernels against their host definitions, on the GPU (run by gpu-check), and the
# chain kernels compiled with NVRTC as gpuqd compiles and loads them.
SELFTEST_C_SRC := workers/chain/chain_codegen.c workers/chain/chain_prelude.c workers/chain/chain_nvrtc.c \
	workers/chain/chain_module.c workers/chain/chain_prog.c workers/chain/chain_eval.c workers/chain/chain_expr.c \
	workers/log.c \
	protocol/protocol.c
$(BUILD)/tests/kernels_selftest: $(BUILD)/obj/tests/gpu/kernels_selftest.o $(call obj,$(KERNELS_SRC)) \
		$(call obj,$(SELFTEST_C_SRC))
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(CUDA_LIBS) -lstdc++ -lm -pthread

# Client processes attaching a gpuq buffer and running their own kernel on it (gpu-check).
$(BUILD)/tests/attach_selftest: $(BUILD)/obj/tests/gpu/attach_selftest.o \
		$(BUILD)/obj/tests/gpu/attach_kernel.o $(BUILD)/obj/workers/backend/host_patterns.o $(BUILD)/libgpuq.a
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(STATIC_LIBS) $(CUDA_LIBS) -lstdc++ -lm -pthread

# The SM copy kernel, every alignment pair and length, on the GPU (run by gpu-check).
$(BUILD)/tests/copy_selftest: $(BUILD)/obj/tests/gpu/copy_selftest.o $(call obj,$(KERNELS_SRC))
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) -o $@ $^

# The host half of a get alone (store functions, populating, chunking,
# threads), for the GPU machine: build/tests/host_write_bench (see its header).
all: $(BUILD)/tests/host_write_bench
$(BUILD)/tests/host_write_bench: $(call obj,tests/bench/host_write_bench.c workers/transfer/copy_store.c \
		workers/transfer/copy_guard.c client/bench/bench_time.c)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(CUDA_LIBS) -lstdc++ -lm -pthread

# Installs the build dependencies where they are missing (Debian/Ubuntu).
deps:
	@sh tests/install-deps.sh

test: deps all
	@sh tests/run.sh $(BUILD)

# Runs on the GPU machine from a carried build/: no compilation here.
gpu-check:
	@GPUQ_REQUIRE_GPU=1 sh tests/gpu-check.sh $(BUILD)

demo: deps all
	@sh tests/demo.sh $(BUILD)

fuzz: $(BUILD)/fuzz-decode
$(BUILD)/fuzz-decode: tests/fuzz/fuzz_decode.c $(PROTOCOL_SRC)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -I. $^ \
		$(LIBDIR_STATIC)/libmsgpackc.a -o $@

asan:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" OPT=-O1 test

tsan:
	$(MAKE) BUILD=build-tsan SAN="-fsanitize=thread" OPT=-O1 test

clean:
	rm -rf build build-asan build-tsan

# The service: systemd units, configuration, install ---------------------------
# gpuqd reads its configuration with inih, linked statically like libuv and
# msgpack-c (Debian's libinih-dev ships libinih.a).
LDLIBS += $(LIBDIR_STATIC)/libinih.a

# make install / uninstall: PREFIX (default /usr/local) and DESTDIR. The
# configuration stays under /etc/gpuq whatever PREFIX is, where gpuqd looks.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
SYSCONFDIR ?= /etc

INSTALLED := $(BINDIR)/gpuq $(SBINDIR)/gpuqd $(LIBDIR)/libgpuq.a \
	$(INCLUDEDIR)/gpuq/gpuq.h $(INCLUDEDIR)/gpuq/protocol/msg.h \
	$(INCLUDEDIR)/gpuq/protocol/protocol.h \
	$(UNITDIR)/gpuqd.service $(UNITDIR)/gpuqd.socket \
	$(SYSUSERSDIR)/gpuq.conf $(TMPFILESDIR)/gpuq.conf \
	$(MANDIR)/man8/gpuqd.8 $(MANDIR)/man1/gpuq.1 \
	$(SYSCONFDIR)/gpuq/gpuqd.conf.example

# The service tests' stand-in for the service manager (tests/service.sh).
all: $(BUILD)/tests/svc-helper
$(BUILD)/tests/svc-helper: tests/service/svc_helper.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -MMD -MP,$(ALL_CFLAGS)) -o $@ $<

.PHONY: install uninstall
install: $(BUILD)/gpuqd $(BUILD)/gpuq $(BUILD)/libgpuq.a
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR) \
		$(DESTDIR)$(INCLUDEDIR)/gpuq/protocol $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(SYSCONFDIR)/gpuq
	install -m 0755 $(BUILD)/gpuq $(DESTDIR)$(BINDIR)/gpuq
	install -m 0755 $(BUILD)/gpuqd $(DESTDIR)$(SBINDIR)/gpuqd
	install -m 0644 $(BUILD)/libgpuq.a $(DESTDIR)$(LIBDIR)/libgpuq.a
	install -m 0644 client/lib/gpuq.h $(DESTDIR)$(INCLUDEDIR)/gpuq/gpuq.h
	install -m 0644 protocol/msg.h protocol/protocol.h $(DESTDIR)$(INCLUDEDIR)/gpuq/protocol/
	sed 's|/usr/local/sbin/gpuqd|$(SBINDIR)/gpuqd|' systemd/gpuqd.service \
		> $(DESTDIR)$(UNITDIR)/gpuqd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/gpuqd.service
	install -m 0644 systemd/gpuqd.socket $(DESTDIR)$(UNITDIR)/gpuqd.socket
	install -m 0644 systemd/gpuq.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/gpuq.conf
	install -m 0644 systemd/gpuq.tmpfiles.conf $(DESTDIR)$(TMPFILESDIR)/gpuq.conf
	install -m 0644 docs/gpuqd.8 $(DESTDIR)$(MANDIR)/man8/gpuqd.8
	install -m 0644 docs/gpuq.1 $(DESTDIR)$(MANDIR)/man1/gpuq.1
	install -m 0644 etc/gpuqd.conf.example $(DESTDIR)$(SYSCONFDIR)/gpuq/gpuqd.conf.example

# Removes what install put there; never /etc/gpuq/gpuqd.conf, which is the operator's.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	rmdir $(DESTDIR)$(INCLUDEDIR)/gpuq/protocol $(DESTDIR)$(INCLUDEDIR)/gpuq \
		$(DESTDIR)$(SYSCONFDIR)/gpuq 2>/dev/null || true

# Collectives: the fault-injection test build of gpuqd --------------------------
# tests/gpuqd-faults: gpuqd with fault injection (GPUQ_FAULT_INJECTION: a
# collective request may ask one rank to hang), for the tests only. The same
# objects as gpuqd, but collective.c, op_collective_read.c, request.c and
# work_kinds.c compiled again with the flag into obj/faults/, and the fault
# injection's own files added; the production gpuqd has none of it.
FAULT_SRC := workers/collective/collective.c daemon/op_collective_read.c daemon/request.c workers/work_kinds.c
# Only in gpuqd-faults: a job that makes a device fault (inject_fault), for the
# device-reset tests (workers/backend/device_reset.c).
FAULT_ONLY_SRC := daemon/faults/op_fault.c workers/faults/fault_inject.c kernels/faults/fault.cu
FAULT_OBJ := $(patsubst %.c,$(BUILD)/obj/faults/%.o,$(FAULT_SRC)) \
	$(patsubst %.c,$(BUILD)/obj/faults/%.o,$(filter %.c,$(FAULT_ONLY_SRC))) \
	$(patsubst %.cu,$(BUILD)/obj/%.o,$(filter %.cu,$(FAULT_ONLY_SRC)))
all: $(BUILD)/tests/gpuqd-faults
$(BUILD)/obj/faults/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DGPUQ_FAULT_INJECTION -c $< -o $@
$(BUILD)/tests/gpuqd-faults: $(BUILD)/obj/daemon/main.o \
		$(filter-out $(call obj,$(FAULT_SRC)),$(CORE_OBJ)) $(FAULT_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -o $@ $^ $(LDLIBS)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

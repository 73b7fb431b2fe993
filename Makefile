# kolo - build, test, install.
#
#   make                 libkolo (.so and .a), kolo-bench, kolorun, the test binary, under build/
#   make test            installs what the tests need, then runs every test (plain, ASan+UBSan, TSan,
#                        clang's static analyzer)
#   make demo            the main job: a multi-worker run on this machine, printing its throughput
#   make install PREFIX=/usr/local
#   make WERROR=1        warnings are errors (CI)
#
# Sanitizer builds live in their own trees: `make O=build/asan SAN=asan`, `make O=build/tsan SAN=tsan`.

O       ?= build
PREFIX  ?= /usr/local
CC      ?= cc
SAN     ?=
WERROR  ?=

WARN := -Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion -Wstrict-prototypes \
        -Wmissing-prototypes -Wpointer-arith -Wundef -Wwrite-strings -Wformat=2 -Wvla
ifeq ($(WERROR),1)
WARN += -Werror
endif

OPT ?= -O2
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -g $(OPT) -fPIC -pthread -Iinclude $(WARN)
LIBCFLAGS   := $(CFLAGS_BASE) -DKOLO_BUILDING -fvisibility=hidden
LDLIBS      := -lcrypto -lpthread -lm -ldl
# PMIx's header (libpmix-dev), for rank 0's address under mpirun across hosts (src/boot/pmix_rdv.c:
# libpmix itself is opened at run time). As system headers: their warnings are not kolo's.
PMIX_CFLAGS := $(patsubst -I%,-isystem %,$(shell pkg-config --cflags pmix 2>/dev/null))

ifeq ($(SAN),asan)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
ifeq ($(SAN),tsan)
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
endif
# libFuzzer's coverage hooks with ASan+UBSan, clang only (make fuzz)
ifeq ($(SAN),fuzz)
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

LIB_SRC   := $(sort $(wildcard src/*/*.c))
LIB_OBJ   := $(patsubst src/%.c,$(O)/obj/%.o,$(LIB_SRC))
TEST_SRC  := $(sort $(wildcard tests/*.c))
TEST_OBJ  := $(patsubst tests/%.c,$(O)/obj/tests/%.o,$(TEST_SRC))
RUN_SRC   := $(sort $(wildcard tools/kolorun/*.c))
RUN_OBJ   := $(patsubst tools/%.c,$(O)/obj/tools/%.o,$(RUN_SRC))
BENCH_SRC := bench/kolo-bench.c

SO   := $(O)/lib/libkolo.so
AR_  := $(O)/lib/libkolo.a
BINS := $(O)/bin/kolo-bench $(O)/bin/engine-bench $(if $(RUN_SRC),$(O)/bin/kolorun) $(O)/bin/kolo-timeline \
        $(O)/bin/kolo-hang
# built with the rest, not installed: what a timeline event costs (docs/timeline.md), what waiting
# for a straggler costs the waiting ranks (bench/README.md)
DEV_BINS := $(O)/bin/timeline-bench $(O)/bin/wait-bench
# the examples in C, built as a user builds them (kolo.h only; tests/test_examples.c runs them)
EXAMPLES := $(O)/examples/train_digits
TESTBIN := $(O)/tests/kolo-tests
# libFuzzer harnesses over what peers and strangers send (tests/fuzz/README.md), built by make fuzz
FUZZ_SRC  := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(O)/fuzz/%,$(FUZZ_SRC))

.PHONY: all lib test test-c test-c-all test-python test-install demo deps install clean check-build bench-compare bench-train test-python-torch2 analyze test-analyze fuzz fuzzers fuzz-regress

all: lib $(BINS) $(DEV_BINS) $(EXAMPLES) $(TESTBIN)
lib: $(SO) $(AR_)

$(O)/obj/boot/pmix_rdv.o: LIBCFLAGS += $(if $(PMIX_CFLAGS),$(PMIX_CFLAGS) -DKOLO_HAVE_PMIX)

$(O)/obj/%.o: src/%.c $(wildcard src/*/*.h) include/kolo.h
	@mkdir -p $(dir $@)
	$(CC) $(LIBCFLAGS) $(SANFLAGS) -c $< -o $@

$(O)/obj/tests/%.o: tests/%.c tests/kt.h include/kolo.h $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -Wno-missing-prototypes -c $< -o $@

$(O)/obj/tools/%.o: tools/%.c include/kolo.h $(wildcard src/*/*.h) $(wildcard tools/kolorun/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -c $< -o $@

$(SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libkolo.so.0 $(SANFLAGS) -o $@ $^ $(LDLIBS)
	@# the soname beside it: a program linked against the build tree (-Lbuild/lib -lkolo) runs from it
	ln -sf libkolo.so $(dir $@)libkolo.so.0

$(AR_): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Tools and tests link the static library: they may use kolo's private (kolo__) symbols.
$(O)/bin/kolo-bench: $(BENCH_SRC) bench/local_job.h bench/perf_ctl.h bench/bench_mem.h $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $< $(AR_) $(LDLIBS)

$(O)/bin/engine-bench: bench/engine-bench.c bench/local_job.h bench/perf_ctl.h $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $< $(AR_) $(LDLIBS)

$(O)/bin/timeline-bench: bench/timeline-bench.c $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $< $(AR_) $(LDLIBS)

$(O)/bin/wait-bench: bench/wait-bench.c bench/local_job.h $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $< $(AR_) $(LDLIBS)

$(O)/examples/%: examples/c/%.c include/kolo.h $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $< $(AR_) $(LDLIBS)

# the timeline's reader: a Python 3 script (standard library only), copied as it is
$(O)/bin/kolo-timeline: tools/timeline/kolo-timeline
	@mkdir -p $(dir $@)
	cp $< $@

# the reader of a stuck job's logs (which rank it waits on): the same
$(O)/bin/kolo-hang: tools/hang/kolo-hang
	@mkdir -p $(dir $@)
	cp $< $@

$(O)/bin/kolorun: $(RUN_OBJ) $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $(RUN_OBJ) $(AR_) $(LDLIBS)

$(TESTBIN): $(TEST_OBJ) $(AR_)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(SANFLAGS) -o $@ $(TEST_OBJ) $(AR_) $(LDLIBS)

# A harness may #include the .c file whose static decoders it feeds: the archive's copy of that
# object is then never pulled in. kolorun's objects but its main() come as an archive too, for
# the harnesses of what a user hands kolorun.
FUZZ_RUN_AR := $(O)/lib/libkolorun.a
$(FUZZ_RUN_AR): $(filter-out %/main.o,$(RUN_OBJ))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/fuzz/%: tests/fuzz/%.c $(wildcard tests/fuzz/*.h) $(LIB_SRC) $(RUN_SRC) $(wildcard src/*/*.h) $(wildcard tools/kolorun/*.h) \
             include/kolo.h $(AR_) $(FUZZ_RUN_AR)
	@mkdir -p $(dir $@)
	$(CC) $(LIBCFLAGS) $(SANFLAGS) -fsanitize=fuzzer -Wno-missing-prototypes -o $@ $< $(FUZZ_RUN_AR) $(AR_) $(LDLIBS)

fuzzers: $(FUZZ_BINS)

# ---- what the README promises ----

# Installs the build and test dependencies from Debian's packages when they are missing.
deps:
	@sh scripts/deps.sh

# Every test: the C suite, the same suite under ASan+UBSan, the threaded parts under TSan,
# then the Python suites under kolorun.
# TSan looks for races between the threads of a process; these tests' processes have no second
# thread TSan would not see elsewhere: kolorun is single-threaded (its tests' workers run the
# kolo_init and engine paths the other tests run; kolorun_elastic_* kept for the rounds, but for
# those that mostly wait out kolorun's timers: a worker given up on, a busy one, one that never joins), the
# reduce kernels are, and launch_*/multihost_* start the same workers under other launchers.
# mapped_store_choice's second half times calls slowed by a hook (30 s under TSan, its largest);
# the mapped allreduce it times runs under TSan in engine_fused_mapped_arena.
# The largest tests of the data plane the synchronous API runs on the caller's thread alone (the
# engine, store and trace threads idle: nothing for TSan to pair) stay out too, 121 s under TSan
# in all: the ring's (ring_fused_matches_unfused, ring_streams_np3), the shared-memory transport's
# (shm_ring_sizes, shm_cma_modes), the mapped and Adasum allreduces (zero_copy_allreduce,
# adasum_matches_the_tree), big_buffers, the random mixes of collectives whose choices flip
# (choices_flip_in_a_random_mix_*, 23 and 30 s) and the 7- and 8-rank conformance jobs; their code runs
# under TSan in the smaller conformance jobs (2 to 6 ranks, CMA, lazy rings, forced ring) and the
# engine's tests. So do the 72-rank jobs of many_ranks_* (22 and 24 s under TSan, their bookkeeping
# the caller's thread's alone; the engine's threads run under TSan at 2 to 6 ranks, across hosts in
# hier_allreduce_allgather_across_hosts). Of the engine's random mixes, those that pair its thread
# with the program's the most (over TCP and shared memory, direct allreduces in between; a tiny
# fusion threshold and cache) run under TSan (13 and 10 s; the first found a race). The kill mix's
# 10 plans (27 s here since its plans hold two process sets), the elastic one (9 s; the
# kolorun_elastic_* tests above stop and start the engine's threads between rounds under TSan
# too), and the autotuned, posed-hosts, join, crowded and other-paths settings (10, 11, 6 and, at
# 8 ranks, more) change what the engine decides or meets, not how its threads do, and run plain
# and under ASan. The way choices that time calls on the real clock against a delay a hook adds
# to one way (direct_choice_*, the pair, crowd, broadcast and reduce-scatter choices, the
# shared-memory transport's on the real clock, streaming stores, the far state's copy cost:
# 118 s under TSan) run on the caller's thread alone too, and under TSan they time an
# instrumented ring against an uninstrumented kernel copy: beside the ASan suite (scripts/
# test-c.sh) one of them saw its delayed way win 9 of 12 calls with a task waiting for a CPU 5.3
# s of its 8. They run plain and under ASan; the made-up clock's choices stay under TSan.
TSAN_TESTS ?= '!kolorun_bind' '!kolorun_command' '!kolorun_config' '!kolorun_exit' '!kolorun_forwards' \
  '!kolorun_help' '!kolorun_horovodrun' '!kolorun_hostfile' '!kolorun_killed' '!kolorun_one_failure' \
  '!kolorun_open' '!kolorun_output' '!kolorun_remote' '!kolorun_removes' '!kolorun_second' '!kolorun_sigterm' \
  '!kolorun_starts' '!kolorun_status' '!kolorun_stdin' '!kolorun_tag' '!kolorun_timeout' '!kolorun_usage' \
  '!kolorun_worker' '!kolorun_local' '!kolorun_elastic_kills' '!kolorun_elastic_waits' '!kolorun_elastic_stops' \
  '!kolorun_elastic_binds' '!kolorun_elastic_usage' '!reduce_' '!launch_' '!multihost_' \
  '!mapped_store_choice' '!ring_fused_matches_unfused' '!ring_streams_np3' '!shm_ring_sizes' '!shm_cma_modes' \
  '!zero_copy_allreduce' '!adasum_matches_the_tree' '!big_buffers' '!conformance_shm_np7' '!conformance_shm_np8' \
  '!many_ranks_' '!choices_flip_in_a_random_mix' '!engine_random_mix_autotuned' '!engine_random_mix_across' \
  '!engine_random_mix_with' '!engine_random_mix_crowded' '!engine_random_mix_other' '!engine_random_mix_a_rank' \
  '!kolorun_elastic_engine_mix' '!shm_auto_follows' '!shm_auto_chooses' '!out_stores_follow' \
  '!shm_far_follows' '!direct_choice_' '!follows_timings' '!follow_timings' '!follow_call_timings' \
  '!follows_call_timings' '!judges_a_way'

# Under ASan+UBSan every test but the multi-host ones: their time goes to starting sshd, Slurm's
# daemons and mpirun in namespaces (45 s of the 205 the suite took under ASan), and the code of
# kolo's they run does run under ASan in kolorun_remote_* (a stand-in ssh), kolorun_elastic_*,
# launch_* and the conformance jobs.
ASAN_TESTS ?= '!multihost_'

# make test: everything built, then the C suites (test-c-all) and the Python suites (test-python)
# at once, in two lanes (scripts/test.sh says why; KOLO_TEST_LANES=1 runs one after the other).
test: deps
	$(MAKE) -j$$(nproc 2>/dev/null || echo 2) all
	MAKE="$(MAKE)" sh scripts/test.sh

# The C suites: plain, under ASan+UBSan and under TSan (built beside the plain suite, run beside
# each other: scripts/test-c.sh says why), then the install test; clang's static analyzer (make
# test-analyze) beside the plain suite.
test-c-all: all
	ASAN_TESTS="$(ASAN_TESTS)" TSAN_TESTS="$(TSAN_TESTS)" MAKE="$(MAKE)" sh scripts/test-c.sh

# make install into a scratch prefix, build an example against it with pkg-config, run it with
# the installed kolorun: what a C user does first.
test-install: lib $(BINS)
	rm -rf $(O)/install-test
	$(MAKE) install PREFIX=$(CURDIR)/$(O)/install-test >/dev/null
	PKG_CONFIG_PATH=$(O)/install-test/lib/pkgconfig $(CC) examples/c/hello_allreduce.c \
	  $$(PKG_CONFIG_PATH=$(O)/install-test/lib/pkgconfig pkg-config --cflags --libs kolo) \
	  -Wl,-rpath,$(CURDIR)/$(O)/install-test/lib -o $(O)/install-test/hello_allreduce
	$(O)/install-test/bin/kolorun -np 3 $(O)/install-test/hello_allreduce | sort > $(O)/install-test/out.txt
	grep -c "mean rank 1.0, mean one 1.0" $(O)/install-test/out.txt | grep -qx 3
	$(CC) -O2 examples/c/train_digits.c \
	  $$(PKG_CONFIG_PATH=$(O)/install-test/lib/pkgconfig pkg-config --cflags --libs kolo) -lm \
	  -Wl,-rpath,$(CURDIR)/$(O)/install-test/lib -o $(O)/install-test/train_digits
	$(O)/install-test/bin/kolorun -np 2 $(O)/install-test/train_digits --epochs 1 --train 2000 --test 500 \
	  > $(O)/install-test/train.txt
	grep -q "parameters identical on all 2 rank(s)" $(O)/install-test/train.txt
	@echo "test-install: 2 passed, 0 failed"

test-c: all
	$(TESTBIN) $(T)

test-python:
	@if [ -d python/tests ]; then sh scripts/test-python.sh; else echo "no python tests yet"; fi

# kolo.tensorflow and kolo.keras: TensorFlow from PyPI in a venv of its own (KOLO_TF_VENV, default
# /var/tmp/kolo-tf-venv; test-python makes it too), and only the TensorFlow suites.
.PHONY: deps-tf test-tensorflow
deps-tf:
	@sh scripts/deps-tf.sh >/dev/null
test-tensorflow: all
	KOLO_TEST_TF=only sh scripts/test-python.sh

# The Python suites under PyTorch 2.x from PyPI instead of Debian's 1.13 (not part of `make test`):
# a virtual environment outside the tree (TORCH2_VENV, default ../venv-torch2) gets TORCH2_SPEC,
# numpy, pytest and cloudpickle (kolo.run's) on first use. PyPI's Linux torch wheel pulls the CUDA libraries: about 5 GB
# downloaded and installed. TORCH2_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# takes the CPU-only wheel instead (a few hundred MB) where that index is reachable.
TORCH2_VENV ?= $(abspath $(CURDIR)/..)/venv-torch2
TORCH2_SPEC ?= torch>=2,<3
TORCH2_PIP_ARGS ?=
test-python-torch2:
	@if ! "$(TORCH2_VENV)/bin/python" -c "import cloudpickle, numpy, pytest, torch" 2>/dev/null; then \
	  echo "test-python-torch2: installing $(TORCH2_SPEC), numpy, pytest and cloudpickle into $(TORCH2_VENV) (GBs from PyPI)"; \
	  { [ -x "$(TORCH2_VENV)/bin/python" ] || /usr/bin/python3 -m venv "$(TORCH2_VENV)"; } && \
	  "$(TORCH2_VENV)/bin/pip" install --quiet $(TORCH2_PIP_ARGS) "$(TORCH2_SPEC)" && \
	  "$(TORCH2_VENV)/bin/pip" install --quiet numpy pytest cloudpickle || exit 1; \
	fi
	KOLO_TEST_PYTHON="$(TORCH2_VENV)/bin/python" sh scripts/test-python.sh

# The main job: a CNN trained on generated digits by 2 workers, then 1 (scripts/demo.sh).
demo: deps
	$(MAKE) all
	sh scripts/demo.sh

# Side-by-side comparison with Open MPI, MPICH, Gloo (torch.distributed) and Horovod.
bench-compare: deps
	$(MAKE) all
	sh bench/compare.sh

# End-to-end training throughput: kolo, Horovod and PyTorch DDP (gloo) on the synthetic benchmark,
# 1 and 2 workers, medians of interleaved repetitions (bench/README.md). Horovod is used when it is
# installed (make bench-compare builds it). Extra arguments: KOLO_TRAIN_ARGS="--reps 5 -- --model resnet20".
bench-train: deps
	$(MAKE) all
	/usr/bin/python3 bench/train_compare.py $(KOLO_TRAIN_ARGS)

check-build: all
	$(O)/bin/kolo-bench --version

# clang's static analyzer over libkolo and kolorun (Debian's clang-tools; 85 s here), its reports
# as HTML under $(O)/analyze/ (scan-view opens them); fails on any report (--status-bugs). Part of
# make test as test-analyze (scripts/test-c.sh, beside the plain C suite), which skips, saying so,
# only where scan-build is not installed (scripts/deps.sh installs it). Its 11 reports of 2026-12,
# each path read and all false, were settled in the code so that a reader sees why too: a sockaddr
# the kernel fills is zeroed first (tcp.c, store.c twice, kolorun's hosts.c); asserted, a group has
# a member (adasum.c), the exchange 3 to 64 members (allreduce.c), the store at most MAX_CONNS
# connections (store.c), a walk stays inside its segments (coll.h, for ring.c's one-segment walk);
# and hosts.c's index says that it has no table before its first host.
analyze:
	rm -rf $(O)/analyze $(O)/scan
	scan-build --status-bugs -o $(O)/analyze $(MAKE) O=$(O)/scan CC=clang -j$$(nproc 2>/dev/null || echo 2) lib \
	  $(O)/scan/bin/kolorun
test-analyze:
	@if command -v scan-build >/dev/null 2>&1; then $(MAKE) analyze; else \
	  echo "test-analyze: SKIPPED: scan-build is not installed (Debian's clang-tools; scripts/deps.sh installs it)"; fi

# The fuzzers (clang's libFuzzer with ASan+UBSan, under build/fuzz/): make fuzz runs each for
# FUZZ_TIME seconds from its seeds (tests/fuzz/corpus/<name>/) and keeps what it learns under
# build/fuzz/corpus/; make fuzz-regress runs each over its committed seeds only, once (seconds).
FUZZ_TIME ?= 60
fuzz:
	$(MAKE) O=build/fuzz SAN=fuzz CC=clang OPT=-O1 -j$$(nproc 2>/dev/null || echo 2) fuzzers
	sh scripts/fuzz.sh build/fuzz $(FUZZ_TIME)
fuzz-regress:
	$(MAKE) O=build/fuzz SAN=fuzz CC=clang OPT=-O1 -j$$(nproc 2>/dev/null || echo 2) fuzzers
	sh scripts/fuzz.sh build/fuzz 0

install: lib $(BINS)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/kolo.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(SO) $(DESTDIR)$(PREFIX)/lib/libkolo.so.0
	ln -sf libkolo.so.0 $(DESTDIR)$(PREFIX)/lib/libkolo.so
	install -m 644 $(AR_) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(shell sed -n 's/^#define KOLO_VERSION_STRING "\(.*\)"/\1/p' include/kolo.h)|' \
	  kolo.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kolo.pc

clean:
	rm -rf build

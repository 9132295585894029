# Warren developer tasks (GNU make).
#
#   make install   create $(VENV) and install what the broker needs: Warren (editable)
#                  with its runtime dependencies and the fast extra (uvloop), pure
#                  Python; about half a minute on a fresh clone (README)
#   make install-test  that, the compiled build's tools (mypy for mypyc, setuptools)
#                  and the test extra: pyspark + pyarrow (~450 MB), Spark Connect's
#                  client (grpcio, pandas, ...) for tests/spark (which also need Java
#                  17+ and skip without it), playwright, celery, ... (~1 GB)
#   make build     compile the hot modules in place with mypyc (1-2 minutes on 2
#                  cores; again after editing their .py); 1.2-1.4x the throughput
#   make run       run the broker (extra flags: make run ARGS='--amqp-port 5673'); the
#                  compiled build when there is one (rebuilt when stale), pure Python
#                  until the first `make build` or `make test`
#   make test      pytest twice at once, with ruff and mypy (make lint) beside: everything
#                  against the compiled modules, and what runs compiled code in the
#                  test's own process again as pure Python (tests/passes.py; its
#                  tests/spark in a pytest of their own: two Spark JVMs)
#                  (extra args: make test PYTEST_ARGS='-k config'; PYTEST_WORKERS=0
#                  for one process per pass; EXAMPLES=1 for property-based tests'
#                  full counts, make test runs half)
#   make test-busy make test with two CPU hogs beside it (Debian's stress-ng, installed
#                  when missing): the suite must pass on a busy machine too
#                  (docs/testing.md); the hogs stop when it ends, however it ends
#   make browser   install Debian's chromium for tests/ui when it is missing
#                  (needs root and apt-get; otherwise tests/ui skip)
#   make etcd      install Debian's etcd-server for tests/cluster when it is missing
#                  (root and apt-get; else they skip)
#   make prometheus install Debian's prometheus for tests/http/test_prometheus_server.py
#                  when it is missing (root and apt-get; else it skips)
#   make cluster   etcd and three clustered Warren nodes, node1-node3, on this machine
#                  (Ctrl-C stops them; tools/cluster.py). Ports from PORT (20000):
#                  etcd PORT, PORT+1; node i AMQP PORT+10*i, HTTP +1, MQTT +2,
#                  Prometheus +3, replication +4, stream reads +5 (a table is printed);
#                  e.g. make cluster PORT=30000
#   make fuse      install Debian's fuse3 (libfuse3) for tests/store/powercut's power-cut file
#                  system when it is missing (root and apt-get; else they skip)
#   make autotools install Debian's autoconf, automake and libtool, which DTLSSocket's
#                  source build needs (pyproject's dtls extra; make install-test does)
#   make rhea      install the Node.js AMQP 1.0 client rhea (pinned) for tests/protocol/amqp1
#                  with npm when node and npm are there (else those tests skip)
#   make mosquitto install Debian's mosquitto for tests/integration/test_perf_mqtt.py and
#                  bench/mqtt_*.py when it is missing (root and apt-get; else they skip)
#   make soak      the soak test for 10 minutes (make test runs it for 15 s)
#   make fuzz      atheris on the codecs, FUZZ_SECONDS (300) per target
#   make lint      ruff + mypy
#   make spec      regenerate src/warren/amqp/spec.py
#   make clean     remove build and cache artefacts (keeps $(VENV) and ./data)

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
# What is installed, one stamp per step (each depends on the one before):
# the broker's runtime, the compiled build's tools, the test extra.
RUNTIME_STAMP = $(VENV)/.installed-runtime
BUILD_STAMP = $(VENV)/.installed-build
TEST_STAMP = $(VENV)/.installed-test
# Announces a step of the install or the start (one line each).
STEP = @echo "== make:"

# When set, `make test` writes pytest's own exit status (a number) to this
# file. make itself turns every failing recipe into exit status 2, which
# hides pytest's distinctions (1 = tests failed, 5 = nothing collected, ...);
# .ci/run needs them. Empty by default, so interactive runs leave no file.
PYTEST_STATUS_FILE ?=

# pytest-xdist workers of `make test`'s compiled pass (0: no workers, one process
# per pass). The tests wait on sockets, timers and other processes (with two per
# pass the two cores were still half idle), and the compiled pass is the longer:
# four workers beside the pure pass's two and tests/spark's two gave it the
# larger share of the cores (7 min 4 s in all on a quiet machine; 7 min 34 s
# with three).
PYTEST_WORKERS ?= 4
# Workers of the pure pass but tests/spark, and of tests/spark, which runs
# beside it in a pytest of its own: two Spark JVMs (each worker that picks up a
# Spark test starts one; in one process the Spark tests' waits add up: 7.5 min).
PURE_WORKERS = $(if $(filter 0,$(PYTEST_WORKERS)),0,2)
SPARK_WORKERS = $(PURE_WORKERS)
# How xdist hands tests out: worksteal, so a worker that runs out of tests takes
# half of a busy one's queue (the long ones go first: tests/passes.py LONG_FIRST).
PYTEST_DIST = $(if $(filter 0,$(PYTEST_WORKERS)),,--dist worksteal)
# make cluster's base port (tools/cluster.py): clear of make run's 5672, 15672, 1883, 15692.
# Only from make's command line (make cluster PORT=30000): a PORT in the
# environment (many hosting platforms set one) does not move the cluster.
CLUSTER_PORT := $(if $(filter command line,$(origin PORT)),$(PORT),20000)

.PHONY: install install-test build run test test-busy stress-ng lint spec clean browser soak fuzz mosquitto etcd cluster rabbitmq fuse prometheus rhea autotools

# Reinstall whenever pyproject.toml or setup.py changes (dependencies, entry
# points, the compiled modules). Warren itself is installed editable and pure
# Python (WARREN_PURE_PYTHON=1 at install time: no compiling), without build
# isolation (setuptools from the venv, not a throwaway environment with mypy):
# `make run` should not wait minutes for mypyc and gcc. The compiled build is
# `make build`'s (and `make test`'s).
$(RUNTIME_STAMP): pyproject.toml setup.py
	$(STEP) "creating (or updating) the virtualenv $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip 'setuptools>=77'
	@# The distribution's old name (now warren-broker), in a venv made before the rename.
	@if $(PY) -m pip show -q warren >/dev/null 2>&1; then $(PY) -m pip uninstall -q -y warren; fi
	$(STEP) "installing Warren (editable, pure Python) and its runtime dependencies: pip install -e '.[fast]'"
	@WARREN_PURE_PYTHON=1 $(PY) -m pip install -q --no-build-isolation -e '.[fast]'
	@touch $@

# The compiled build's tools: pyproject.toml's build-system requirements (mypy
# for mypyc, setuptools).
$(BUILD_STAMP): $(RUNTIME_STAMP)
	$(STEP) "installing the build tools (mypy for mypyc, setuptools)"
	@$(PY) -m pip install -q $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"])')
	@touch $@

# The rest: the test extra (pytest, the client libraries, pyspark, playwright ...).
# First the dtls extra (DTLSSocket, for coaps://): PyPI has its source only, built
# with Cython in pip's isolated build (the test extra's install below has none)
# and tinydtls's autogen.sh (the autotools target); never fatal: without it the
# CoAP DTLS tests skip.
$(TEST_STAMP): $(BUILD_STAMP) | autotools
	$(STEP) "installing DTLSSocket (pyproject's dtls extra; builds tinydtls)"
	@$(PY) -m pip install -q $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dtls"])') || \
	echo "make: DTLSSocket did not build (autoconf, automake, libtool?); the CoAP DTLS tests will skip"
	$(STEP) "installing the test dependencies (pip install -e '.[test,fast]', about 1 GB)"
	@WARREN_PURE_PYTHON=1 $(PY) -m pip install -q --no-build-isolation -e '.[test,fast]'
	@touch $@

install: $(RUNTIME_STAMP)

install-test: $(TEST_STAMP)

# The compiled build (setup.py): mypyc puts the code of every module in
# COMPILED_MODULES in one extension, src/_warren_compiled__mypyc$(EXT_SUFFIX),
# and a small loader extension next to each module's .py
# (src/warren/amqp/connection.py -> src/warren/amqp/connection$(EXT_SUFFIX)).
# Its C is one file per module (build/mypyc), compiled one per core at a time.
EXT_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
COMPILED := $(shell sed -n 's/^    "warren\.\(.*\)",$$/\1/p' setup.py | tr . /)
COMPILED_SOURCES := $(patsubst %,src/warren/%.py,$(COMPILED))
SHARED_LIBRARY := src/_warren_compiled__mypyc$(EXT_SUFFIX)

# A build older than any of its modules' .py or of the hand-written C (setup.py's
# NATIVE: every .c and .h) is rebuilt before `make test` and `make run` (Warren
# itself would ignore the whole build and run the .py files).
# A build that cannot compile leaves everything pure Python (setup.py only
# warns); make then retries on each run.
NATIVE_SOURCES := src/warren/_fastpath.h src/warren/_fastpath.c src/warren/_fastpath_scan.c \
	src/warren/_fastpath_run.c src/warren/_fastpath_deliver.c src/warren/_fastpath_records.c \
	src/warren/_fastpath_spark.c src/warren/_fastpath_stream.c src/warren/_fastpath_chunks.c \
	src/warren/_syncworker.c
$(SHARED_LIBRARY): $(COMPILED_SOURCES) $(NATIVE_SOURCES) | $(BUILD_STAMP)
	$(STEP) "compiling the hot modules with mypyc (setup.py build_ext --inplace; a minute or two on 2 cores)"
	@$(PY) setup.py -q build_ext --inplace

build: $(BUILD_STAMP)
	$(STEP) "compiling the hot modules with mypyc (setup.py build_ext --inplace; a minute or two on 2 cores)"
	@$(PY) setup.py -q build_ext --inplace

# The compiled build when there is one (recompiled first when a source is newer);
# without one, pure Python at once rather than minutes of compiling first.
run: $(RUNTIME_STAMP)
	@if [ -e $(SHARED_LIBRARY) ]; then $(MAKE) --no-print-directory $(SHARED_LIBRARY); \
	else echo "== make: no compiled build: running pure Python (\`make build\` compiles the hot modules, 1.2-1.4x faster)"; fi
	$(STEP) "starting the broker: $(VENV)/bin/warren --data-dir ./data $(ARGS)"
	@$(VENV)/bin/warren --data-dir ./data $(ARGS)

cluster: $(RUNTIME_STAMP) $(SHARED_LIBRARY) etcd
	$(PY) tools/cluster.py --dir ./cluster-data --port $(CLUSTER_PORT)

# tests/ui drive Debian's chromium (playwright cannot fetch its own browser here).
# Quiet, idempotent, and never fatal: without chromium those tests skip.
browser:
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; } || \
	echo "make browser: could not install chromium; tests/ui will skip"

# tests/integration/test_perf_mqtt.py runs `warren perf mqtt` against Debian's mosquitto,
# which it starts itself on a free port (the package's own service on 1883, if
# the init system starts one, is not used). Quiet, idempotent, never fatal:
# without it those tests skip.
mosquitto:
	@[ -x /usr/sbin/mosquitto ] || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null 2>&1; } || \
	echo "make mosquitto: could not install mosquitto; tests/integration/test_perf_mqtt.py will skip"

# tests/http/test_shovels.py (and federation's tests) run a private RabbitMQ of
# Debian's rabbitmq-server as the other end. Quiet, idempotent, never fatal:
# without it those tests skip.
rabbitmq:
	@[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null 2>&1; } || \
	echo "make rabbitmq: could not install rabbitmq-server; the tests against it will skip"

# tests/protocol/amqp1 drive the broker with Node.js AMQP 1.0 clients too: rhea, pinned
# in $(RHEA_DIR)/package-lock.json, installed there by npm ci (node_modules, not in git;
# again only when the lock file is newer than the install). Quiet, idempotent, never
# fatal: without node and npm (or the registry) those tests skip.
RHEA_DIR = tests/protocol/amqp1/js
rhea:
	@[ $(RHEA_DIR)/node_modules/.package-lock.json -nt $(RHEA_DIR)/package-lock.json ] || \
	! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1 || \
	(cd $(RHEA_DIR) && npm ci --silent --no-audit --no-fund >/dev/null 2>&1) || \
	echo "make rhea: could not install rhea (npm ci in $(RHEA_DIR)); the rhea tests will skip"

# tests/store/powercut run the broker on a FUSE file system that drops every write not
# fsynced when the test cuts the power (tests/store/powercut/powercut_fs.py: mfusepy, from
# the test extra, over Debian's libfuse3). Quiet, idempotent, never fatal: without
# it those tests skip.
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null 2>&1; } || \
	echo "make fuse: could not install fuse3; tests/store/powercut will skip"

# DTLSSocket's build (the dtls extra) runs tinydtls's autogen.sh: Debian's autoconf,
# automake and libtool. Quiet, idempotent, never fatal (then DTLSSocket does not build).
autotools:
	@{ command -v autoreconf && command -v automake && command -v libtoolize; } >/dev/null 2>&1 || \
	! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake libtool >/dev/null 2>&1; } || \
	echo "make autotools: could not install autoconf, automake, libtool; DTLSSocket will not build"

# tests/cluster run real etcd members (Debian's etcd-server; the package's own
# service, if the init system starts one, is not used). Quiet, idempotent, never
# fatal: without etcd those tests skip.
etcd:
	@command -v etcd >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1; } || \
	echo "make etcd: could not install etcd-server; tests/cluster will skip"

# tests/http/test_prometheus_server.py runs Debian's prometheus (its own service, if the
# init system starts one, is not used) against RabbitMQ's Grafana dashboards.
# Quiet, idempotent, never fatal: without it that test skips.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null 2>&1; } || \
	echo "make prometheus: could not install prometheus; tests/http/test_prometheus_server.py will skip"

# The suite runs twice: against the compiled modules, then with
# WARREN_PURE_PYTHON=1 (every module from its .py, the fallback a machine
# without a C compiler gets). The pure pass shows that the .py files do what
# their compiled build does, so it runs only the groups whose tests run
# compiled modules in their own process: tests/core, store, protocol
# (and, once, tests/spark, whose data source is never compiled, and tests/ui,
# the UI's JavaScript: they keep the passes about as long). The rest (http,
# compat, cluster, integration, store/powercut: interpreted code, the
# protocol tests again over sockets, or Warren as
# separate processes) runs once, in the compiled pass. tests/passes.py says
# which group runs where and marks each test compiled_pass and/or pure_pass
# (`pytest --collect-only -q -m pure_pass` lists a pass; docs/testing.md).
# The two passes run at the same time, the compiled one over PYTEST_WORKERS (4)
# pytest-xdist workers, the pure one over PURE_WORKERS (2) plus one process for
# tests/spark: most of a test's time is spent waiting on sockets, timers and
# subprocesses (two serial passes kept the two cores about half busy and took
# 14 min here; with 2 workers each, 9 min; then 3 each), and tests/spark runs
# over SPARK_WORKERS (2) of its own, so that at most two Spark JVMs start (each
# worker that runs a Spark test starts one: tests/spark took 159 s of CPU over
# three workers, 127 s in one process, but 7.5 min there). Before its pytest
# starts, tests/spark/cds.py makes the Spark JVMs' class-data sharing archive
# (build/spark-cds.jsa, kept between runs) when it is missing. The pure pass needs
# neither lint nor the compiled build: it starts first and runs beside them
# (a minute on a fresh clone); when the build fails it is stopped and make test
# fails (status 2, no PYTEST_STATUS_FILE), as before. Lint (ruff and mypy: minutes
# of mypy after a merge, more on a fresh clone) runs beside the tests too, not
# before the compiled pass; its output follows the tests', and when it fails
# make test fails the same way (status 2, no PYTEST_STATUS_FILE). (Started before the first
# build, the pure pass does not collect the 42 cases that compare the C fast
# path's scanners with the Python ones: they need the built extension and run
# in the compiled pass.) The pure pass writes to
# a file, shown after the compiled pass's output. Each test uses its own
# ephemeral ports and temporary directories, so the passes and workers cannot
# meet.
# PYTEST_WORKERS=0 runs each pass in one process.
# The status recorded is the first failure's; 5 (nothing collected) only when
# neither run failed otherwise.
# Bytecode is cached (__pycache__, git-ignored) even where the environment says
# not to (PYTHONDONTWRITEBYTECODE, common in containers): otherwise every pytest
# worker compiles and assertion-rewrites all ~300 test modules (9.5 s of CPU
# each instead of 2.5) and every process a test starts compiles Warren again.
# Property-based tests run this share of the examples each asks for
# (tests/examples.py; the pure pass a third of that): their counts were chosen
# for finding bugs, and make test runs on every change (the compiled pass's
# fuzz of headers, codecs and metadata took 95 s of its 430 s of CPU at the
# full counts). EXAMPLES=1 runs the full counts, EXAMPLES=4 a deeper search;
# make fuzz runs the codecs under atheris for minutes each.
EXAMPLES ?= 0.5
# Where make test's temporary files go (every pass's tmp_path, and TMPDIR for
# what the tests and their processes make): a tmpfs when /dev/shm is one with
# 8 GiB free, else pytest's default under TMPDIR. On a disk, the brokers' fsyncs
# cost the kernel's journal work: 17 s of the suite's system CPU, the Spark pass
# 36 s of wall time. A run needs about 3.5 GB there (etcd preallocates 64 MB per
# node); it is one directory per checkout, emptied by the next run's pytest
# (--basetemp) and removed when make test passes, kept for a look when it fails.
# TEST_TMP= (empty) keeps the default.
ifeq ($(origin TEST_TMP),undefined)
TEST_TMP := $(shell [ "$$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && \
	[ "$$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -ge 8 ] 2>/dev/null && \
	echo "/dev/shm/warren-test-$$(id -u)-$$(echo '$(CURDIR)' | cksum | cut -d' ' -f1)")
endif
BASETEMP = $(if $(TEST_TMP),--basetemp=$(TEST_TMP)/$(1))
test: export PYTHONDONTWRITEBYTECODE :=
test: export WARREN_EXAMPLES := $(EXAMPLES)
test: $(TEST_STAMP) browser mosquitto etcd rabbitmq fuse prometheus rhea
	@log=$$(mktemp); spark_log=$$(mktemp); lint_log=$$(mktemp); \
	if [ -n "$(TEST_TMP)" ]; then mkdir -p "$(TEST_TMP)/tmp" && export TMPDIR="$(TEST_TMP)/tmp" && \
		echo "== make: temporary files in $(TEST_TMP) (a tmpfs; TEST_TMP= for the default)"; fi; \
	( exec env WARREN_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider -n $(PURE_WORKERS) $(PYTEST_DIST) $(call BASETEMP,pure) -m 'pure_pass and not spark' $(PYTEST_ARGS) > "$$log" 2>&1 ) & pure_pid=$$!; \
	( $(PY) tests/spark/cds.py build/spark-cds.jsa; exec env WARREN_PURE_PYTHON=1 WARREN_TEST_PASS=spark $(PY) -m pytest -q -p no:cacheprovider -n $(SPARK_WORKERS) $(PYTEST_DIST) $(call BASETEMP,spark) -m 'pure_pass and spark' $(PYTEST_ARGS) > "$$spark_log" 2>&1 ) & spark_pid=$$!; \
	( exec $(MAKE) --no-print-directory lint > "$$lint_log" 2>&1 ) & lint_pid=$$!; \
	echo "== make: the pure-Python pass (pids $$pure_pid, $$spark_pid for tests/spark) and lint (pid $$lint_pid) started; the compiled build meanwhile"; \
	if ! $(MAKE) --no-print-directory $(SHARED_LIBRARY); then \
		kill $$pure_pid $$spark_pid $$lint_pid 2>/dev/null; wait $$pure_pid $$spark_pid $$lint_pid; rm -f "$$log" "$$spark_log" "$$lint_log"; exit 2; fi; \
	if ! $(PY) -c 'import warren; assert warren.compiled_modules()' 2>/dev/null; then \
		kill $$pure_pid $$spark_pid $$lint_pid 2>/dev/null; wait $$pure_pid $$spark_pid $$lint_pid; rm -f "$$log" "$$spark_log" "$$lint_log"; \
		echo "make test: no usable compiled build (mypyc or the C compiler failed: see the"; \
		echo "warning above; \`make build\` again shows why); the compiled pass would be pure Python"; \
		exit 2; fi; \
	echo "== pytest, $$($(PY) -c 'import warren; print(warren.build_description())') (the pure-Python pass runs alongside)"; \
	status=0; $(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_DIST) $(call BASETEMP,compiled) -m compiled_pass $(PYTEST_ARGS) || status=$$?; \
	pure=0; wait $$pure_pid || pure=$$?; \
	spark=0; wait $$spark_pid || spark=$$?; \
	echo "== pytest, pure Python (WARREN_PURE_PYTHON=1)"; \
	cat "$$log"; rm -f "$$log"; \
	echo "== pytest, pure Python, tests/spark (two workers, two JVMs)"; \
	cat "$$spark_log"; rm -f "$$spark_log"; \
	if [ "$$status" = 0 ] || { [ "$$status" = 5 ] && [ "$$pure" != 0 ]; }; then status=$$pure; fi; \
	if { [ "$$status" = 0 ] || [ "$$status" = 5 ]; } && [ "$$spark" != 0 ] && [ "$$spark" != 5 ]; then status=$$spark; fi; \
	lint=0; wait $$lint_pid || lint=$$?; \
	echo "== make lint (ruff and mypy, beside the tests)"; \
	cat "$$lint_log"; rm -f "$$lint_log"; \
	if [ "$$lint" != 0 ]; then echo "make test: ruff or mypy failed (above)"; exit 2; fi; \
	if [ -n "$(PYTEST_STATUS_FILE)" ]; then echo "$$status" > "$(PYTEST_STATUS_FILE)"; fi; \
	if [ -n "$(TEST_TMP)" ]; then if [ "$$status" = 0 ]; then rm -rf "$(TEST_TMP)"; \
		else echo "make test: the tests' temporary files are in $(TEST_TMP) (RAM: rm -rf it when done)"; fi; fi; \
	exit $$status

# `make test` with CPU hogs beside it (BUSY_HOGS stress-ng workers, 2 by
# default; issue 29: a suite that fails when the machine is busy fails for
# contributors and CI runners alike). The prerequisites come first, so the hogs
# run beside the two pytest passes, not beside pip and mypyc; they are stopped
# when make test ends, fails or is interrupted (the trap), and stress-ng's own
# --timeout ends them even if this shell is killed outright.
BUSY_HOGS ?= 2
test-busy: stress-ng $(TEST_STAMP) $(SHARED_LIBRARY) browser mosquitto etcd rabbitmq fuse prometheus rhea
	@command -v stress-ng >/dev/null 2>&1 || { echo "make test-busy: stress-ng is missing (Debian's stress-ng; make stress-ng needs root and apt-get)"; exit 1; }
	@stress-ng --cpu $(BUSY_HOGS) --timeout 3h --quiet & hogs=$$!; \
	trap 'kill $$hogs 2>/dev/null; wait $$hogs 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "== make: $(BUSY_HOGS) CPU hogs beside make test (stress-ng --cpu $(BUSY_HOGS), pid $$hogs)"; \
	$(MAKE) --no-print-directory test

# Debian's stress-ng for make test-busy. Quiet, idempotent; test-busy says so
# when it could not be installed.
stress-ng:
	@command -v stress-ng >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	{ apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null 2>&1; } || \
	echo "make stress-ng: could not install stress-ng"

# The soak test (tests/integration/test_soak.py) for 10 minutes instead of make test's 15 s:
# churn and malformed clients against one broker while a confirmed publisher and
# an acking consumer must lose nothing and never wait more than 1 s.
soak: $(TEST_STAMP) $(SHARED_LIBRARY)
	WARREN_SOAK_SECONDS=$${WARREN_SOAK_SECONDS:-600} $(PY) -m pytest -q -s tests/integration/test_soak.py

# Coverage-guided fuzzing of the codecs (tools/fuzz.py, atheris from PyPI) for
# FUZZ_SECONDS per target, pure Python so atheris sees every line.
FUZZ_SECONDS ?= 300
fuzz: $(TEST_STAMP)
	@$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q atheris
	@for t in $$($(PY) tools/fuzz.py --list | sed 's/^targets: //; s/,//g'); do \
		echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
		WARREN_PURE_PYTHON=1 $(PY) tools/fuzz.py $$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 || exit 1; \
	done

lint: $(TEST_STAMP)
	$(PY) -m ruff check src tests tools bench examples
	$(PY) -m mypy

spec: $(TEST_STAMP)
	$(PY) tools/gen_amqp_spec.py

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find src -name '*$(EXT_SUFFIX)' -delete
	find src tests tools -name __pycache__ -type d -prune -exec rm -rf {} +

# outbox: PGXS build.  `make && make install` builds against the PostgreSQL
# whose pg_config is found (or named: PG_CONFIG=/path/to/pg_config, any
# major from 15 to 19) and the librdkafka pkg-config finds (another build:
# PKG_CONFIG_PATH=<its prefix>/lib/pkgconfig).

EXTENSION = outbox
DATA = sql/outbox--0.1.0.sql sql/outbox--0.2.0.sql sql/outbox--0.3.0.sql \
	sql/outbox--0.4.0.sql sql/outbox--0.5.0.sql sql/outbox--0.6.0.sql \
	sql/outbox--0.7.0.sql sql/outbox--0.8.0.sql sql/outbox--0.9.0.sql \
	sql/outbox--0.10.0.sql \
	sql/outbox--0.1.0--0.2.0.sql sql/outbox--0.2.0--0.3.0.sql \
	sql/outbox--0.3.0--0.4.0.sql sql/outbox--0.4.0--0.5.0.sql \
	sql/outbox--0.5.0--0.6.0.sql sql/outbox--0.6.0--0.7.0.sql \
	sql/outbox--0.7.0--0.8.0.sql sql/outbox--0.8.0--0.9.0.sql \
	sql/outbox--0.9.0--0.10.0.sql
MODULE_big = outbox
OBJS = \
	src/outbox.o \
	src/capture.o \
	src/capture_expand.o \
	src/capture_json.o \
	src/capture_row.o \
	src/capture_settings.o \
	src/commit_report.o \
	src/enqueue.o \
	src/exactly_once.o \
	src/inbox_apply.o \
	src/inbox_rights.o \
	src/inbox_slot.o \
	src/inbox_store.o \
	src/inbox_consumer.o \
	src/inbox_worker.o \
	src/inbox_sql.o \
	src/topic_grant.o \
	src/key_lock.o \
	src/launcher.o \
	src/launcher_slot.o \
	src/metrics.o \
	src/publisher.o \
	src/pipeline.o \
	src/row_writer.o \
	src/kafka_link.o \
	src/producer.o \
	src/statements.o \
	src/store.o \
	src/segment.o \
	src/serving.o \
	src/status.o \
	src/settings.o \
	src/shared_memory.o \
	src/standby_slots.o \
	src/trace_context.o \
	src/worker_session.o \
	src/worker_slot.o

# librdkafka runs in outbox_kafka, a process of its own (src/kafka_process.c
# and its modes), installed beside the module.
KAFKA_PROCESS = src/outbox_kafka
KAFKA_PROCESS_SRCS = src/kafka_process.c src/kafka_produce.c src/kafka_transaction.c \
	src/kafka_consume.c
EXTRA_CLEAN = $(KAFKA_PROCESS)

# librdkafka as pkg-config describes it, else the system's.  Its headers are
# included as a system's are (-Wextra finds fault with 2.14's own); a build
# outside the linker's own directories is found at run time by an rpath.
RDKAFKA_CFLAGS := $(patsubst -I%,-isystem %,$(shell pkg-config --cflags rdkafka 2>/dev/null))
RDKAFKA_LIBDIR := $(shell pkg-config --variable=libdir rdkafka 2>/dev/null)
RDKAFKA_LIBS := $(or $(shell pkg-config --libs rdkafka 2>/dev/null),-lrdkafka)
ifneq ($(RDKAFKA_LIBDIR),)
ifeq ($(filter /usr/lib%,$(RDKAFKA_LIBDIR)),)
RDKAFKA_LIBS += -Wl,-rpath,$(RDKAFKA_LIBDIR)
endif
endif

PG_CPPFLAGS = -I$(srcdir)/src $(RDKAFKA_CFLAGS)
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
SHLIB_LINK = $(RDKAFKA_LIBS)

# Tests.  `make installcheck` needs the extension installed (`make install`)
# and no Kafka broker; `make installcheck-kafka` needs a broker as well.
# `bash test/run-tests` runs both, starting the broker itself.
#
#   make installcheck        pg_regress (test/sql/*.sql against
#                            test/expected/*.out) and the isolation specs
#                            (test/specs), each in a temporary instance
#                            configured by test/regress.conf: the library
#                            preloaded, the worker pointed at a port where
#                            no broker listens.
#   make installcheck-kafka  the TAP tests (test/t/*.pl) against the Kafka
#                            broker at OUTBOX_KAFKA_BROKERS (or 127.0.0.1:
#                            KAFKA_PORT); each makes its own clusters.
#                            First, one at a time, those that stop, kill or
#                            freeze that broker (TAP_BROKER_TESTS); then the
#                            rest, TAP_JOBS at once.
#                            PROVE_TESTS=test/t/001_publish.pl runs the
#                            tests named, one at a time.
#   make installcheck-kafka-quick  TAP_QUICK_TESTS only, TAP_JOBS at once.
REGRESS = surface refused dead_letter views privileges settings databases delivery capture
REGRESS_OPTS = --inputdir=$(srcdir)/test --temp-instance=tmp_regress --temp-config=$(srcdir)/test/regress.conf

ISOLATION = enqueue_rollback key_locks row_writer capture_settings_cache
ISOLATION_OPTS = --inputdir=$(srcdir)/test --temp-instance=tmp_check_iso --temp-config=$(srcdir)/test/regress.conf

# Not TAP_TESTS = 1, which would make installcheck run them too.
# The tests that stop, kill or freeze the shared broker run alone, and so
# does 024, whose three-node cluster takes the ports of 020's; the others
# wait on servers far more than they compute, and run side by side.
TAP_BROKER_TESTS = test/t/003_broker_outage.pl test/t/010_fault_broker_kill.pl \
	test/t/011_fault_broker_freeze.pl test/t/013_fault_config.pl \
	test/t/019_fault_postmaster_death.pl test/t/022_fault_inbox.pl \
	test/t/023_fault_exactly_once.pl test/t/024_fault_exactly_once_cluster.pl
TAP_JOBS ?= 3
# What every other major runs besides pg_regress and isolation when the test
# command runs the whole suite on one (test/run-tests): the upgrades, the
# core of publishing, the inbox, the failover to a standby, the Debezium
# capture and its bytes, exactly-once publication, the reclaimer (a background worker the publisher
# registers, with its settings set for a transaction).
TAP_QUICK_TESTS = test/t/001_publish.pl test/t/002_order.pl test/t/004_dead_letter.pl \
	test/t/021_fault_failover.pl test/t/106_upgrade.pl test/t/107_dump_restore.pl \
	test/t/122_reclaimer.pl test/t/201_inbox.pl test/t/206_debezium_capture.pl \
	test/t/208_packaging.pl test/t/209_debezium_bytes.pl test/t/210_exactly_once.pl
EXTRA_CLEAN += tmp_regress tmp_check $(EXTENSION)-*.zip

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# After pgxs, which resets it: the tests' shared module, the TAP framework
# and timings.  The framework (PostgreSQL::Test::Cluster) is the server's own
# when its pgxs has one (PG_PROVE_FLAGS, first); else PostgreSQL 15's, from
# Debian's postgresql-server-dev-15, which drives the binaries of any later
# major that comes first in PATH.
TAP_FRAMEWORK ?= /usr/lib/postgresql/15/lib/pgxs/src/test/perl
PROVE_FLAGS += -I $(srcdir)/test/perl -I $(TAP_FRAMEWORK) --timer

all: $(KAFKA_PROCESS)

# The release archive, as PGXN takes it: the files git tracks at HEAD, under
# outbox-VERSION/, VERSION being META.json's.
DIST_VERSION = $(shell perl -MJSON::PP -0777 -ne 'print decode_json($$_)->{version}' $(srcdir)/META.json)
.PHONY: dist
dist:
	git -C $(srcdir) archive --format=zip --prefix=$(EXTENSION)-$(DIST_VERSION)/ \
	  -o '$(CURDIR)/$(EXTENSION)-$(DIST_VERSION).zip' HEAD

# PGXS tracks no header: an object built before a header changed (a struct
# that grew a field) would be linked with one built after.  Every object
# depends on every header; a full build takes seconds.
$(OBJS): $(wildcard $(srcdir)/src/*.h)

$(KAFKA_PROCESS): $(KAFKA_PROCESS_SRCS) src/kafka_process.h src/kafka_wire.h
	$(CC) $(CFLAGS) $(PG_CFLAGS) -I$(srcdir)/src $(RDKAFKA_CFLAGS) -o $@ $(KAFKA_PROCESS_SRCS) $(RDKAFKA_LIBS)

install: install-kafka-process

.PHONY: install-kafka-process
install-kafka-process: $(KAFKA_PROCESS)
	$(INSTALL_PROGRAM) $(KAFKA_PROCESS) '$(DESTDIR)$(pkglibdir)/outbox_kafka'

.PHONY: installcheck-kafka installcheck-kafka-quick
installcheck-kafka:
	rm -rf '$(CURDIR)'/tmp_check && $(MKDIR_P) '$(CURDIR)'/tmp_check
ifdef PROVE_TESTS
	$(call run_tap,$(PROVE_TESTS),1)
else
# Both runs go on if the first fails; the status is the worse of the two.
	$(call run_tap,$(TAP_BROKER_TESTS),1); serial=$$?; \
	$(call run_tap,$(filter-out $(TAP_BROKER_TESTS),$(wildcard test/t/*.pl)),$(TAP_JOBS)); \
	test $$serial -eq 0 -a $$? -eq 0
endif

installcheck-kafka-quick:
	rm -rf '$(CURDIR)'/tmp_check && $(MKDIR_P) '$(CURDIR)'/tmp_check
	$(call run_tap,$(TAP_QUICK_TESTS),$(TAP_JOBS))

# The TAP tests run as PGXS's prove_installcheck would run them, but also
# against a server built without --enable-tap-tests (PyPI's builds), whose
# pgxs defines no prove_installcheck: $(call run_tap,TESTS,JOBS).  The
# framework of 15 finds tmp_check under TESTDIR; later ones (19's own, which
# the tests use there) under TESTDATADIR, and the log under TESTLOGDIR, else
# at relative paths that a server resolves from its data directory.
PROVE := $(or $(PROVE),prove)
define run_tap
cd $(srcdir) && TESTDIR='$(CURDIR)' TESTDATADIR='$(CURDIR)/tmp_check' TESTLOGDIR='$(CURDIR)/tmp_check/log' \
  PATH="$(bindir):$(CURDIR):$$PATH" PGPORT='6$(DEF_PGPORT)' \
  PG_REGRESS='$(top_builddir)/src/test/regress/pg_regress' \
  $(PROVE) $(PG_PROVE_FLAGS) $(PROVE_FLAGS) -j$(2) $(1)
endef

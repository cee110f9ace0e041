# outbox: PGXS build.  `make && make install` builds against the PostgreSQL
# found by pg_config and the system's librdkafka.

EXTENSION = outbox
DATA = sql/outbox--0.1.0.sql
MODULE_big = outbox
OBJS = \
	src/outbox.o \
	src/enqueue.o \
	src/publisher.o \
	src/pipeline.o \
	src/producer.o \
	src/store.o \
	src/status.o \
	src/settings.o \
	src/worker_slot.o

PG_CPPFLAGS = -I$(srcdir)/src
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
SHLIB_LINK = -lrdkafka

# pg_regress: the SQL surface, run in a temporary instance that preloads the
# library (the worker needs it; so do the commit-time wake and the GUCs).
# Inputs in sql/, expected output in expected/.
REGRESS = surface refused dead_letter views privileges
REGRESS_OPTS = --temp-instance=tmp_regress --temp-config=$(srcdir)/test/regress.conf

# Isolation specs in test/specs, expected output in test/expected.
ISOLATION = enqueue_rollback
ISOLATION_OPTS = --temp-instance=tmp_check_iso --temp-config=$(srcdir)/test/regress.conf --inputdir=$(srcdir)/test

# TAP tests against a real Kafka broker: test/run-tests starts it.
PROVE_TESTS ?= test/t/*.pl
EXTRA_CLEAN = tmp_regress

TAP_TESTS = 1

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# After pgxs, which resets it: the tests' shared module, and timings.
PROVE_FLAGS += -I $(srcdir)/test/perl --timer

/*-------------------------------------------------------------------------
 *
 * statements.h
 *	  The workers' prepared statements: a set of named statements on the
 *	  extension's tables, prepared once per extension schema.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STATEMENTS_H
#define OUTBOX_STATEMENTS_H

#include "executor/spi.h"

/* The most parameters a statement takes. */
#define STATEMENT_MAX_ARGS 16

/*
 * How a statement is planned: once, for any values, or for each run's
 * values (see store.c for why each statement has the one it has).
 */
#define PLAN_ONCE CURSOR_OPT_GENERIC_PLAN
#define PLAN_EACH_TIME CURSOR_OPT_CUSTOM_PLAN

typedef struct StatementDef
{
	const char *name;			/* for error messages */
	const char *sql;			/* %1$s is the extension's schema; see below */
	int			nargs;
	Oid			argtypes[STATEMENT_MAX_ARGS];
	int			plan;			/* PLAN_ONCE or PLAN_EACH_TIME */
} StatementDef;

/*
 * What a statement's text writes for the columns a schema older than the
 * library's may lack, until ALTER EXTENSION UPDATE: the statements are
 * prepared for the schema they find, and again once it has them.
 * TARGET_PARTITION_VALUE is a claimed message's (m.target_partition, or
 * NULL before 0.6.0); TARGET_PARTITION_COLUMN and
 * TARGET_PARTITION_COLUMN_VALUE add outbox_dead_letter's column and its
 * value (", m.target_partition") to an INSERT's lists, or nothing.
 */
#define TARGET_PARTITION_VALUE "@target_partition@"
#define TARGET_PARTITION_COLUMN "@target_partition_column@"
#define TARGET_PARTITION_COLUMN_VALUE "@target_partition_column_value@"

/* A worker's statements, and the schema they are prepared for. */
typedef struct StatementSet
{
	const StatementDef *defs;
	int			count;
	SPIPlanPtr *plans;			/* count of them, NULL until prepared */
	Oid			namespace;
	Oid			extension;
	bool		has_target_partition;	/* the schema has that column */
} StatementSet;

extern Oid	extension_namespace(Oid *extension, Oid *owner);
extern bool schema_has_target_partition(Oid namespace);
extern Oid	statements_find_extension(StatementSet *set);
extern void statements_forget(StatementSet *set);
extern int	statement_run(StatementSet *set, int stmt, Datum *args, const char *nulls,
						  int expected);
extern Datum statement_array(Datum *elements, int count, Oid type);
extern int	statement_run_as(Oid role, const char *sql, int nargs, Oid *types, Datum *values,
							 const char *nulls);
extern ErrorData *run_in_subtransaction(void (*run) (void *arg), void *arg);
extern void statements_begin_transaction(const char *activity);
extern void statements_commit_transaction(MemoryContext caller);

#endif							/* OUTBOX_STATEMENTS_H */

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
	const char *sql;			/* %1$s is the extension's schema */
	int			nargs;
	Oid			argtypes[STATEMENT_MAX_ARGS];
	int			plan;			/* PLAN_ONCE or PLAN_EACH_TIME */
} StatementDef;

/* A worker's statements, and the schema they are prepared for. */
typedef struct StatementSet
{
	const StatementDef *defs;
	int			count;
	SPIPlanPtr *plans;			/* count of them, NULL until prepared */
	Oid			namespace;
	Oid			extension;
} StatementSet;

extern Oid	extension_namespace(Oid *extension, Oid *owner);
extern Oid	statements_find_extension(StatementSet *set);
extern void statements_forget(StatementSet *set);
extern int	statement_run(StatementSet *set, int stmt, Datum *args, const char *nulls,
						  int expected);
extern Datum statement_array(Datum *elements, int count, Oid type);
extern ErrorData *run_in_subtransaction(void (*run) (void *arg), void *arg);

#endif							/* OUTBOX_STATEMENTS_H */

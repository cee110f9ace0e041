/*-------------------------------------------------------------------------
 *
 * pg_compat.h
 *	  Every difference between the PostgreSQL majors this extension builds
 *	  against (15 to 19), in one place.
 *
 * The code is written against the newest server's interfaces; this file
 * gives the older majors the same names and signatures.  Nothing else in
 * src/ tests PG_VERSION_NUM: a difference found elsewhere belongs here.
 * Each entry says which major changed what, so that it can go once the
 * oldest supported major has the newer form.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PG_COMPAT_H
#define OUTBOX_PG_COMPAT_H

/* The headers of everything below, first: a macro must follow its function's declaration. */
#include "access/attmap.h"
#include "access/xlogdefs.h"
#include "catalog/pg_class_d.h"
#include "catalog/pg_database_d.h"
#include "catalog/pg_namespace_d.h"
#include "catalog/pg_proc_d.h"
#include "common/jsonapi.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/wait_event.h"
#if PG_VERSION_NUM >= 170000
#include "replication/walsender_private.h"
#include "storage/condition_variable.h"
#endif

/*
 * 17 numbered the processes' PGPROC entries by MyProcNumber; before, each
 * PGPROC said its own.  A backend's number is below MaxBackends either way.
 */
#if PG_VERSION_NUM < 170000
#define MyProcNumber (MyProc->pgprocno)
#endif

/* 16 moved the varlena macros out of postgres.h into varatt.h. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * 16 replaced the per-catalog pg_*_ownercheck() and pg_*_aclcheck() by
 * object_ownercheck() and object_aclcheck(); older majors get these for the
 * catalogs this extension asks about.
 */
#if PG_VERSION_NUM < 160000
static inline bool
object_ownercheck(Oid classid, Oid objectid, Oid roleid)
{
	if (classid == DatabaseRelationId)
		return pg_database_ownercheck(objectid, roleid);
	Assert(classid == RelationRelationId);
	return pg_class_ownercheck(objectid, roleid);
}

static inline AclResult
object_aclcheck(Oid classid, Oid objectid, Oid roleid, AclMode mode)
{
	if (classid == NamespaceRelationId)
		return pg_namespace_aclcheck(objectid, roleid, mode);
	Assert(classid == ProcedureRelationId);
	return pg_proc_aclcheck(objectid, roleid, mode);
}

/* 16 added missing_ok (here always false, as before). */
#define build_attrmap_by_name_if_req(indesc, outdesc, missing_ok) \
	build_attrmap_by_name_if_req(indesc, outdesc)
#endif

/*
 * 17 added LockHeldByMe()'s orstronger (false: exactly the mode asked) and
 * makeJsonLexContextCstringLen()'s first argument (NULL: a new context).
 */
#if PG_VERSION_NUM < 170000
#define LockHeldByMe(tag, mode, orstronger) LockHeldByMe(tag, mode)
#define makeJsonLexContextCstringLen(lex, json, len, encoding, need_escapes) \
	makeJsonLexContextCstringLen(json, len, encoding, need_escapes)
#endif

/*
 * 17 made a wait event set belong to a resource owner instead of a memory
 * context.  The extension's sets are freed by their maker before it
 * returns, so they need no owner: on 17 and later NULL, which puts them in
 * TopMemoryContext; before, the current context.
 */
static inline WaitEventSet *
create_wait_event_set(int nevents)
{
#if PG_VERSION_NUM >= 170000
	return CreateWaitEventSet(NULL, nevents);
#else
	return CreateWaitEventSet(CurrentMemoryContext, nevents);
#endif
}

/*
 * 16 records why a slot was invalidated (and 17 dropped invalidated_at);
 * 15 knows only that it was, by a WAL position of its invalidation.
 */
static inline bool
slot_is_invalidated(const ReplicationSlotPersistentData *data)
{
#if PG_VERSION_NUM >= 160000
	return data->invalidated != RS_INVAL_NONE;
#else
	return !XLogRecPtrIsInvalid(data->invalidated_at);
#endif
}

/*
 * Sleep for timeout_ms at most, or until a standby replies.  From 17, the
 * walsender of a slot listed in PostgreSQL's own synchronized_standby_slots
 * broadcasts a condition variable when its standby confirms a flush, which
 * wakes the sleeper at once; a reply between the caller's look at the slots
 * and this sleep is caught by the timeout.  Before 17 (or for a slot not
 * listed there) the timeout, and the latch, are all there is.
 */
static inline void
sleep_for_standby_reply(long timeout_ms)
{
#if PG_VERSION_NUM >= 170000
	ConditionVariablePrepareToSleep(&WalSndCtl->wal_confirm_rcv_cv);
	(void) ConditionVariableTimedSleep(&WalSndCtl->wal_confirm_rcv_cv, timeout_ms,
									   PG_WAIT_EXTENSION);
	ConditionVariableCancelSleep();
#else
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 timeout_ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
#endif
}

/*
 * 19 gave ExecInsertIndexTuples() flags for what were booleans, and a new
 * order of arguments; 16 had added onlySummarizing.
 */
#if PG_VERSION_NUM < 190000
#define EIIT_IS_UPDATE (1 << 0)
#define EIIT_NO_DUPE_ERROR (1 << 1)
#define EIIT_ONLY_SUMMARIZING (1 << 2)

static inline List *
insert_index_tuples_before_19(ResultRelInfo *rri, EState *estate, uint32 flags,
							  TupleTableSlot *slot, List *arbiters, bool *spec_conflict)
{
	return ExecInsertIndexTuples(rri, slot, estate, (flags & EIIT_IS_UPDATE) != 0,
								 (flags & EIIT_NO_DUPE_ERROR) != 0, spec_conflict, arbiters
#if PG_VERSION_NUM >= 160000
								 ,(flags & EIIT_ONLY_SUMMARIZING) != 0
#endif
		);
}
#define ExecInsertIndexTuples insert_index_tuples_before_19
#endif

/*
 * 19 made pushJsonbValue() build into a JsonbInState, whose result is the
 * finished value; before, it returned each step's value and kept a parse
 * state alone.  The older majors get a JsonbInState of their own (start it
 * zeroed, as 19 asks) and the same call.
 */
#if PG_VERSION_NUM < 190000
typedef struct JsonbInState
{
	JsonbValue *result;			/* the last push's value: at the end, the whole */
	JsonbParseState *parseState;
} JsonbInState;

static inline void
push_jsonb_value_before_19(JsonbInState *state, JsonbIteratorToken seq, JsonbValue *value)
{
	state->result = pushJsonbValue(&state->parseState, seq, value);
}
#define pushJsonbValue push_jsonb_value_before_19
#endif

/* 19 added ReplicationSlotValidateName()'s allow_reserved_name. */
#if PG_VERSION_NUM < 190000
#define ReplicationSlotValidateName(name, allow_reserved_name, elevel) \
	ReplicationSlotValidateName(name, elevel)
#endif

/* 19 took ShmemInitHash()'s initial size away: a table is made whole. */
#if PG_VERSION_NUM < 190000
#define ShmemInitHash(name, nelems, info, flags) ShmemInitHash(name, nelems, nelems, info, flags)
#endif

/* 19 moved get_database_name() from dbcommands.h to lsyscache.h. */
#if PG_VERSION_NUM < 190000
#include "commands/dbcommands.h"
#endif

/*
 * 19 passes a signal handler who sent the signal, which a handler that
 * wraps another hands on: PASS_SIGNAL_ARGS are the arguments of SIGNAL_ARGS.
 */
#if PG_VERSION_NUM >= 190000
#define PASS_SIGNAL_ARGS postgres_signal_arg, pg_siginfo
#else
#define PASS_SIGNAL_ARGS postgres_signal_arg
#endif

/* 19 marks a fall through with pg_fallthrough, and asks for it. */
#ifndef pg_fallthrough
#define pg_fallthrough __attribute__((fallthrough))
#endif

/*
 * 18 replaced pg_attribute_noreturn(), which followed a declaration, by
 * pg_noreturn, which precedes it.
 */
#ifndef pg_noreturn
#define pg_noreturn _Noreturn
#endif

#endif							/* OUTBOX_PG_COMPAT_H */

/*-------------------------------------------------------------------------
 *
 * row_writer.c
 *	  outbox_enqueue()'s insert: its row written straight into its segment,
 *	  with what an INSERT does for each row and none of what it does for
 *	  each statement.
 *
 * An INSERT run for each call (through SPI) starts an executor each time:
 * it plans the columns' defaults, routes the row to its segment, compiles
 * the CHECK constraint and the partial indexes' predicates, and fires the
 * row trigger, which finds its relations again.  For a single row that is
 * most of the cost: B1B measured outbox_enqueue() at a fifth of a plain
 * INSERT's rows/s.  So the writer keeps, for each backend, what an
 * INSERT INTO outbox_message works out for each statement:
 *
 * - the table's column defaults, ready to evaluate, in an executor state
 *   of its own that lives as long as what it keeps;
 * - for each segment, once it has been written: its indexes' IndexInfo,
 *   with their predicates, and its constraints, compiled on first use.
 *
 * For each row it evaluates the defaults, draws the id, opens and locks
 * the table and the one segment the row goes to (RowExclusiveLock, held
 * until the transaction ends, as an INSERT holds it) and the segment's
 * indexes, checks the constraints, and inserts the tuple and its index
 * entries.  It does the work of the trigger outbox_message_check() that an
 * INSERT would fire: the caller has done the checks and taken the key
 * lock, the id is drawn here, after them.
 *
 * What it keeps comes from the catalog, and any relcache invalidation of
 * the table or a segment drops it (a new index, trigger, constraint or
 * default, ALTER EXTENSION UPDATE): it is built again at the next call.
 * It holds no relation open between calls, and checks after taking each
 * lock that nothing it keeps went stale while it waited.
 *
 * It writes only a table as the install script makes it: partitioned into
 * the segments, with no trigger but outbox_message_check(), no rule and no
 * generated column.  For any other (an older schema, before ALTER
 * EXTENSION UPDATE; a trigger or a rule someone added) row_writer_insert()
 * returns false and writes nothing, and the caller runs an INSERT instead,
 * which fires every trigger and obeys every rule.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/tupconvert.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "message.h"
#include "pg_compat.h"
#include "row_writer.h"
#include "segment.h"

/* A segment as the writer keeps it. */
typedef struct SegmentWriter
{
	Oid			relid;
	bool		ready;			/* its ResultRelInfo built */
	bool		writable;		/* as the install script makes it */
	ResultRelInfo *result_rel;	/* ri_RelationDesc and index relations set only during a call */
	Oid		   *index_oids;		/* in the order of ri_IndexRelationDescs */
	AttrMap    *from_table;		/* NULL if its columns are the table's */
	TupleTableSlot *slot;		/* in its layout, when from_table is set */
} SegmentWriter;

/* The columns outbox_enqueue() gives; every other takes its default. */
typedef enum GivenColumn
{
	GIVEN_ID,
	GIVEN_TOPIC,
	GIVEN_KEY,
	GIVEN_PAYLOAD,
	GIVEN_HEADERS,
	GIVEN_COLUMNS
} GivenColumn;

static const char *const given_column_names[GIVEN_COLUMNS] = {
	"id", "topic", "key", "payload", "headers"
};

typedef struct RowWriter
{
	MemoryContext context;		/* all of it, estate included */
	bool		valid;			/* false once an invalidation came */
	bool		complete;		/* built to the end, not cut short by an error */
	bool		writable;		/* the table is one it writes */
	Oid			namespace;
	Oid			table;
	Oid			id_sequence;
	EState	   *estate;
	TupleTableSlot *slot;		/* in the table's layout */
	AttrNumber	given[GIVEN_COLUMNS];
	AttrNumber	segment_column;
	/* set over their defaults for a message with a partition or a delay */
	AttrNumber	target_partition_column;	/* InvalidAttrNumber before 0.6.0 */
	AttrNumber	state_column;
	AttrNumber	next_attempt_at_column;
	Datum		retrying_state; /* 'retrying', a delayed message's state */
	ExprState **defaults;		/* per column; NULL for the given ones and those without */
	SegmentWriter segments[OUTBOX_SEGMENTS];
} RowWriter;

static RowWriter *writer = NULL;

/* Drop nothing here (a call may be using it), only mark it stale. */
static void
invalidate_writer(Datum arg, Oid relid)
{
	if (writer == NULL || !writer->valid)
		return;
	if (relid == InvalidOid || relid == writer->table)
		writer->valid = false;
	for (int s = 0; s < OUTBOX_SEGMENTS; s++)
		if (relid == writer->segments[s].relid)
			writer->valid = false;
}

/* Is this trigger outbox_message_check(), as the install script creates it? */
static bool
is_own_trigger(const Trigger *trigger)
{
	char	   *name = get_func_name(trigger->tgfoid);
	bool		own;

	own = name != NULL && strcmp(name, "outbox_message_check") == 0 &&
		get_func_namespace(trigger->tgfoid) == writer->namespace &&
		TRIGGER_FOR_ROW(trigger->tgtype) && TRIGGER_FOR_BEFORE(trigger->tgtype) &&
		TRIGGER_FOR_INSERT(trigger->tgtype);
	return own;
}

/*
 * Has rel a rule ON INSERT?  Read from the relcache's rules, not from
 * relhasrules, which stays set once a rule was dropped.
 */
static bool
has_insert_rule(Relation rel)
{
	if (rel->rd_rules == NULL)
		return false;
	for (int i = 0; i < rel->rd_rules->numLocks; i++)
		if (rel->rd_rules->rules[i]->event == CMD_INSERT)
			return true;
	return false;
}

/*
 * Does rel fire no trigger on INSERT but outbox_message_check(), has it no
 * rule (DO ALSO or DO INSTEAD, which the rewriter applies to an INSERT and
 * the writer would not) and no generated column?  (RLS cannot apply:
 * outbox_enqueue() runs as the extension's owner, a superuser.)
 */
static bool
writes_as_insert_would(Relation rel)
{
	TriggerDesc *triggers = rel->trigdesc;

	if (has_insert_rule(rel))
		return false;
	if (rel->rd_att->constr && rel->rd_att->constr->has_generated_stored)
		return false;
	if (triggers == NULL)
		return true;
	for (int i = 0; i < triggers->numtriggers; i++)
		if (TRIGGER_FOR_INSERT(triggers->triggers[i].tgtype) &&
			!is_own_trigger(&triggers->triggers[i]))
			return false;
	return true;
}

/*
 * The table's part: its layout, which columns are given, the defaults of
 * the others, the segments' relations.  Returns whether it is one the
 * writer writes.
 */
static bool
build_table_part(Relation table)
{
	TupleDesc	desc = RelationGetDescr(table);

	if (table->rd_rel->relkind != RELKIND_PARTITIONED_TABLE ||
		!writes_as_insert_would(table) || !OidIsValid(writer->id_sequence))
		return false;

	for (int g = 0; g < GIVEN_COLUMNS; g++)
		if ((writer->given[g] = get_attnum(writer->table, given_column_names[g])) == InvalidAttrNumber)
			return false;
	if ((writer->segment_column = get_attnum(writer->table, "segment")) == InvalidAttrNumber)
		return false;
	writer->target_partition_column = get_attnum(writer->table, "target_partition");
	writer->state_column = get_attnum(writer->table, "state");
	writer->next_attempt_at_column = get_attnum(writer->table, "next_attempt_at");
	writer->retrying_state = CStringGetTextDatum("retrying");

	writer->slot = MakeSingleTupleTableSlot(CreateTupleDescCopy(desc), &TTSOpsVirtual);
	writer->defaults = palloc0(sizeof(ExprState *) * desc->natts);
	for (int attnum = 1; attnum <= desc->natts; attnum++)
	{
		Node	   *expr;
		bool		given = false;

		if (TupleDescAttr(desc, attnum - 1)->attisdropped)
			continue;
		for (int g = 0; g < GIVEN_COLUMNS; g++)
			given |= writer->given[g] == attnum;
		if (!given && (expr = build_column_default(table, attnum)) != NULL)
			writer->defaults[attnum - 1] = ExecPrepareExpr((Expr *) expr, writer->estate);
	}

	for (int s = 0; s < OUTBOX_SEGMENTS; s++)
	{
		char	   *name = psprintf("outbox_message_%d", s);

		writer->segments[s].relid = get_relname_relid(name, writer->namespace);
		if (!OidIsValid(writer->segments[s].relid))
			return false;
	}
	return true;
}

/* The writer for the outbox of this namespace, built again if stale. */
static RowWriter *
current_writer(Oid namespace)
{
	static bool callback_registered = false;
	MemoryContext old;
	Relation	table;

	if (writer != NULL && writer->valid && writer->complete && writer->namespace == namespace)
		return writer;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_writer, (Datum) 0);
		callback_registered = true;
	}
	if (writer != NULL)
	{
		FreeExecutorState(writer->estate);
		MemoryContextDelete(writer->context);
		writer = NULL;
	}

	{
		MemoryContext context = AllocSetContextCreate(CacheMemoryContext, "outbox row writer",
													  ALLOCSET_SMALL_SIZES);

		old = MemoryContextSwitchTo(context);
		writer = palloc0(sizeof(RowWriter));
		writer->context = context;
	}
	writer->valid = true;
	writer->namespace = namespace;
	writer->table = get_relname_relid("outbox_message", namespace);
	writer->id_sequence = get_relname_relid("outbox_message_id_seq", namespace);
	writer->estate = CreateExecutorState();
	table = try_table_open(writer->table, RowExclusiveLock);
	writer->writable = table != NULL && build_table_part(table);
	if (table != NULL)
		table_close(table, NoLock);
	writer->complete = true;
	MemoryContextSwitchTo(old);
	return writer;
}

/*
 * The segment's part, built once it is first written, with the segment
 * open: its indexes and how its columns map from the table's.
 */
static void
build_segment_part(SegmentWriter *segment, Relation rel)
{
	MemoryContext old = MemoryContextSwitchTo(writer->context);

	if (rel->rd_rel->relispartition && writes_as_insert_would(rel))
	{
		ResultRelInfo *result_rel = makeNode(ResultRelInfo);

		InitResultRelInfo(result_rel, rel, 0, NULL, 0);
		ExecOpenIndices(result_rel, false);
		segment->index_oids = palloc(sizeof(Oid) * Max(result_rel->ri_NumIndices, 1));
		for (int i = 0; i < result_rel->ri_NumIndices; i++)
		{
			segment->index_oids[i] = RelationGetRelid(result_rel->ri_IndexRelationDescs[i]);
			index_close(result_rel->ri_IndexRelationDescs[i], NoLock);
		}
		result_rel->ri_RelationDesc = NULL;
		segment->from_table = build_attrmap_by_name_if_req(writer->slot->tts_tupleDescriptor,
														   RelationGetDescr(rel), false);
		if (segment->from_table)
			segment->slot = MakeSingleTupleTableSlot(CreateTupleDescCopy(RelationGetDescr(rel)),
													 &TTSOpsVirtual);
		segment->result_rel = result_rel;
		segment->writable = true;
	}
	/* last, so that an error above leaves it to be built again */
	segment->ready = true;
	MemoryContextSwitchTo(old);
}

/*
 * A message sent to a partition of its choice, or delayed: a delayed one
 * waits as a retry does (see store.c's claim), until its time comes.
 */
static void
set_delivery_columns(TupleTableSlot *slot, const NewMessage *message)
{
	if (message->target_partition != ANY_PARTITION)
	{
		slot->tts_values[writer->target_partition_column - 1] = Int32GetDatum(message->target_partition);
		slot->tts_isnull[writer->target_partition_column - 1] = false;
	}
	if (message->deliver_at != 0)
	{
		slot->tts_values[writer->state_column - 1] = writer->retrying_state;
		slot->tts_isnull[writer->state_column - 1] = false;
		slot->tts_values[writer->next_attempt_at_column - 1] = TimestampTzGetDatum(message->deliver_at);
		slot->tts_isnull[writer->next_attempt_at_column - 1] = false;
	}
}

/*
 * Fill the writer's slot with the row: the given columns, the defaults of
 * the others (evaluated in the writer's per-row memory), but not yet its id.
 * Returns its segment.
 */
static int
fill_row(const NewMessage *message)
{
	TupleTableSlot *slot = writer->slot;
	ExprContext *econtext = GetPerTupleExprContext(writer->estate);
	int			natts = slot->tts_tupleDescriptor->natts;
	int			segment;

	ExecClearTuple(slot);
	for (int i = 0; i < natts; i++)
	{
		slot->tts_isnull[i] = true;
		if (writer->defaults[i])
			slot->tts_values[i] = ExecEvalExprSwitchContext(writer->defaults[i], econtext,
															&slot->tts_isnull[i]);
	}
#define SET_GIVEN(g, value) \
	(slot->tts_values[writer->given[g] - 1] = PointerGetDatum(value), \
	 slot->tts_isnull[writer->given[g] - 1] = ((value) == NULL))
	SET_GIVEN(GIVEN_TOPIC, message->topic);
	SET_GIVEN(GIVEN_KEY, message->key);
	SET_GIVEN(GIVEN_PAYLOAD, message->payload);
	SET_GIVEN(GIVEN_HEADERS, message->headers);
#undef SET_GIVEN

	if (message->target_partition != ANY_PARTITION || message->deliver_at != 0)
	{
		if (writer->target_partition_column == InvalidAttrNumber)
			return -1;
		set_delivery_columns(slot, message);
	}

	if (slot->tts_isnull[writer->segment_column - 1])
		return -1;
	segment = DatumGetInt16(slot->tts_values[writer->segment_column - 1]);
	return (segment >= 0 && segment < OUTBOX_SEGMENTS) ? segment : -1;
}

/*
 * Insert the slot's row into the open segment, with its index entries.  An
 * error leaves the relations to the (sub)transaction's abort, which closes
 * them; the next call sets the pointers again.
 */
static void
insert_into_segment(SegmentWriter *segment, Relation rel)
{
	ResultRelInfo *result_rel = segment->result_rel;
	EState	   *estate = writer->estate;
	TupleTableSlot *slot = writer->slot;

	ExecStoreVirtualTuple(slot);
	if (segment->from_table)
		slot = execute_attr_map_slot(segment->from_table, slot, segment->slot);

	result_rel->ri_RelationDesc = rel;
	for (int i = 0; i < result_rel->ri_NumIndices; i++)
		result_rel->ri_IndexRelationDescs[i] = index_open(segment->index_oids[i], RowExclusiveLock);

	ExecConstraints(result_rel, slot, estate);
	table_tuple_insert(rel, slot, GetCurrentCommandId(true), 0, NULL);
	ExecInsertIndexTuples(result_rel, estate, 0, slot, NIL, NULL);

	for (int i = 0; i < result_rel->ri_NumIndices; i++)
		index_close(result_rel->ri_IndexRelationDescs[i], NoLock);
}

/*
 * Write the message into the outbox of this namespace, drawing its id
 * (returned in *id) once its key is locked, as the trigger does.  Returns
 * false, having written nothing, if the table is not one the writer
 * writes.
 */
bool
row_writer_insert(Oid namespace, const NewMessage *message, int64 *id)
{
	SegmentWriter *segment;
	Relation	rel;
	int			s;

	/* as the executor refuses an INSERT, on a standby too */
	PreventCommandIfReadOnly("INSERT");
	PreventCommandIfParallelMode("INSERT");

	for (;;)
	{
		if (!current_writer(namespace)->writable)
			return false;
		/* as an INSERT INTO outbox_message locks it; may take invalidations */
		LockRelationOid(writer->table, RowExclusiveLock);
		if (!writer->valid)
			continue;

		ResetPerTupleExprContext(writer->estate);
		if ((s = fill_row(message)) < 0)
			return false;
		segment = &writer->segments[s];
		rel = try_table_open(segment->relid, RowExclusiveLock);
		if (rel != NULL && writer->valid)
			break;
		if (rel != NULL)
			table_close(rel, NoLock);
	}

	if (!segment->ready)
		build_segment_part(segment, rel);
	if (!segment->writable)
	{
		table_close(rel, NoLock);
		return false;
	}

	*id = nextval_internal(writer->id_sequence, false);
	writer->slot->tts_values[writer->given[GIVEN_ID] - 1] = Int64GetDatum(*id);
	writer->slot->tts_isnull[writer->given[GIVEN_ID] - 1] = false;
	insert_into_segment(segment, rel);
	table_close(rel, NoLock);
	ExecClearTuple(writer->slot);
	ResetPerTupleExprContext(writer->estate);
	return true;
}

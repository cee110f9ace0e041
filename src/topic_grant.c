/*-------------------------------------------------------------------------
 *
 * topic_grant.c
 *	  Topic grants: which roles may publish to, and subscribe to, which
 *	  topics.  Owns the reading of the table outbox_topic_grant (a cache in
 *	  each backend), the checks made at every enqueue, at inbox_subscribe()
 *	  and before each inbox batch, and the functions that give and take
 *	  grants: outbox_grant_topic() and outbox_revoke_topic().
 *
 * A grant names a role, a topic pattern and a privilege, 'publish' or
 * 'subscribe'.  A pattern that ends in "*" is a prefix: it grants every
 * topic that begins with what comes before the "*" ("orders.*" grants
 * "orders.eu" but not "orders"; "*" alone grants every topic), as Kafka's
 * PREFIXED resource pattern does; any other pattern is one topic, as
 * Kafka's LITERAL.  A role may do what it was granted, or a role whose
 * privileges it has (has_privs_of_role(), as for any privilege); superusers
 * and the extension's owner may do everything.
 *
 * Every enqueue is checked, so the check reads no table: each backend keeps
 * the grants it read and, per role it checked, the ones that apply to it,
 * and forgets them all when the grant table changes (its statement trigger,
 * outbox_topic_grant_changed(), sends an invalidation of the table's
 * relcache entry, which every backend receives as it would a change of the
 * table's definition) or when roles or memberships change (syscache
 * callbacks).  Until the extension's schema has the table (a schema before
 * 0.8.0, until ALTER EXTENSION UPDATE), nothing is checked, as before.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "kafka_wire.h"
#include "statements.h"
#include "topic_grant.h"

#define GRANT_TABLE "outbox_topic_grant"

/* The grant table's columns, as the install script creates them. */
#define ANUM_GRANT_ROLE 1
#define ANUM_GRANT_PATTERN 2
#define ANUM_GRANT_PRIVILEGE 3

/* What ends a pattern that grants a prefix. */
#define PREFIX_MARK '*'

/* One row of the grant table. */
typedef struct TopicGrant
{
	Oid			role;
	char	   *prefix;			/* the pattern, without its PREFIX_MARK */
	int			prefix_len;
	bool		is_prefix;		/* else the pattern is one topic */
	TopicPrivilege privilege;
} TopicGrant;

/* The grants that apply to one role (a hash entry). */
typedef struct RoleGrants
{
	Oid			role;			/* the key */
	bool		may_do_all;		/* a superuser, or the extension's owner */
	int			count;
	TopicGrant **grants;
} RoleGrants;

/*
 * The cache.  Everything in it is in grant_context, reset when it is
 * loaded again; an invalidation only clears cache_valid, so that nothing in
 * use is freed under its user.
 */
static MemoryContext grant_context = NULL;
static bool cache_valid = false;
static bool callbacks_registered = false;
static Oid	grant_table = InvalidOid;	/* InvalidOid: none, nothing checked */
static Oid	extension_owner = InvalidOid;
static TopicGrant *all_grants = NULL;
static int	grant_count = 0;
static HTAB *role_grants = NULL;

PG_FUNCTION_INFO_V1(outbox_grant_topic);
PG_FUNCTION_INFO_V1(outbox_revoke_topic);
PG_FUNCTION_INFO_V1(outbox_topic_grant_changed);

static const char *
privilege_name(TopicPrivilege privilege)
{
	return privilege == TOPIC_PUBLISH ? "publish" : "subscribe";
}

/*
 * Invalidation.  Without the table, any relation's change may be the
 * extension's update creating it.
 */
static void
grant_relcache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || !OidIsValid(grant_table) || relid == grant_table)
		cache_valid = false;
}

static void
grant_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	cache_valid = false;
}

static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	grant_context = AllocSetContextCreate(CacheMemoryContext, "outbox topic grants",
										  ALLOCSET_SMALL_SIZES);
	CacheRegisterRelcacheCallback(grant_relcache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, grant_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, grant_syscache_callback, (Datum) 0);
	callbacks_registered = true;
}

/*
 * Loading.
 */

/* A row of the grant table, in grant_context. */
static void
read_grant(HeapTuple tuple, TupleDesc desc, TopicGrant *grant)
{
	bool		isnull;
	char	   *pattern;

	grant->role = DatumGetObjectId(heap_getattr(tuple, ANUM_GRANT_ROLE, desc, &isnull));
	pattern = TextDatumGetCString(heap_getattr(tuple, ANUM_GRANT_PATTERN, desc, &isnull));
	grant->prefix_len = strlen(pattern);
	grant->is_prefix = grant->prefix_len > 0 && pattern[grant->prefix_len - 1] == PREFIX_MARK;
	if (grant->is_prefix)
		pattern[--grant->prefix_len] = '\0';
	grant->prefix = pattern;
	grant->privilege = strcmp(TextDatumGetCString(heap_getattr(tuple, ANUM_GRANT_PRIVILEGE, desc,
																&isnull)),
							  "publish") == 0 ? TOPIC_PUBLISH : TOPIC_SUBSCRIBE;
}

/* Every row of the grant table, into all_grants. */
static void
read_grant_table(void)
{
	Relation	rel = table_open(grant_table, AccessShareLock);
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	HeapTuple	tuple;
	int			allocated = 16;
	MemoryContext old = MemoryContextSwitchTo(grant_context);

	all_grants = palloc(sizeof(TopicGrant) * allocated);
	while ((tuple = systable_getnext(scan)) != NULL)
	{
		if (grant_count == allocated)
		{
			allocated *= 2;
			all_grants = repalloc(all_grants, sizeof(TopicGrant) * allocated);
		}
		read_grant(tuple, RelationGetDescr(rel), &all_grants[grant_count++]);
	}
	MemoryContextSwitchTo(old);
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

/* Read the grants again, and forget what was worked out from them. */
static void
load_grants(void)
{
	HASHCTL		ctl;
	Oid			extension;
	Oid			namespace;

	register_callbacks();
	MemoryContextReset(grant_context);
	all_grants = NULL;
	grant_count = 0;
	role_grants = NULL;
	cache_valid = true;			/* an invalidation while loading clears it */
	namespace = extension_namespace(&extension, &extension_owner);
	grant_table = OidIsValid(namespace) ? get_relname_relid(GRANT_TABLE, namespace) : InvalidOid;
	if (OidIsValid(grant_table))
		read_grant_table();
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(RoleGrants);
	ctl.hcxt = grant_context;
	role_grants = hash_create("outbox topic grants by role", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/* The grants that apply to role, worked out once per load. */
static RoleGrants *
grants_of(Oid role)
{
	RoleGrants *entry;
	bool		found;
	TopicGrant **applying;
	int			count = 0;

	entry = hash_search(role_grants, &role, HASH_FIND, &found);
	if (found)
		return entry;
	applying = MemoryContextAlloc(grant_context, sizeof(TopicGrant *) * Max(grant_count, 1));
	for (int i = 0; i < grant_count; i++)
		if (all_grants[i].role == role || has_privs_of_role(role, all_grants[i].role))
			applying[count++] = &all_grants[i];
	entry = hash_search(role_grants, &role, HASH_ENTER, &found);
	entry->may_do_all = role == extension_owner || superuser_arg(role);
	entry->count = count;
	entry->grants = applying;
	return entry;
}

static bool
grant_covers(const TopicGrant *grant, const char *topic, int topic_len,
			 TopicPrivilege privilege)
{
	if (grant->privilege != privilege)
		return false;
	if (grant->is_prefix)
		return topic_len >= grant->prefix_len && memcmp(topic, grant->prefix, grant->prefix_len) == 0;
	return topic_len == grant->prefix_len && memcmp(topic, grant->prefix, topic_len) == 0;
}

/*
 * The checks.
 */

static bool
allows(Oid role, const char *topic, int topic_len, TopicPrivilege privilege)
{
	RoleGrants *grants;

	if (!cache_valid)
		load_grants();
	if (!OidIsValid(grant_table))
		return true;
	grants = grants_of(role);
	if (grants->may_do_all)
		return true;
	for (int i = 0; i < grants->count; i++)
		if (grant_covers(grants->grants[i], topic, topic_len, privilege))
			return true;
	return false;
}

/* May role publish to (or subscribe to) topic? */
bool
topic_grant_allows(Oid role, const char *topic, TopicPrivilege privilege)
{
	return allows(role, topic, strlen(topic), privilege);
}

/* Refuse role the privilege on the topic, saying who may grant it and how. */
static void
refuse(Oid role, const char *topic, int topic_len, TopicPrivilege privilege)
{
	const char *name = GetUserNameFromId(role, false);

	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("role \"%s\" may not %s to topic \"%.*s\"", name, privilege_name(privilege),
					topic_len, topic),
			 errhint("The extension's owner grants it: SELECT outbox_grant_topic(%s, '%.*s', '%s'); a pattern ending in * grants every topic with that prefix.",
					 quote_literal_cstr(quote_identifier(name)), topic_len, topic,
					 privilege_name(privilege))));
}

/*
 * Refuse to enqueue a message to topic (a valid topic name) unless the
 * current user may publish to it: the role that calls outbox_enqueue(),
 * inserts into outbox_message or into a captured table.
 */
void
topic_grant_check_publish(const text *topic)
{
	Oid			role = GetUserId();
	const char *s = VARDATA_ANY(topic);
	int			len = VARSIZE_ANY_EXHDR(topic);

	if (!allows(role, s, len, TOPIC_PUBLISH))
		refuse(role, s, len, TOPIC_PUBLISH);
}

/* Refuse unless role may subscribe to each topic (text[], no NULLs). */
void
topic_grant_check_subscribe(Oid role, ArrayType *topics)
{
	Datum	   *elems;
	int			count;

	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &count);
	for (int i = 0; i < count; i++)
	{
		text	   *topic = DatumGetTextPP(elems[i]);

		if (!allows(role, VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic), TOPIC_SUBSCRIBE))
			refuse(role, VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic), TOPIC_SUBSCRIBE);
	}
}

/*
 * Before each batch of an inbox subscription, in the batch's transaction:
 * an error, which leaves the batch unapplied and its messages to be read
 * again, unless the subscription's role may still subscribe to each of its
 * topics.  The error is what inbox_worker.last_error then says.
 */
void
topic_grant_check_subscription(const InboxSubscription *s)
{
	for (int i = 0; i < s->topic_count; i++)
		if (!topic_grant_allows(s->run_as, s->topics[i], TOPIC_SUBSCRIBE))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("subscription \"%s\" waits: its role \"%s\" may not subscribe to topic \"%s\"",
							s->name, GetUserNameFromId(s->run_as, false), s->topics[i]),
					 errhint("The extension's owner grants it with outbox_grant_topic(); nothing is lost meanwhile.")));
}

/*
 * Giving and taking grants.
 */

/* A pattern's text, checked: a topic name, or a prefix of one and "*". */
static text *
check_pattern(text *pattern)
{
	const char *s = VARDATA_ANY(pattern);
	int			len = VARSIZE_ANY_EXHDR(pattern);
	int			name_len = len > 0 && s[len - 1] == PREFIX_MARK ? len - 1 : len;

	if (len == 0 || len > KAFKA_MAX_TOPIC_LENGTH ||
		(name_len == len && ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%.*s\" is not a topic name nor a topic prefix", len, s),
				 errhint("Give a Kafka topic name (\"orders\"), or a prefix followed by * (\"orders.*\"; \"*\" alone is every topic).")));
	for (int i = 0; i < name_len; i++)
		if (!kafka_topic_char(s[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("\"%.*s\" is not a topic name nor a topic prefix", len, s),
					 errdetail("Character %d is not allowed.", i + 1),
					 errhint("Topic names may contain only ASCII letters, digits, \".\", \"_\" and \"-\"; a prefix is followed by one *, at the end.")));
	return pattern;
}

static text *
check_privilege(text *privilege)
{
	char	   *s = text_to_cstring(privilege);

	if (strcmp(s, "publish") != 0 && strcmp(s, "subscribe") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topic privilege must be 'publish' or 'subscribe', not \"%s\"", s)));
	return privilege;
}

/*
 * Run a statement on the grant table as the extension's owner, with the
 * role, the pattern, the privilege and the caller as parameters; returns
 * the rows it wrote or deleted.
 */
static uint64
write_grant(FunctionCallInfo fcinfo, const char *sql)
{
	Oid			types[4] = {OIDOID, TEXTOID, TEXTOID, OIDOID};
	Datum		values[4];
	Oid			extension;
	Oid			owner;
	Oid			namespace = extension_namespace(&extension, &owner);
	uint64		written;

	values[0] = PG_GETARG_DATUM(0);
	if (!SearchSysCacheExists1(AUTHOID, values[0]))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role with oid %u does not exist", DatumGetObjectId(values[0]))));
	values[1] = PointerGetDatum(check_pattern(PG_GETARG_TEXT_PP(1)));
	values[2] = PointerGetDatum(check_privilege(PG_GETARG_TEXT_PP(2)));
	values[3] = ObjectIdGetDatum(GetUserId());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	statement_run_as(owner, psprintf(sql, quote_identifier(get_namespace_name(namespace))),
					 4, types, values, NULL);
	written = SPI_processed;
	SPI_finish();
	return written;
}

/* Grant a role a privilege on a topic or prefix; returns whether it is new. */
Datum
outbox_grant_topic(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(write_grant(fcinfo,
							   "INSERT INTO %s.outbox_topic_grant (role, topic_pattern, privilege, granted_by)"
							   " VALUES ($1::pg_catalog.regrole, $2, $3, $4::pg_catalog.regrole)"
							   " ON CONFLICT DO NOTHING") > 0);
}

/* Take a grant back, as it was given; returns whether there was one. */
Datum
outbox_revoke_topic(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(write_grant(fcinfo,
							   "DELETE FROM %s.outbox_topic_grant"
							   " WHERE role::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
							   " AND topic_pattern OPERATOR(pg_catalog.=) $2"
							   " AND privilege OPERATOR(pg_catalog.=) $3") > 0);
}

/*
 * AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT on the
 * grant table, however it is written: every backend forgets the grants it
 * read, at this transaction's commit (this backend at its next command).
 */
Datum
outbox_topic_grant_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "outbox_topic_grant_changed() must be called as a trigger");
	CacheInvalidateRelcache(((TriggerData *) fcinfo->context)->tg_relation);
	return PointerGetDatum(NULL);
}

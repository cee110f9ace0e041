/*-------------------------------------------------------------------------
 *
 * inbox_rights.c
 *	  What a subscription needs to run, checked when subscribing
 *	  (inbox_sql.c) and again before each batch and each round of retries
 *	  (inbox_apply.c): its handler is still the function it was bound to,
 *	  and takes one inbox_message; its run_as role exists, is no superuser,
 *	  may execute the handler and use the handler's schema, as an ordinary
 *	  call would need; and the role that subscribed is still a member of
 *	  run_as.
 *
 * The worker calls the handler by its oid, which a direct call does with
 * no privilege check at all: every check a call by name from run_as would
 * make is made here instead.  A subscription that fails one waits (nothing
 * of its messages is applied, recorded or given up on) and the reason,
 * in words, is what the worker reports.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "inbox.h"
#include "pg_compat.h"
#include "statements.h"

/* The name of the type a handler takes, in the extension's schema. */
#define INBOX_MESSAGE_TYPE "inbox_message"

/* Is the type the extension's inbox_message? */
static bool
is_inbox_message(Oid type)
{
	Oid			extension;
	Oid			schema = extension_namespace(&extension, NULL);

	return OidIsValid(schema) &&
		type == GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								CStringGetDatum(INBOX_MESSAGE_TYPE),
								ObjectIdGetDatum(schema));
}

static char *
role_name(Oid role)
{
	char	   *name = GetUserNameFromId(role, true);

	return name ? psprintf("\"%s\"", name) : psprintf("(oid %u, dropped)", role);
}

/*
 * May the function serve as an inbox handler for run_as?  It exists, is a
 * plain function of one inbox_message (not a procedure, not a set), and
 * run_as may use its schema and execute it.  What it returns is ignored.
 * If it may not, *why says what is missing, in words.
 */
HandlerFault
handler_fault(Oid handler, Oid run_as, char **why)
{
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	Form_pg_proc proc;
	bool		fits;
	Oid			schema;

	*why = NULL;
	if (!HeapTupleIsValid(tuple))
	{
		*why = psprintf("inbox handler function %u does not exist", handler);
		return HANDLER_MISSING;
	}
	proc = (Form_pg_proc) GETSTRUCT(tuple);
	fits = proc->prokind == PROKIND_FUNCTION && !proc->proretset &&
		proc->pronargs == 1 && is_inbox_message(proc->proargtypes.values[0]);
	schema = proc->pronamespace;
	ReleaseSysCache(tuple);
	if (!fits)
		*why = psprintf("inbox handler %s does not take one inbox_message",
						format_procedure(handler));
	else if (object_aclcheck(NamespaceRelationId, schema, run_as, ACL_USAGE) != ACLCHECK_OK)
		*why = psprintf("role %s has no USAGE on schema \"%s\" of inbox handler %s",
						role_name(run_as), get_namespace_name(schema),
						format_procedure(handler));
	else if (object_aclcheck(ProcedureRelationId, handler, run_as, ACL_EXECUTE) != ACLCHECK_OK)
		*why = psprintf("role %s may not execute inbox handler %s",
						role_name(run_as), format_procedure(handler));
	if (*why == NULL)
		return HANDLER_FITS;
	return fits ? HANDLER_NOT_PERMITTED : HANDLER_NOT_A_HANDLER;
}

/*
 * Is the subscription's handler still the function it was bound to?  The
 * oid must name a function whose signature is still the one recorded: a
 * function dropped leaves its oid unused, and one made again under its
 * name has another; a signature that differs means a renamed function, or
 * an oid that came from another database's (a restore with its triggers
 * off, pg_upgrade) and may name anything.
 */
static char *
handler_gone_reason(const InboxSubscription *s)
{
	char	   *signature;

	if (!OidIsValid(s->handler_oid) ||
		!SearchSysCacheExists1(PROCOID, ObjectIdGetDatum(s->handler_oid)))
		return psprintf("its handler %s was dropped (a function made since under its name "
						"is not called: unsubscribe, and subscribe again to use one)",
						s->handler);
	signature = format_procedure_qualified(s->handler_oid);
	if (strcmp(signature, s->handler) != 0)
		return psprintf("its handler %s (oid %u) is now %s, not the function it was bound to",
						s->handler, s->handler_oid, signature);
	return NULL;
}

/* Why the subscription's roles may not run it, or NULL. */
static char *
roles_unfit_reason(const InboxSubscription *s)
{
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(s->run_as)))
		return psprintf("its role (oid %u) was dropped", s->run_as);
	if (superuser_arg(s->run_as))
		return psprintf("its role %s is a superuser, which a handler never runs as",
						role_name(s->run_as));
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(s->subscribed_by)))
		return psprintf("the role that subscribed it (oid %u) was dropped", s->subscribed_by);
	if (!has_privs_of_role(s->subscribed_by, s->run_as))
		return psprintf("role %s, who subscribed, is no longer a member of role %s",
						role_name(s->subscribed_by), role_name(s->run_as));
	return NULL;
}

/*
 * May the subscription run now?  If not, *why says why, in words.  Called
 * in a transaction, before each batch and each round of retries, so that a
 * right revoked, a role dropped or a handler dropped stops the next batch.
 */
bool
subscription_may_run(const InboxSubscription *s, char **why)
{
	*why = roles_unfit_reason(s);
	if (*why == NULL)
		*why = handler_gone_reason(s);
	if (*why == NULL)
		(void) handler_fault(s->handler_oid, s->run_as, why);
	return *why == NULL;
}

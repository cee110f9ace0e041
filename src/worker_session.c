/*-------------------------------------------------------------------------
 *
 * worker_session.c
 *	  The settings of a worker's own session that no database or role
 *	  setting may change: who the worker is, and how its transactions run.
 *
 * A background worker that connects to a database takes that database's
 * settings (ALTER DATABASE ... SET) and its role's there (ALTER ROLE ...
 * IN DATABASE ... SET), as a client session does.  A database's owner may
 * set most of them.  The publisher, the inbox worker and the launcher's
 * probe run as the bootstrap superuser, with statements written for a
 * session as initdb makes it: role = 'dbowner' would make every statement
 * of theirs run as that role (which may not read the outbox: the worker
 * fails and is started again, once a second), default_transaction_read_only
 * would make every write fail, a serializable default would fail batches
 * on conflicts no retry is written for, a lock_timeout would fail the
 * claims, session_replication_role = replica would keep triggers from
 * firing in the inbox's handlers.  So each of them, once connected, puts
 * these back to their defaults, as overrides: a later SET in the session
 * (a handler's, for the transaction) still applies, and RESET or DISCARD
 * ALL come back to the override, not to the database's value.
 *
 * statement_timeout is not among them: a background worker's statements
 * are not timed (postgres.c arms the timeout for a client's statements
 * only), and the inbox times each handler call by it, the database's
 * value included, as its documentation says.  search_path is pinned by
 * each worker itself, as each needs.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "worker_session.h"

/* The settings put back, and the value each is put back to. */
static const struct
{
	const char *name;
	const char *value;
}			pinned_settings[] = {
	{"role", "none"},
	{"default_transaction_read_only", "off"},
	{"default_transaction_isolation", "read committed"},
	{"default_transaction_deferrable", "off"},
	{"session_replication_role", "origin"},
	{"lock_timeout", "0"},
	{"idle_in_transaction_session_timeout", "0"},
	{"idle_session_timeout", "0"},
};

/*
 * Once connected, outside a transaction: the session is the authenticated
 * user's (the bootstrap superuser's) again, under no other role, and the
 * settings above are their defaults.  session_authorization is put back
 * only if a setting changed it (its check reads the catalog, in a
 * transaction).
 */
void
worker_pin_session_settings(void)
{
	if (GetSessionUserId() != GetAuthenticatedUserId())
	{
		StartTransactionCommand();
		SetConfigOption("session_authorization",
						GetUserNameFromId(GetAuthenticatedUserId(), false),
						PGC_SUSET, PGC_S_OVERRIDE);
		CommitTransactionCommand();
	}
	for (int i = 0; i < (int) lengthof(pinned_settings); i++)
		SetConfigOption(pinned_settings[i].name, pinned_settings[i].value,
						PGC_SUSET, PGC_S_OVERRIDE);
}

/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  The outbox's settings (GUCs), and the one reader of
 *	  outbox.kafka_properties.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SETTINGS_H
#define OUTBOX_SETTINGS_H

#include "nodes/pg_list.h"

extern char *outbox_brokers;
extern char *outbox_databases;
extern char *outbox_database;
extern char *outbox_kafka_properties;
extern char *outbox_synchronized_standby_slots;
extern int	outbox_batch_size;
extern int	outbox_max_batch_kb;
extern int	outbox_retry_backoff_base;
extern int	outbox_retry_backoff_max;
extern int	outbox_max_attempts;
extern int	outbox_poll_interval;
extern int	outbox_claim_snapshot_delay;
extern int	outbox_max_wake_delay;
extern int	outbox_max_record_size;
extern int	outbox_sent_retention;
extern int	outbox_max_workers;
extern int	outbox_inbox_batch_size;
extern int	outbox_inbox_dedup_retention;
extern int	outbox_max_delay;
extern int	outbox_max_subscriptions;
extern int	outbox_inbox_handler_timeout;
extern int	outbox_inbox_turn_time;

/* outbox.delivery */
typedef enum OutboxDelivery
{
	OUTBOX_DELIVERY_AT_LEAST_ONCE,
	OUTBOX_DELIVERY_EXACTLY_ONCE
} OutboxDelivery;

extern int	outbox_delivery;
extern char *outbox_progress_topic;

/* One name=value item of outbox.kafka_properties. */
typedef struct KafkaProperty
{
	char	   *name;
	char	   *value;
} KafkaProperty;

extern void settings_init(void);
extern bool kafka_properties_split(const char *setting, List **properties);
extern bool settings_kafka_property_set(List *properties, const char *name);
extern char *settings_scrub_secrets(const char *text, const char *kafka_properties);
extern bool settings_database_allowed(const char *name);
extern bool settings_database_list_deprecated(void);
extern List *settings_standby_slot_names(void);
extern bool settings_reload_if_asked(void);
extern int64 retry_backoff_ms(int attempts);

#endif							/* OUTBOX_SETTINGS_H */

-- Push notifications due (a transactional outbox): each row is written in
-- the transaction that commits the task change it reports, so a crash
-- between the commit and the POST loses nothing; delivery removes it once
-- the webhook took it or it was given up. `seq` is the commit order.
CREATE TABLE push_outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      BLOB    NOT NULL,
    task_id     BLOB    NOT NULL,
    config_id   BLOB    NOT NULL,
    event       BLOB    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    not_before  INTEGER NOT NULL DEFAULT 0
);
-- Each queue's oldest entry (delivery keeps one queue's order and lets
-- no queue hold up another).
CREATE INDEX push_outbox_by_queue ON push_outbox (tenant, task_id, config_id, seq);

-- The events each task write committed (encoded StreamResponses, each
-- length-delimited), by the version the write made: what a replica's
-- subscribers of a task running on another replica are sent, in order,
-- caught up by version. Kept for a while (EVENT_LOG_RETAIN), not forever:
-- a subscriber further behind is sent a fresh snapshot instead.
CREATE TABLE task_events (
    tenant    BYTEA       NOT NULL,
    task_id   BYTEA       NOT NULL,
    version   BIGINT      NOT NULL,
    events    BYTEA       NOT NULL,
    at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, task_id, version)
);
CREATE INDEX task_events_by_time ON task_events (at);

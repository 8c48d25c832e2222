-- Records set aside because they no longer decode, found when recovery
-- reads the active tasks: moved here, out of `tasks`, so that recovery,
-- listing and retention go on without them; GetTask of one answers
-- INTERNAL naming the reason. Kept for an operator to inspect or restore.
CREATE TABLE quarantine (
    tenant  BYTEA       NOT NULL,
    id      BYTEA       NOT NULL,
    record  BYTEA       NOT NULL,
    reason  TEXT        NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);

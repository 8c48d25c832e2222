-- Records set aside at start because they no longer decode: moved here,
-- out of `tasks`, so that recovery, listing and retention go on without
-- them; GetTask of one answers INTERNAL naming the reason. Kept for an
-- operator to inspect or restore.
CREATE TABLE quarantine (
    tenant BLOB    NOT NULL,
    id     BLOB    NOT NULL,
    record BLOB    NOT NULL,
    reason TEXT    NOT NULL,
    at     INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;

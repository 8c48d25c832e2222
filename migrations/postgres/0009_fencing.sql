-- Fencing (issue "replicas under real faults").
--
-- What a replica holds (idempotency claims, run claims, the push delivery
-- role) is taken over only once the replica is declared dead (`dead`),
-- never by its lease's expiry alone, and a dead replica's lease is never
-- renewed: it rejoins under a new id. A replica's writes check, in their
-- own transaction and before writing, that it is not dead, holding a
-- shared advisory lock on its id to their commit (`a2a_fence`); declaring
-- it dead takes that lock exclusively (`a2a_reap`). So a write made under
-- a replica's lease either commits before the replica is declared dead or
-- is refused, however long the replica was paused or cut off, and what is
-- taken over from a dead replica can never be written by it again.
ALTER TABLE replicas ADD COLUMN dead BOOLEAN NOT NULL DEFAULT false;

-- The push delivery role's epoch: one more each time the role changes
-- hands. Finishing or deferring an outbox entry names the epoch it was
-- read under.
ALTER TABLE a2a_jobs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;

-- The advisory lock key of a replica id (its first four bytes; ids are
-- random): a lock in the two-key space, class 2602, apart from the
-- one-key locks of migrations and the outbox.
CREATE FUNCTION a2a_replica_key(replica BYTEA) RETURNS INTEGER
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT ('x' || encode(substring(replica || '\x00000000'::bytea from 1 for 4), 'hex'))::bit(32)::integer
$$;

-- Refuses (SQLSTATE A2A01) unless `replica` is alive, and keeps it from
-- being declared dead until this transaction ends. The lock is taken by
-- one statement and the row read by the next, so the read sees a
-- declaration that committed while this waited for the lock.
CREATE FUNCTION a2a_fence(replica BYTEA) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(2602, a2a_replica_key(replica));
    PERFORM 1 FROM replicas WHERE id = replica AND NOT dead;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this replica (%) was declared dead after its lease ran out; it rejoins under a new id',
            encode(replica, 'hex') USING ERRCODE = 'A2A01';
    END IF;
    RETURN true;
END
$$;

-- Declares dead the replicas whose lease ran out and that have no write
-- transaction open; returns how many. A replica with one open is left for
-- a later call.
CREATE FUNCTION a2a_reap() RETURNS INTEGER
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n INTEGER;
BEGIN
    UPDATE replicas SET dead = true
    WHERE CASE WHEN NOT dead AND lease_until < now()
               THEN pg_try_advisory_xact_lock(2602, a2a_replica_key(id))
               ELSE false END;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

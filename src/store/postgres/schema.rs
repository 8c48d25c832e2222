//! The schema: migrations embedded in the binary, applied at open under
//! an advisory lock so that replicas starting together do not race.

use deadpool_postgres::Pool;

use super::unavailable;
use crate::store::StoreError;

/// The advisory lock migrations are applied under (an arbitrary number
/// of this project's).
const MIGRATION_LOCK: i64 = 0x0a2a_11fe_c7c1_e001;

/// The schema, in order; each applied once, recorded in
/// `a2a_schema_migrations`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_tasks.sql"),
    include_str!("../../../migrations/postgres/0002_replicas.sql"),
    include_str!("../../../migrations/postgres/0003_task_events.sql"),
    include_str!("../../../migrations/postgres/0004_job_holders.sql"),
    include_str!("../../../migrations/postgres/0005_task_watchers.sql"),
    include_str!("../../../migrations/postgres/0006_quarantine.sql"),
    include_str!("../../../migrations/postgres/0007_run_claims.sql"),
    include_str!("../../../migrations/postgres/0008_open_tasks_by_owner.sql"),
    include_str!("../../../migrations/postgres/0009_fencing.sql"),
    include_str!("../../../migrations/postgres/0010_owed_runs.sql"),
    include_str!("../../../migrations/postgres/0011_task_changes.sql"),
    include_str!("../../../migrations/postgres/0012_whole_version.sql"),
];

/// Applies the migrations not yet applied, under an advisory lock held
/// by this session for the duration; refuses a database migrated past
/// this release's last migration.
pub(super) async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(unavailable)?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(unavailable)?;
    let result = async {
        // Looked for first: `CREATE TABLE IF NOT EXISTS` on a table that
        // exists sends a NOTICE, which the driver logs at INFO on every
        // start. The advisory lock keeps another replica from creating
        // it in between.
        let exists: bool = client
            .query_one(
                "SELECT to_regclass('a2a_schema_migrations') IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        if !exists {
            client
                .batch_execute("CREATE TABLE a2a_schema_migrations (version INTEGER PRIMARY KEY)")
                .await?;
        }
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM a2a_schema_migrations",
                &[],
            )
            .await?;
        let applied: i32 = row.get(0);
        if applied as usize > MIGRATIONS.len() {
            return Ok(Some(applied));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
            let tx = client.transaction().await?;
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO a2a_schema_migrations (version) VALUES ($1)",
                &[&(i as i32 + 1)],
            )
            .await?;
            tx.commit().await?;
        }
        Ok::<_, tokio_postgres::Error>(None)
    }
    .await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let newer = result.map_err(|e| StoreError::Internal(format!("migrating the schema: {e}")))?;
    unlocked.map_err(unavailable)?;
    if let Some(applied) = newer {
        // A replica of an older release must not serve a database a newer
        // one migrated: it would not read what the newer one writes (a
        // long task's changes, migrations 0011 and 0012, would be missed
        // or replayed twice). See docs/replicas.md, "Upgrading".
        return Err(StoreError::Internal(format!(
            "the database's schema is at version {applied}, newer than this release's {}: \
             a replica of a newer release migrated it; run that release (docs/replicas.md, \
             \"Upgrading\")",
            MIGRATIONS.len()
        )));
    }
    Ok(())
}

//! Answers for the writes a batch did not settle: why the database
//! refused a write that changed no row, and whether a write whose answer
//! was lost with its connection committed (read back, never guessed).

use std::time::Duration;

use deadpool_postgres::Pool;

use super::super::{text, unavailable};
use super::{BatchFailure, Context, QueuedWrite, WriteKind};
use crate::store::StoreError;

/// Read-backs of a write whose outcome is unknown, and the wait before the
/// first (doubled each time).
const READ_BACKS: u32 = 4;
const READ_BACK_FIRST_WAIT: Duration = Duration::from_millis(200);

/// Whether `write`, sent in a transaction whose answer was lost (`lost`),
/// committed: read back until the database answers (at most
/// [`READ_BACKS`] times). Committed when the row holds what the write
/// wrote (a task at the version it made with its record, a claim held by
/// this replica); not committed when the row is as it was before. Either
/// way, the answer is what a write answered with that outcome.
pub(super) async fn read_back(
    cx: &Context,
    write: &QueuedWrite,
    lost: &BatchFailure,
) -> Result<u64, StoreError> {
    let mut wait = READ_BACK_FIRST_WAIT;
    let mut last = String::new();
    for _ in 0..READ_BACKS {
        tokio::time::sleep(wait).await;
        wait *= 2;
        match read_back_once(cx, write).await {
            Ok(Some(answer)) => return answer,
            Ok(None) => {
                return Err(StoreError::Unavailable(format!(
                    "the write did not commit: {lost}"
                )));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(StoreError::Unavailable(format!(
        "whether the write committed is unknown: {lost}; reading it back failed: {last}"
    )))
}

/// One read-back: `Some(answer)` when the write committed (or another
/// write's outcome decides the answer), `None` when it did not commit.
async fn read_back_once(
    cx: &Context,
    write: &QueuedWrite,
) -> Result<Option<Result<u64, StoreError>>, StoreError> {
    let client = tokio::time::timeout(READ_BACK_FIRST_WAIT * 10, cx.pool.get())
        .await
        .map_err(|_| StoreError::Unavailable("no PostgreSQL connection".into()))?
        .map_err(unavailable)?;
    let tenant = write.tenant.as_bytes();
    match &write.kind {
        WriteKind::Claim(origin) => {
            let row = client
                .query_opt(
                    "SELECT replica FROM origin_claims WHERE tenant = $1 AND origin = $2",
                    &[&tenant, origin],
                )
                .await
                .map_err(unavailable)?;
            let me = cx.standing.id();
            Ok(row.map(|r| Ok(u64::from(r.get::<_, Vec<u8>>(0) == *me))))
        }
        WriteKind::Create(task) | WriteKind::Update(task, _) => {
            let expected = match &write.kind {
                WriteKind::Update(_, expected) => *expected,
                _ => 0,
            };
            // What the write would have left: the record, or its changes at
            // the version it made.
            let row = client
                .query_opt(
                    "SELECT version, CASE WHEN $3 THEN record ELSE \
                     (SELECT changes FROM task_changes c WHERE c.tenant = $1 AND c.task_id = $2 \
                     AND c.version = $4) END FROM tasks WHERE tenant = $1 AND id = $2",
                    &[
                        &tenant,
                        &task.id.as_bytes(),
                        &matches!(task.body, crate::store::Body::Whole(_)),
                        &(expected as i64 + 1),
                    ],
                )
                .await
                .map_err(unavailable)?;
            Ok(match row {
                None if expected == 0 => None,
                None => Some(Err(StoreError::NotFound(task.id.clone()))),
                Some(r) => {
                    let version = r.get::<_, i64>(0) as u64;
                    let stored: Option<&[u8]> = r.get(1);
                    if version == expected + 1 && stored == Some(&**task.body.bytes()) {
                        Some(Ok(version))
                    } else if version == expected {
                        None
                    } else {
                        // Written since by someone: as a refused write.
                        Some(Err(if expected == 0 {
                            StoreError::AlreadyExists(task.id.clone())
                        } else {
                            StoreError::Conflict {
                                id: task.id.clone(),
                                expected,
                                actual: version,
                            }
                        }))
                    }
                }
            })
        }
    }
}

/// Why the database refused a write that changed no row.
pub(super) async fn why_refused(pool: &Pool, write: &QueuedWrite) -> Result<u64, StoreError> {
    let (task, expected) = match &write.kind {
        // Taken: the caller looks at who holds it.
        WriteKind::Claim(_) => return Ok(0),
        WriteKind::Create(task) => (task, None),
        WriteKind::Update(task, expected) => (task, Some(*expected)),
    };
    let client = pool.get().await.map_err(unavailable)?;
    let (tenant, id) = (write.tenant.as_bytes(), task.id.as_bytes());
    let Some(expected) = expected else {
        // Which key was taken: the id, or the creating message's.
        let same_id = client
            .query_opt(
                "SELECT 1 FROM tasks WHERE tenant = $1 AND id = $2",
                &[&tenant, &id],
            )
            .await
            .map_err(unavailable)?;
        if same_id.is_some() {
            return Err(StoreError::AlreadyExists(task.id.clone()));
        }
        let by_origin = client
            .query_opt(
                "SELECT id FROM tasks WHERE tenant = $1 AND origin = $2 AND origin <> ''::bytea",
                &[&tenant, &task.origin],
            )
            .await
            .map_err(unavailable)?;
        return match by_origin {
            Some(row) => Err(StoreError::DuplicateMessage {
                task_id: text(row.get(0))?,
            }),
            // Gone again between the insert and the look: a retry settles
            // it.
            None => Err(StoreError::Unavailable(
                "a conflicting task came and went; try again".into(),
            )),
        };
    };
    let actual = client
        .query_opt(
            "SELECT version FROM tasks WHERE tenant = $1 AND id = $2",
            &[&tenant, &id],
        )
        .await
        .map_err(unavailable)?;
    Err(match actual {
        None => StoreError::NotFound(task.id.clone()),
        Some(r) => StoreError::Conflict {
            id: task.id.clone(),
            expected,
            actual: r.get::<_, i64>(0) as u64,
        },
    })
}

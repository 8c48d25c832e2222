//! ListTasks pages (spec §3.1.4): `page_size`, and cursors that neither skip
//! nor repeat a task while tasks are created or updated between pages.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use a2a_lifecycle::proto::TaskState;
use a2a_lifecycle::store::ListQuery;

use super::Store;
use super::helpers::{
    T, assert_each_seen_once, assert_no_repeats, at, counts, create, expect_ids, ids, list,
    list_ids, must_get, query, record, set_status, via_token, walk_pages,
};

/// Spec §3.1.4 `page_size`: no page holds more; a page is full while more
/// follow; `next` is absent on the last page, even when the matches divide
/// evenly into pages (no empty trailing page).
pub async fn page_size_is_respected_and_last_page_has_no_next(store: Store) {
    for i in 0..7 {
        create(
            &store,
            T,
            &record(&format!("t{i}"), "c", TaskState::Working, at(i)),
        )
        .await;
    }
    let sizes = |pages: &[Vec<String>]| pages.iter().map(Vec::len).collect::<Vec<_>>();
    let q = |n| ListQuery {
        page_size: n,
        ..query()
    };
    assert_eq!(sizes(&walk_pages(&store, T, q(3)).await), [3, 3, 1]);
    assert_eq!(sizes(&walk_pages(&store, T, q(7)).await), [7]);
    assert_eq!(sizes(&walk_pages(&store, T, q(8)).await), [7]);
    assert_eq!(sizes(&walk_pages(&store, T, q(1)).await), [1; 7]);

    create(&store, T, &record("t7", "c", TaskState::Working, at(7))).await;
    create(&store, T, &record("t8", "c", TaskState::Working, at(8))).await;
    let pages = walk_pages(&store, T, q(3)).await;
    assert_eq!(
        sizes(&pages),
        [3, 3, 3],
        "9 tasks in pages of 3: no 4th page"
    );
    assert_eq!(
        pages,
        [
            expect_ids(&["t8", "t7", "t6"]),
            expect_ids(&["t5", "t4", "t3"]),
            expect_ids(&["t2", "t1", "t0"])
        ]
    );
    // The first page of a walk says there is more.
    let first = list(&store, T, &q(3)).await;
    assert!(first.next.is_some());
    assert_eq!(first.total_size, 9);
}

/// A page stops at the byte budget (`store::MAX_PAGE_BYTES`) whatever its
/// `page_size`, with a cursor for the rest: big tasks come a few per page,
/// and the walk still visits each once. A task bigger than the budget
/// alone still makes a page of one.
pub async fn a_page_stops_at_its_byte_budget(store: Store) {
    use a2a_lifecycle::store::MAX_PAGE_BYTES;
    // Each a bit over a third of the budget: two fit, three do not.
    let big = |id: &str, i: i64| {
        let mut r = record(id, "c", TaskState::Working, at(i));
        r.task.metadata = None;
        r.task.history[0].parts[0] =
            super::helpers::text_part(&"x".repeat(MAX_PAGE_BYTES / 3 + 1000));
        r
    };
    for i in 0..5 {
        create(&store, T, &big(&format!("t{i}"), i)).await;
    }
    let q = ListQuery {
        page_size: 100,
        ..query()
    };
    let first = list(&store, T, &q).await;
    assert_eq!(ids(&first.tasks), ["t4", "t3"]);
    assert!(first.next.is_some(), "a next page follows the budget's end");
    assert_eq!(first.total_size, 5);
    let sizes: Vec<usize> = walk_pages(&store, T, q)
        .await
        .iter()
        .map(Vec::len)
        .collect();
    assert_eq!(sizes, [2, 2, 1]);
}

/// Walking pages with cursors visits every matching task exactly once, in
/// list order, also when ties on the timestamp straddle page boundaries and
/// filters skip tasks.
pub async fn walking_pages_visits_every_matching_task_exactly_once(store: Store) {
    let mut all = Vec::new();
    for i in 0..40i64 {
        // Groups of 5 share a timestamp, so cursors land inside ties.
        let id = format!("t{:02}", (i * 17) % 40);
        let ctx = if i % 4 == 3 { "other" } else { "main" };
        create(&store, T, &record(&id, ctx, TaskState::Working, at(i / 5))).await;
        all.push((id, ctx, i / 5));
    }
    for page_size in [1, 2, 3, 4, 5, 6, 7, 39, 40, 41] {
        for ctx in [None, Some("main")] {
            let q = ListQuery {
                context_id: ctx.map(str::to_owned),
                page_size,
                ..query()
            };
            let walked = walk_pages(&store, T, q.clone()).await.concat();
            let mut want: Vec<_> = all
                .iter()
                .filter(|(_, c, _)| ctx.is_none_or(|w| w == *c))
                .collect();
            want.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
            let want: Vec<String> = want.into_iter().map(|(id, _, _)| id.clone()).collect();
            assert_eq!(walked, want, "page_size {page_size}, context {ctx:?}");
            assert_eq!(
                walked,
                list_ids(
                    &store,
                    T,
                    &ListQuery {
                        page_size: 100,
                        ..q
                    }
                )
                .await,
                "pages concatenate to the one-page list"
            );
        }
    }
}

/// Spec §3.1.4 with cursors: tasks created between pages (newer status
/// timestamps) make the remaining pages neither skip nor repeat any task that
/// existed when the walk began.
pub async fn tasks_created_between_pages_neither_skip_nor_repeat_originals(store: Store) {
    let mut originals = Vec::new();
    for i in 0..20i64 {
        let id = format!("orig-{i:02}");
        // Pairs share a timestamp.
        create(
            &store,
            T,
            &record(&id, "c", TaskState::Working, at(100 + i / 2)),
        )
        .await;
        originals.push(id);
    }
    let mut q = ListQuery {
        page_size: 3,
        ..query()
    };
    let mut seen = Vec::new();
    let mut totals = Vec::new();
    let mut created = 0;
    loop {
        let page = list(&store, T, &q).await;
        assert!(page.tasks.len() <= 3);
        totals.push(page.total_size);
        seen.extend(ids(&page.tasks));
        let Some(c) = page.next else { break };
        q.cursor = Some(via_token(&c));
        // Newer tasks, one of them with an id that sorts before every
        // original, as an offset-based pager would then repeat a task.
        for id in [format!("aaa-{created}"), format!("zzz-{created}")] {
            create(
                &store,
                T,
                &record(&id, "c", TaskState::Working, at(1_000 + created)),
            )
            .await;
        }
        created += 1;
    }
    let seen = counts(seen);
    assert_each_seen_once(&seen, originals.iter());
    assert_no_repeats(&seen);
    assert!(
        totals.windows(2).all(|w| w[0] < w[1]),
        "total_size counts the new tasks too: {totals:?}"
    );
}

/// A cursor names a position, not a live task: if the last task of a page
/// is updated (moved to the front, or out of the filter) before the next
/// page is read, the next page still starts right after where it was.
pub async fn cursor_survives_an_update_of_its_own_task(store: Store) {
    let mut rs = Vec::new();
    for i in 0..10 {
        let r = record(&format!("t{i}"), "c", TaskState::Working, at(100 - i));
        create(&store, T, &r).await;
        rs.push(r);
    }
    let q = ListQuery {
        state: Some(TaskState::Working),
        page_size: 3,
        ..query()
    };
    let first = list(&store, T, &q).await;
    assert_eq!(ids(&first.tasks), ["t0", "t1", "t2"]);
    let cursor = first.next.expect("more pages");

    // The cursor's task moves to the front.
    set_status(&mut rs[2], TaskState::Working, at(500));
    assert_eq!(store.update(T, &rs[2], 1).await, Ok(2));
    let second = list(
        &store,
        T,
        &ListQuery {
            cursor: Some(via_token(&cursor)),
            ..q.clone()
        },
    )
    .await;
    assert_eq!(ids(&second.tasks), ["t3", "t4", "t5"]);
    let cursor = second.next.expect("more pages");

    // The cursor's task leaves the filter.
    set_status(&mut rs[5], TaskState::Completed, at(95));
    assert_eq!(store.update(T, &rs[5], 1).await, Ok(2));
    let rest = walk_pages(
        &store,
        T,
        ListQuery {
            cursor: Some(via_token(&cursor)),
            ..q
        },
    )
    .await;
    assert_eq!(rest.concat(), ["t6", "t7", "t8", "t9"]);
}

/// Spec §3.1.4 with cursors under concurrency: while one task walks the
/// pages, several others create tasks (newer, interleaved with and tied to
/// the existing timestamps). Every task that existed before the walk began
/// is seen exactly once, and no task is seen twice.
pub async fn concurrent_inserts_during_walk_neither_skip_nor_repeat_originals(store: Store) {
    const ORIGINALS: i64 = 60;
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 30;
    const PAGE: usize = 4;
    let mut originals = Vec::new();
    for i in 0..ORIGINALS {
        let id = format!("orig-{i:03}");
        create(&store, T, &record(&id, "c", TaskState::Working, at(i * 10))).await;
        originals.push(id);
    }

    let created = Arc::new(AtomicUsize::new(0));
    let (pages_tx, pages_rx) = tokio::sync::watch::channel(0usize);
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let store = store.clone();
        let created = created.clone();
        let mut pages_rx = pages_rx.clone();
        writers.spawn(async move {
            for k in 0..PER_WRITER {
                // Stay at most a couple of creations per page ahead of the
                // walker so the writes spread over the whole walk.
                let _ = pages_rx.wait_for(|p| *p >= k / 2).await;
                let n = (w * PER_WRITER + k) as i64;
                let when = match k % 3 {
                    0 => at(100_000 + n),              // newer than all
                    1 => at((n % ORIGINALS) * 10 + 5), // between originals
                    _ => at((n % ORIGINALS) * 10),     // tied with one
                };
                // "new-" < "orig-": ties sort before the original.
                let id = format!("new-{w}-{k:03}");
                store
                    .create(T, &record(&id, "c", TaskState::Working, when))
                    .await
                    .unwrap_or_else(|e| panic!("create {id}: {e}"));
                created.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
    }

    let walker = {
        let store = store.clone();
        let created = created.clone();
        tokio::spawn(async move {
            let mut q = ListQuery {
                page_size: PAGE,
                ..query()
            };
            let mut seen = Vec::new();
            let mut totals = Vec::new();
            let mut pages = 0usize;
            loop {
                assert!(pages < 10_000, "pagination does not terminate");
                let page = list(&store, T, &q).await;
                assert!(page.tasks.len() <= PAGE);
                totals.push(page.total_size);
                seen.extend(ids(&page.tasks));
                pages += 1;
                let _ = pages_tx.send(pages);
                if pages == 1 {
                    // Make sure writes land between pages at least once.
                    let before = created.load(Ordering::SeqCst);
                    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                    while created.load(Ordering::SeqCst)
                        < (before + WRITERS).min(WRITERS * PER_WRITER)
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::task::yield_now().await;
                    }
                }
                match page.next {
                    Some(c) => q.cursor = Some(via_token(&c)),
                    None => break,
                }
                tokio::task::yield_now().await;
            }
            let _ = pages_tx.send(usize::MAX);
            (seen, totals)
        })
    };

    let (seen, totals) = walker.await.expect("walker panicked");
    while let Some(r) = writers.join_next().await {
        r.expect("writer panicked");
    }
    let seen = counts(seen);
    assert_each_seen_once(&seen, originals.iter());
    assert_no_repeats(&seen);
    assert!(
        totals.first() < totals.last(),
        "writes should have overlapped the walk: totals {totals:?}"
    );
    assert_eq!(
        list(&store, T, &query()).await.total_size,
        ORIGINALS as usize + WRITERS * PER_WRITER
    );
}

/// Cursors work for ids containing the token's separators, spaces, unicode
/// and prefixes of each other.
pub async fn pagination_handles_ids_with_separators_and_unicode(store: Store) {
    let ids = [
        "a:b",
        "a",
        "a:",
        ":",
        "::x",
        "v1:5:x",
        "with space",
        "ünï",
        "日本",
        "🦀",
        "a/b",
        "a%2F",
        "=",
        "a\nb",
        "x\u{0}y",
    ];
    for (i, id) in ids.iter().enumerate() {
        // Half share one timestamp, half are spread out.
        let t = if i % 2 == 0 { at(50) } else { at(i as i64) };
        create(&store, T, &record(id, "c", TaskState::Working, t)).await;
    }
    let all = list_ids(&store, T, &query()).await;
    assert_eq!(all.len(), ids.len());
    for page_size in [1, 2, 4] {
        let pages = walk_pages(
            &store,
            T,
            ListQuery {
                page_size,
                ..query()
            },
        )
        .await;
        assert_eq!(pages.concat(), all, "page_size {page_size}");
    }
    for id in ids {
        assert_eq!(must_get(&store, T, id).await.record.task.id, id);
    }
}

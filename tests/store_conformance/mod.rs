//! The [`TaskStore`] conformance suite: one set of tests that every backend
//! must pass.
//!
//! Each test is a `pub async fn name(store: Store)` that receives a fresh,
//! empty store. [`store_conformance_tests!`] expands one `#[tokio::test]` per
//! function, so a backend joins the suite with a test file like
//! `tests/store_memory.rs`:
//!
//! ```ignore
//! mod store_conformance;
//! store_conformance::store_conformance_tests!(|| async {
//!     Arc::new(MemoryStore::new()) as Arc<dyn TaskStore>
//! });
//! ```
//!
//! A backend with a documented gap names the tests it is known to fail:
//! `store_conformance_tests!(factory, known_failures = [test_name])`.
//!
//! The module must be mounted at the test crate root under the name
//! `store_conformance` (the macro refers to `$crate::store_conformance::*`).
//! The factory is called once per test and must return a store that shares
//! nothing with the stores of other tests, which run in parallel (a fresh
//! database, schema or file per call).
//!
//! The tests live in one submodule per concern and are re-exported here, so
//! the macro names each one as `$crate::store_conformance::name`. Adding a
//! test: write the `pub async fn` in the submodule for its concern and add
//! its name to the list in [`store_conformance_tests!`]; a suite function
//! missing from the list is a `dead_code` error under `clippy -D warnings`.
//!
//! "Spec" in the submodules is the A2A protocol v1.0 specification; §3.1.4
//! is ListTasks. The store-level contract (versions, tenants, cursor order)
//! is documented on `a2a_lifecycle::store`.

use std::sync::Arc;

use a2a_lifecycle::store::TaskStore;

mod helpers;

mod crud;
mod fidelity;
mod list_filters;
mod list_order;
mod list_pages;
mod list_trimming;
mod long_tasks;
mod maintenance;
mod origins;
mod outbox;
mod owners;
mod tenants;

pub use crud::*;
pub use fidelity::*;
pub use list_filters::*;
pub use list_order::*;
pub use list_pages::*;
pub use list_trimming::*;
pub use long_tasks::*;
pub use maintenance::*;
pub use origins::*;
pub use outbox::*;
pub use owners::*;
pub use tenants::*;

/// What every suite function receives: a fresh, empty store.
pub type Store = Arc<dyn TaskStore>;

/// Expands one `#[tokio::test]` per conformance test, each on a fresh store
/// from `$factory` (an expression callable as `$factory().await` that yields
/// a [`Store`]).
///
/// `known_failures = [name, ...]` marks tests this backend is known to fail:
/// they still run, and pass only if they fail (and fail, asking to be taken
/// off the list, once the backend passes them). Use it for a documented gap,
/// never to hide a regression.
macro_rules! store_conformance_tests {
    ($factory:expr $(, known_failures = [$($xfail:ident),* $(,)?])? $(,)?) => {
        /// Conformance tests this backend is known to fail.
        const KNOWN_FAILURES: &[&str] = &[$($(stringify!($xfail)),*)?];
        // A misspelt known failure is a compile error.
        #[allow(dead_code)]
        fn known_failures_are_suite_tests() {
            $($(let _ = $crate::store_conformance::$xfail;)*)?
        }
        $crate::store_conformance::store_conformance_tests!(@tests $factory;
            // CRUD and versions (crud.rs)
            create_then_get_returns_same_record_at_version_1,
            get_of_missing_task_returns_none,
            create_twice_is_already_exists_and_keeps_first_record,
            concurrent_creates_of_one_id_exactly_one_wins,
            update_with_current_version_bumps_version_and_is_visible,
            update_with_stale_version_is_conflict_and_changes_nothing,
            update_of_missing_task_is_not_found,
            concurrent_updates_from_one_version_exactly_one_wins,
            // tenants (tenants.rs)
            same_task_id_in_two_tenants_are_two_tasks,
            list_never_returns_another_tenants_tasks,
            tenant_and_task_id_do_not_collide_when_concatenated,
            // ListTasks filters, spec §3.1.4 (list_filters.rs)
            list_filters_by_context_id,
            list_filters_by_state,
            list_filters_by_status_after_inclusively,
            list_combines_filters,
            list_filters_see_updates,
            total_size_counts_all_matches_across_pages,
            list_of_unknown_or_empty_tenant_is_an_empty_last_page,
            // ListTasks order, spec §3.1.4 (list_order.rs)
            list_orders_by_status_timestamp_descending,
            list_order_distinguishes_nanoseconds,
            ties_break_by_task_id_ascending_in_byte_order,
            order_and_status_after_cover_the_whole_timestamp_range,
            update_that_changes_status_timestamp_moves_task_in_list_order,
            update_that_keeps_status_timestamp_keeps_list_position,
            // ListTasks pages, spec §3.1.4 (list_pages.rs)
            page_size_is_respected_and_last_page_has_no_next,
            a_page_stops_at_its_byte_budget,
            walking_pages_visits_every_matching_task_exactly_once,
            tasks_created_between_pages_neither_skip_nor_repeat_originals,
            cursor_survives_an_update_of_its_own_task,
            concurrent_inserts_during_walk_neither_skip_nor_repeat_originals,
            pagination_handles_ids_with_separators_and_unicode,
            // round trips (fidelity.rs)
            every_part_kind_round_trips_in_history_and_artifacts,
            full_record_round_trips_through_create_and_update,
            awkward_strings_bytes_and_numbers_round_trip,
            list_returns_the_stored_task_unchanged_when_nothing_is_trimmed,
            // history / artifacts in ListTasks, spec §3.1.4 (list_trimming.rs)
            list_history_last_n_keeps_the_n_most_recent,
            list_include_artifacts_controls_artifacts,
            list_trimming_does_not_change_the_stored_task,
            // long-lived tasks: changes appended (long_tasks.rs)
            thousands_of_updates_read_back_whole,
            list_windows_a_long_tasks_history,
            readers_during_appends_see_whole_versions,
            a_stale_write_of_changes_is_refused,
            catch_up_gives_the_task_from_any_version,
            the_transition_log_is_kept_with_the_task,
            // idempotency (origins.rs); recovery, retention (maintenance.rs)
            same_creating_message_is_a_duplicate_within_a_tenant_only,
            find_by_origin_finds_the_created_task,
            // owners, spec §13.1 (owners.rs)
            get_owned_finds_only_the_owners_task,
            list_with_an_owner_sees_only_that_owners_tasks,
            idempotency_keys_are_per_owner,
            open_tasks_are_counted_per_owner_across_tenants,
            waiting_tasks_are_found_oldest_first,
            // push notification outbox (outbox.rs)
            outbox_entries_commit_with_their_write,
            active_tasks_lists_submitted_and_working_in_every_tenant,
            purge_deletes_only_old_terminal_tasks,
        );
    };
    (@tests $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(store) =
                    $crate::store_conformance::MaybeStore::into_store(($factory)().await)
                else {
                    // The backend is not there to test (its factory said why).
                    return;
                };
                $crate::store_conformance::run(
                    stringify!($name),
                    KNOWN_FAILURES,
                    $crate::store_conformance::$name(store),
                )
                .await;
            }
        )+
    };
}
pub(crate) use store_conformance_tests;

/// What a backend's factory gives: a store, or none when the backend is
/// not there to test (a server this machine does not run; the factory
/// says so, and a run that requires the backend fails instead).
pub trait MaybeStore {
    fn into_store(self) -> Option<Store>;
}

impl MaybeStore for Store {
    fn into_store(self) -> Option<Store> {
        Some(self)
    }
}

impl MaybeStore for Option<Store> {
    fn into_store(self) -> Option<Store> {
        self
    }
}

/// Runs one conformance test; a test listed in `known_failures` must fail.
pub async fn run(
    name: &str,
    known_failures: &[&str],
    test: impl Future<Output = ()> + Send + 'static,
) {
    if !known_failures.contains(&name) {
        return test.await;
    }
    match tokio::spawn(test).await {
        Err(e) if e.is_panic() => {
            eprintln!("{name}: known failure of this backend, failed as expected");
        }
        Err(e) => panic!("{name}: {e}"),
        Ok(()) => panic!("{name} is listed in known_failures but passed: take it off the list"),
    }
}

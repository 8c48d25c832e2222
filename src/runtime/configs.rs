//! A task's push notification configs (spec §3.1.7 to §3.1.10): set, read,
//! listed and deleted by whoever may see the task, as changes committed
//! with the task like its events (`TaskEvent::PushConfig`).

use super::loaded::Author;
use super::{TaskManager, store_error};
use crate::error::A2aError;
use crate::lifecycle::{Cause, MAX_PUSH_CONFIGS, Protocol, PushConfigChange, TaskEvent};
use crate::proto::TaskPushNotificationConfig;
use crate::store::Caller;

/// A stored config as a client sees it: with its tenant and task.
fn shown(
    mut config: TaskPushNotificationConfig,
    tenant: &str,
    task_id: &str,
) -> TaskPushNotificationConfig {
    config.tenant = tenant.to_owned();
    config.task_id = task_id.to_owned();
    config
}

impl TaskManager {
    /// CreateTaskPushNotificationConfig: adds `config` (already validated,
    /// with its id) to its task, or replaces the one with the same id;
    /// returns it once committed. A task already holding
    /// [`MAX_PUSH_CONFIGS`] others is INVALID_ARGUMENT.
    pub async fn set_push_config(
        &self,
        tenant: &str,
        caller: &Caller,
        config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        self.set_push_config_for(tenant, caller, config, Protocol::V1_0)
            .await
    }

    /// [`Self::set_push_config`] for a client of `protocol`, whose
    /// payloads the webhook gets.
    pub async fn set_push_config_for(
        &self,
        tenant: &str,
        caller: &Caller,
        config: TaskPushNotificationConfig,
        protocol: Protocol,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        let task_id = config.task_id.clone();
        let live = self.live_or_insert(tenant, &task_id);
        let mut state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_mut().expect("loaded");
        let configs = &loaded.record.push_configs;
        if configs.len() >= MAX_PUSH_CONFIGS && !configs.iter().any(|c| c.id == config.id) {
            return Err(A2aError::invalid(
                "task_id",
                format!(
                    "task {task_id:?} already has {MAX_PUSH_CONFIGS} push notification configs; \
                     delete one first"
                ),
            ));
        }
        let commit = live.submit_locked(
            &self.shared,
            &mut state,
            TaskEvent::PushConfig(PushConfigChange::Set(config.clone(), protocol)),
            Author::Server(Cause::Client),
        )?;
        drop(state);
        commit.wait().await.map_err(store_error)?;
        Ok(shown(config, tenant, &task_id))
    }

    /// TASK_NOT_FOUND unless `caller` may see the task (spec §13.1): asked
    /// before anything that would tell the caller more about a task it
    /// names, such as whether its webhook's host is refused.
    pub async fn check_visible(
        &self,
        tenant: &str,
        caller: &Caller,
        task_id: &str,
    ) -> Result<(), A2aError> {
        let live = self.live_or_insert(tenant, task_id);
        drop(live.lock_visible(&self.shared, caller).await?);
        Ok(())
    }

    /// GetTaskPushNotificationConfig: a config the task does not have is
    /// TASK_NOT_FOUND naming it (spec §3.1.8).
    pub async fn get_push_config(
        &self,
        tenant: &str,
        caller: &Caller,
        task_id: &str,
        id: &str,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        let live = self.live_or_insert(tenant, task_id);
        let state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_ref().expect("loaded");
        let config = loaded
            .push_configs()
            .iter()
            .find(|c| c.id == id)
            .cloned()
            .ok_or_else(|| A2aError::PushConfigNotFound {
                task_id: task_id.to_owned(),
                config_id: id.to_owned(),
            })?;
        Ok(shown(config, tenant, task_id))
    }

    /// ListTaskPushNotificationConfigs: the task's configs in the order
    /// they were first set.
    pub async fn list_push_configs(
        &self,
        tenant: &str,
        caller: &Caller,
        task_id: &str,
    ) -> Result<Vec<TaskPushNotificationConfig>, A2aError> {
        let live = self.live_or_insert(tenant, task_id);
        let state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_ref().expect("loaded");
        Ok(loaded
            .push_configs()
            .iter()
            .cloned()
            .map(|c| shown(c, tenant, task_id))
            .collect())
    }

    /// DeleteTaskPushNotificationConfig: idempotent; deleting a config the
    /// task does not have succeeds (the task itself must be visible).
    pub async fn delete_push_config(
        &self,
        tenant: &str,
        caller: &Caller,
        task_id: &str,
        id: &str,
    ) -> Result<(), A2aError> {
        let live = self.live_or_insert(tenant, task_id);
        let mut state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_ref().expect("loaded");
        if !loaded.record.push_configs.iter().any(|c| c.id == id) {
            return Ok(());
        }
        let commit = live.submit_locked(
            &self.shared,
            &mut state,
            TaskEvent::PushConfig(PushConfigChange::Delete(id.to_owned())),
            Author::Server(Cause::Client),
        )?;
        drop(state);
        commit.wait().await.map_err(store_error)
    }
}

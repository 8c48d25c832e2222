//! The push notification config RPCs (spec §3.1.7 to §3.1.10), when the
//! server delivers push notifications: validated here (the URL against the
//! egress policy, spec §13.2's SSRF concern), kept with the task by the
//! runtime, delivered by `push::deliver`.

use super::validate;
use crate::error::A2aError;
use crate::proto::{
    DeleteTaskPushNotificationConfigRequest, GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest, ListTaskPushNotificationConfigsResponse,
    TaskPushNotificationConfig,
};
use crate::push::egress::Egress;
use crate::runtime::TaskManager;
use crate::store::Caller;

/// A config as it will be stored: checked, its URL allowed, with an id
/// (the server assigns one when none is given).
pub async fn checked(
    egress: &Egress,
    mut config: TaskPushNotificationConfig,
    needs_task: bool,
) -> Result<TaskPushNotificationConfig, A2aError> {
    validate::push_config(&config, needs_task)?;
    egress
        .check_url(&config.url)
        .await
        .map_err(|e| A2aError::invalid("url", e.to_string()))?;
    if config.id.is_empty() {
        config.id = uuid::Uuid::now_v7().to_string();
    }
    Ok(config)
}

pub async fn create(
    manager: &TaskManager,
    caller: &Caller,
    egress: &Egress,
    config: TaskPushNotificationConfig,
    protocol: crate::lifecycle::Protocol,
) -> Result<TaskPushNotificationConfig, A2aError> {
    // The task first: a caller that may not see it learns nothing of the
    // URL's check (which would tell what an internal name resolves to).
    validate::push_config(&config, true)?;
    manager
        .check_visible(&config.tenant, caller, &config.task_id)
        .await?;
    let config = checked(egress, config, true).await?;
    let tenant = config.tenant.clone();
    manager
        .set_push_config_for(&tenant, caller, config, protocol)
        .await
}

pub async fn get(
    manager: &TaskManager,
    caller: &Caller,
    req: GetTaskPushNotificationConfigRequest,
) -> Result<TaskPushNotificationConfig, A2aError> {
    validate::push_config_id(&req.tenant, &req.task_id, &req.id)?;
    manager
        .get_push_config(&req.tenant, caller, &req.task_id, &req.id)
        .await
}

/// Configs are few per task (`lifecycle::MAX_PUSH_CONFIGS`); a page is
/// `page_size` of them (0: all) after the one the token names.
pub async fn list(
    manager: &TaskManager,
    caller: &Caller,
    req: ListTaskPushNotificationConfigsRequest,
) -> Result<ListTaskPushNotificationConfigsResponse, A2aError> {
    validate::task_id(&req.tenant, &req.task_id)
        .map_err(|_| A2aError::invalid("task_id", "a task id of at most 256 bytes is required"))?;
    if req.page_size < 0 {
        return Err(A2aError::invalid("page_size", "must not be negative"));
    }
    let configs = manager
        .list_push_configs(&req.tenant, caller, &req.task_id)
        .await?;
    let start = if req.page_token.is_empty() {
        0
    } else {
        configs
            .iter()
            .position(|c| c.id == req.page_token)
            .map(|at| at + 1)
            .ok_or_else(|| A2aError::invalid("page_token", "not a token of this listing"))?
    };
    let size = match req.page_size {
        0 => configs.len(),
        n => n as usize,
    };
    let page: Vec<TaskPushNotificationConfig> =
        configs.iter().skip(start).take(size).cloned().collect();
    let next_page_token = match page.last() {
        Some(last) if start + page.len() < configs.len() => last.id.clone(),
        _ => String::new(),
    };
    Ok(ListTaskPushNotificationConfigsResponse {
        configs: page,
        next_page_token,
    })
}

pub async fn delete(
    manager: &TaskManager,
    caller: &Caller,
    req: DeleteTaskPushNotificationConfigRequest,
) -> Result<(), A2aError> {
    validate::push_config_id(&req.tenant, &req.task_id, &req.id)?;
    manager
        .delete_push_config(&req.tenant, caller, &req.task_id, &req.id)
        .await
}

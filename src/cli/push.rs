//! Runs the `push` subcommands: a task's webhooks (push notification
//! configs) through the server, and a local receiver that prints what a
//! webhook gets.

use tokio::net::TcpListener;

use a2a_lifecycle::proto::{
    AuthenticationInfo, DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest, ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
};
use a2a_lifecycle::server::shutdown_signal;

use super::args::PushCommand;
use super::output::{print_line, print_pretty};

pub async fn run(command: PushCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        PushCommand::Set {
            target,
            id,
            notification_token,
            auth_scheme,
            credentials,
            task_id,
            url,
        } => {
            let config = TaskPushNotificationConfig {
                tenant: target.tenant.clone(),
                task_id,
                id: id.unwrap_or_default(),
                url,
                token: notification_token.unwrap_or_default(),
                authentication: auth_scheme.zip(credentials).map(|(scheme, credentials)| {
                    AuthenticationInfo {
                        scheme,
                        credentials,
                    }
                }),
            };
            let created = target
                .connect_client()
                .await?
                .create_push_config(config)
                .await?;
            print_pretty(&created)?;
        }
        PushCommand::Get {
            target,
            task_id,
            id,
        } => {
            let config = target
                .connect_client()
                .await?
                .get_push_config(GetTaskPushNotificationConfigRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    id,
                })
                .await?;
            print_pretty(&config)?;
        }
        PushCommand::List {
            target,
            page_size,
            page_token,
            task_id,
        } => {
            let page = target
                .connect_client()
                .await?
                .list_push_configs(ListTaskPushNotificationConfigsRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    page_size: page_size.unwrap_or_default(),
                    page_token: page_token.unwrap_or_default(),
                })
                .await?;
            print_pretty(&page)?;
        }
        PushCommand::Delete {
            target,
            task_id,
            id,
        } => {
            target
                .connect_client()
                .await?
                .delete_push_config(DeleteTaskPushNotificationConfigRequest {
                    tenant: target.tenant.clone(),
                    task_id,
                    id,
                })
                .await?;
        }
        PushCommand::Listen {
            port,
            host,
            notification_token,
        } => {
            let addr = std::net::SocketAddr::new(host, port);
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| super::cannot_listen(addr, "--port", &e))?;
            let addr = listener.local_addr()?;
            // On stderr whatever RUST_LOG says: where to point webhooks.
            eprintln!("receiving push notifications at http://{addr}/");
            let stop = tokio_util::sync::CancellationToken::new();
            let stopping = stop.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                stopping.cancel();
            });
            a2a_lifecycle::push::receiver::receive(
                listener,
                notification_token,
                |notification| {
                    if let Err(e) = print_line(&notification.event) {
                        tracing::warn!(error = %e, "notification not printable");
                    }
                },
                stop,
            )
            .await;
        }
    }
    Ok(())
}

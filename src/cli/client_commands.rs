//! Runs the client subcommands: each request built from its flags, its
//! answer printed as ProtoJSON ([`super::output`]); `push` in
//! [`super::push`].

use futures_util::StreamExt;

use a2a_lifecycle::discovery::signing::{self, CardSigner};
use a2a_lifecycle::lifecycle::parse_state_name;
use a2a_lifecycle::proto::{
    CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part, Role,
    SendMessageConfiguration, SendMessageRequest, SubscribeToTaskRequest,
    TaskPushNotificationConfig, part::Content,
};

use super::args::ClientCommand;
use super::call_error::CallError;
use super::output::{print_line, print_pretty};
use super::server_connection::ServerConnection;

pub async fn run(command: ClientCommand) -> Result<(), Box<dyn std::error::Error>> {
    let tenant = target_of(&command).map(|t| t.tenant.clone());
    run_command(command)
        .await
        .map_err(|e| match e.downcast::<CallError>() {
            Ok(call) => Box::new(for_the_command_line(*call, tenant.as_deref())),
            Err(other) => other,
        })
}

/// The server a command calls, for the ones that call one with a tenant.
fn target_of(command: &ClientCommand) -> Option<&ServerConnection> {
    use super::args::PushCommand;
    match command {
        ClientCommand::Send { target, .. }
        | ClientCommand::Get { target, .. }
        | ClientCommand::List { target, .. }
        | ClientCommand::Cancel { target, .. }
        | ClientCommand::Card { target, .. }
        | ClientCommand::Subscribe { target, .. } => Some(target),
        ClientCommand::Push { command } => match command {
            PushCommand::Set { target, .. }
            | PushCommand::Get { target, .. }
            | PushCommand::List { target, .. }
            | PushCommand::Delete { target, .. } => Some(target),
            PushCommand::Listen { .. } => None,
        },
        ClientCommand::Top { .. } | ClientCommand::Jwks { .. } => None,
    }
}

/// A failed call as the command line's user should read it: what the
/// server said, in the terms of this command's flags. `tenant` is the one
/// the command searched (`--tenant`).
fn for_the_command_line(mut call: CallError, tenant: Option<&str>) -> CallError {
    match call.code.as_str() {
        // A task is kept under the tenant it was sent to (spec §3.2.1):
        // say which one was searched, never whether another holds it.
        "NOT_FOUND" if call.reason == "TASK_NOT_FOUND" && call.message.ends_with("not found") => {
            let searched = match tenant {
                Some("") | None => "the default agent's tasks (no --tenant given)".to_owned(),
                Some(t) => format!("tenant {t:?}"),
            };
            call.message = format!(
                "{} in {searched}; a task is found only under the agent it was sent to: \
                 pass that agent's name as --tenant",
                call.message
            );
        }
        "UNAUTHENTICATED" => {
            let said = call.message.to_ascii_lowercase();
            if said.contains("client certificate") {
                call.message = format!(
                    "{}; pass --client-cert FILE and --client-key FILE, a certificate issued by \
                     the CA the server trusts (its --tls-client-ca)",
                    call.message
                );
            } else if said.starts_with("no credentials") {
                call.message = "no credentials: this server (run with --auth) wants an API key \
                                or JWT; pass --token TOKEN or set A2A_TOKEN"
                    .to_owned();
            } else {
                call.message = format!(
                    "{}; check the API key or JWT given with --token or A2A_TOKEN",
                    call.message
                );
            }
        }
        _ => {}
    }
    call
}

async fn run_command(command: ClientCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        ClientCommand::Send {
            target,
            task_id,
            context_id,
            stream,
            return_immediately,
            metadata,
            message_metadata,
            accepted_output_modes,
            push_url,
            notification_token,
            text,
        } => {
            // `send "$(git diff)"` where the command printed nothing.
            if text.trim().is_empty() {
                return Err(
                    "the message text is empty, so there is nothing to send (a command \
                            substitution such as \"$(git diff)\" that printed nothing gives an \
                            empty text); give the text as the last argument"
                        .into(),
                );
            }
            let mut client = target.connect_client().await?;
            let request = SendMessageRequest {
                tenant: target.tenant.clone(),
                message: Some(Message {
                    message_id: uuid::Uuid::new_v4().to_string(),
                    task_id: task_id.unwrap_or_default(),
                    context_id: context_id.unwrap_or_default(),
                    role: Role::User as i32,
                    parts: vec![Part {
                        content: Some(Content::Text(text)),
                        ..Default::default()
                    }],
                    metadata: message_metadata,
                    ..Default::default()
                }),
                configuration: Some(SendMessageConfiguration {
                    return_immediately,
                    accepted_output_modes,
                    task_push_notification_config: push_url.map(|url| TaskPushNotificationConfig {
                        url,
                        token: notification_token.unwrap_or_default(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                metadata,
            };
            if stream {
                let mut events = client.send_streaming_message(request).await?;
                while let Some(event) = events.next().await {
                    print_line(&event?)?;
                }
            } else {
                print_pretty(&client.send_message(request).await?)?;
            }
        }
        ClientCommand::Get {
            target,
            history_length,
            transitions,
            id,
        } => {
            let mut client = target.connect_client().await?;
            if transitions {
                client = client.with_extension(a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION);
            }
            let task = client
                .get_task(GetTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                    history_length,
                })
                .await?;
            print_pretty(&task)?;
        }
        ClientCommand::List {
            target,
            state,
            context_id,
            page_size,
            page_token,
        } => {
            let status = match state {
                Some(name) => parse_state_name(&name)? as i32,
                None => 0,
            };
            let page = target
                .connect_client()
                .await?
                .list_tasks(ListTasksRequest {
                    tenant: target.tenant.clone(),
                    context_id: context_id.unwrap_or_default(),
                    status,
                    page_size,
                    page_token: page_token.unwrap_or_default(),
                    ..Default::default()
                })
                .await?;
            print_pretty(&page)?;
        }
        ClientCommand::Cancel {
            target,
            metadata,
            id,
        } => {
            let task = target
                .connect_client()
                .await?
                .cancel_task(CancelTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                    metadata,
                })
                .await?;
            print_pretty(&task)?;
        }
        ClientCommand::Subscribe { target, id } => {
            let mut events = target
                .connect_client()
                .await?
                .subscribe_to_task(SubscribeToTaskRequest {
                    tenant: target.tenant.clone(),
                    id,
                })
                .await?;
            while let Some(event) = events.next().await {
                print_line(&event?)?;
            }
        }
        ClientCommand::Jwks { key, kid } => {
            let signer = CardSigner::from_file(&key, kid, None)?;
            println!("{}", serde_json::to_string_pretty(&signer.jwks())?);
        }
        ClientCommand::Card {
            target,
            extended,
            verify,
        } => {
            let card = if extended {
                target
                    .connect_client()
                    .await?
                    .get_extended_agent_card(a2a_lifecycle::proto::GetExtendedAgentCardRequest {
                        tenant: target.tenant.clone(),
                    })
                    .await?
            } else {
                let (channel, _) = target.connect().await?;
                super::client::public_card(channel, &target.tenant).await?
            };
            // An unverified card is not printed: a script reading stdout
            // must not take it for a checked one.
            let verified = verify
                .map(|path| {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                    let keys: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&text)
                        .map_err(|e| format!("{}: not a JWK set: {e}", path.display()))?;
                    signing::verify(&card, &keys)
                        .map_err(|e| format!("the card's signatures do not verify: {e}"))
                })
                .transpose()?;
            print_pretty(&card)?;
            if let Some(v) = verified {
                eprintln!(
                    "verified: signature {} (kid {:?}, {}) over {}",
                    v.index, v.kid, v.algorithm, v.form
                );
            }
        }
        ClientCommand::Top {
            target,
            interval,
            once,
        } => {
            let (channel, bearer) = target.connect().await?;
            let authorization = bearer
                .map(|v| http::HeaderValue::from_bytes(v.as_bytes()))
                .transpose()?;
            let source = super::top::Source {
                channel,
                authorization,
                server: target.url(),
            };
            super::top::run(source, interval, once).await?;
        }
        ClientCommand::Push { command } => super::push::run(command).await?,
    }
    Ok(())
}

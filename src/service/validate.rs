//! Request validation (spec §3.3.2: servers MUST validate all input before
//! processing). Every refusal names the field in a `google.rpc.BadRequest`.
//!
//! Named limits, all enforced here or by the transport:
//! - [`MAX_ID_BYTES`]: ids a client sends (message, task, context, tenant).
//! - [`MAX_PARTS`]: parts in one message.
//! - [`crate::proto::MAX_MESSAGE_BYTES`]: one encoded gRPC message.
//! - page sizes: [`crate::store::MAX_PAGE_SIZE`].

use crate::error::{A2aError, FieldViolation};
use crate::lifecycle::{HistoryLength, state_from_i32};
use crate::proto::{ListTasksRequest, Role, SendMessageRequest, part};
use crate::runtime::MessageRequest;
use crate::runtime::live::MAX_TASK_BYTES;
use crate::store::{Cursor, DEFAULT_PAGE_SIZE, ListQuery, MAX_PAGE_SIZE};

/// Longest id (message_id, task_id, context_id, tenant) accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Most parts accepted in one message.
pub const MAX_PARTS: usize = 1024;
/// Most entries in `configuration.accepted_output_modes`.
pub const MAX_OUTPUT_MODES: usize = 64;
/// Longest media type accepted in `accepted_output_modes`, in bytes.
pub const MAX_MEDIA_TYPE_BYTES: usize = 256;

/// What a new task holds besides its first message (ids, status), at most.
const NEW_TASK_OVERHEAD_BYTES: usize = 1024;

/// A SendMessage request that passed validation.
pub struct SendRequest {
    pub tenant: String,
    pub request: MessageRequest,
    pub history: HistoryLength,
    pub return_immediately: bool,
}

#[derive(Default)]
struct Violations(Vec<FieldViolation>);

impl Violations {
    fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation {
            field: field.into(),
            description: description.into(),
        });
    }

    fn check_id(&mut self, field: &str, value: &str) {
        if value.len() > MAX_ID_BYTES {
            self.add(field, format!("must be at most {MAX_ID_BYTES} bytes"));
        }
    }

    fn finish(self) -> Result<(), A2aError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(A2aError::InvalidArgument(self.0))
        }
    }
}

fn history(field: &str, value: Option<i32>, v: &mut Violations) -> HistoryLength {
    HistoryLength::from_request(value).unwrap_or_else(|e| {
        v.add(field, e.to_string());
        HistoryLength::All
    })
}

/// SendMessage / SendStreamingMessage (spec §3.1.1, §3.1.2, proto field
/// behaviours: message, message_id, role and parts are REQUIRED).
pub fn send_request(req: SendMessageRequest) -> Result<SendRequest, A2aError> {
    let mut v = Violations::default();
    v.check_id("tenant", &req.tenant);
    let config = req.configuration.unwrap_or_default();
    let history = history(
        "configuration.history_length",
        config.history_length,
        &mut v,
    );

    let Some(message) = req.message else {
        v.add("message", "a message is required");
        v.finish()?;
        unreachable!("finish fails with a violation")
    };
    if message.message_id.is_empty() {
        v.add("message.message_id", "must not be empty");
    }
    v.check_id("message.message_id", &message.message_id);
    v.check_id("message.task_id", &message.task_id);
    v.check_id("message.context_id", &message.context_id);
    match Role::try_from(message.role) {
        Ok(Role::User) => {}
        Ok(Role::Unspecified) => v.add("message.role", "must be ROLE_USER, got ROLE_UNSPECIFIED"),
        Ok(Role::Agent) => v.add(
            "message.role",
            "a client message must be ROLE_USER, got ROLE_AGENT",
        ),
        Err(_) => v.add("message.role", format!("{} is not a Role", message.role)),
    }
    if message.parts.is_empty() {
        v.add("message.parts", "at least one part is required");
    }
    if message.parts.len() > MAX_PARTS {
        v.add(
            "message.parts",
            format!("at most {MAX_PARTS} parts are accepted"),
        );
    }
    for (i, p) in message.parts.iter().enumerate() {
        if p.content.is_none() {
            v.add(
                format!("message.parts[{i}]"),
                "a part needs text, raw, url or data",
            );
        }
        if let Some(part::Content::Url(url)) = &p.content
            && url.is_empty()
        {
            v.add(format!("message.parts[{i}].url"), "must not be empty");
        }
    }
    if config.accepted_output_modes.len() > MAX_OUTPUT_MODES {
        v.add(
            "configuration.accepted_output_modes",
            format!("at most {MAX_OUTPUT_MODES} media types are accepted"),
        );
    }
    for (i, mode) in config.accepted_output_modes.iter().enumerate() {
        if mode.is_empty() || mode.len() > MAX_MEDIA_TYPE_BYTES {
            v.add(
                format!("configuration.accepted_output_modes[{i}]"),
                format!("must be a media type of 1 to {MAX_MEDIA_TYPE_BYTES} bytes"),
            );
        }
    }
    v.finish()?;
    // The task it creates or joins must stay answerable (see
    // `MAX_TASK_BYTES`); a follow-up is checked against the task's size
    // when it is applied.
    let size = prost::Message::encoded_len(&message) + NEW_TASK_OVERHEAD_BYTES;
    if size > MAX_TASK_BYTES {
        return Err(A2aError::ResourceExhausted {
            message: format!(
                "the message is {size} bytes encoded; a task may hold at most {MAX_TASK_BYTES}"
            ),
            task_id: None,
            limit: "MAX_TASK_BYTES",
        });
    }
    Ok(SendRequest {
        tenant: req.tenant,
        request: MessageRequest {
            message,
            metadata: req.metadata,
            accepted_output_modes: config.accepted_output_modes,
            // Checked by the service: whether push is offered, and the
            // config itself (`service::push::checked`).
            push_config: config.task_push_notification_config,
            // The call's, set by the service from its metadata.
            trace: None,
            protocol: Default::default(),
        },
        history,
        return_immediately: config.return_immediately,
    })
}

/// A task id in GetTask, CancelTask, SubscribeToTask.
pub fn task_id(tenant: &str, id: &str) -> Result<(), A2aError> {
    let mut v = Violations::default();
    v.check_id("tenant", tenant);
    if id.is_empty() {
        v.add("id", "a task id is required");
    }
    v.check_id("id", id);
    v.finish()
}

pub fn history_length(value: Option<i32>) -> Result<HistoryLength, A2aError> {
    let mut v = Violations::default();
    let h = history("history_length", value, &mut v);
    v.finish().map(|_| h)
}

/// ListTasks (spec §3.1.4): page_size unset = 50, else 1..=100; status
/// UNSPECIFIED means no filter, any other non-state is refused.
pub fn list_request(req: &ListTasksRequest) -> Result<ListQuery, A2aError> {
    let mut v = Violations::default();
    v.check_id("tenant", &req.tenant);
    v.check_id("context_id", &req.context_id);
    let page_size = match req.page_size {
        None => DEFAULT_PAGE_SIZE,
        Some(n) if (1..=MAX_PAGE_SIZE as i32).contains(&n) => n as usize,
        Some(n) => {
            v.add(
                "page_size",
                format!("must be between 1 and {MAX_PAGE_SIZE}, got {n}"),
            );
            DEFAULT_PAGE_SIZE
        }
    };
    let state = match req.status {
        0 => None,
        n => match state_from_i32(n) {
            Ok(s) => Some(s),
            Err(e) => {
                v.add("status", e.to_string());
                None
            }
        },
    };
    let cursor = if req.page_token.is_empty() {
        None
    } else {
        match Cursor::decode(&req.page_token) {
            Ok(c) => Some(c),
            Err(e) => {
                v.add("page_token", e.to_string());
                None
            }
        }
    };
    if let Some(ts) = &req.status_timestamp_after
        && !(0..1_000_000_000).contains(&ts.nanos)
    {
        v.add("status_timestamp_after", "nanos must be in 0..1e9");
    }
    let history = history("history_length", req.history_length, &mut v);
    v.finish()?;
    Ok(ListQuery {
        // Set by the runtime from the caller, never by the request.
        owner: None,
        context_id: (!req.context_id.is_empty()).then(|| req.context_id.clone()),
        state,
        status_after: req.status_timestamp_after,
        page_size,
        cursor,
        history,
        include_artifacts: req.include_artifacts.unwrap_or(false),
    })
}

/// Longest push notification token accepted, in bytes.
pub const MAX_PUSH_TOKEN_BYTES: usize = 1024;
/// Longest push notification credentials accepted, in bytes.
pub const MAX_PUSH_CREDENTIALS_BYTES: usize = 4096;
/// Longest authentication scheme accepted, in bytes.
pub const MAX_PUSH_SCHEME_BYTES: usize = 64;

/// A push notification config as CreateTaskPushNotificationConfig takes
/// it (the URL's address policy is checked after, by `push::egress`): a
/// task, a URL within its limit, and a token and credentials that can be
/// sent as HTTP header values, within theirs.
/// `needs_task`: CreateTaskPushNotificationConfig names its task; a
/// send's config goes with the message's task, or the new one.
pub fn push_config(
    config: &crate::proto::TaskPushNotificationConfig,
    needs_task: bool,
) -> Result<(), A2aError> {
    let mut v = Violations::default();
    v.check_id("tenant", &config.tenant);
    if needs_task && config.task_id.is_empty() {
        v.add("task_id", "a task id is required");
    }
    v.check_id("task_id", &config.task_id);
    v.check_id("id", &config.id);
    if config.url.is_empty() {
        v.add("url", "a webhook URL is required");
    }
    let header = |value: &str| value.bytes().all(|b| (b' '..=b'~').contains(&b));
    if config.token.len() > MAX_PUSH_TOKEN_BYTES {
        v.add(
            "token",
            format!("must be at most {MAX_PUSH_TOKEN_BYTES} bytes"),
        );
    } else if !header(&config.token) {
        v.add("token", "must be printable ASCII (it is sent as a header)");
    }
    if let Some(auth) = &config.authentication {
        if auth.scheme.is_empty() || auth.scheme.len() > MAX_PUSH_SCHEME_BYTES {
            v.add(
                "authentication.scheme",
                format!("must be 1 to {MAX_PUSH_SCHEME_BYTES} bytes"),
            );
        } else if !auth
            .scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            v.add(
                "authentication.scheme",
                "must be a token such as Bearer or Basic",
            );
        }
        if auth.credentials.len() > MAX_PUSH_CREDENTIALS_BYTES {
            v.add(
                "authentication.credentials",
                format!("must be at most {MAX_PUSH_CREDENTIALS_BYTES} bytes"),
            );
        } else if !header(&auth.credentials) {
            v.add(
                "authentication.credentials",
                "must be printable ASCII (it is sent as a header)",
            );
        }
    }
    v.finish()
}

/// A request naming one config of a task.
pub fn push_config_id(tenant: &str, task_id: &str, id: &str) -> Result<(), A2aError> {
    let mut v = Violations::default();
    v.check_id("tenant", tenant);
    if task_id.is_empty() {
        v.add("task_id", "a task id is required");
    }
    v.check_id("task_id", task_id);
    if id.is_empty() {
        v.add("id", "a config id is required");
    }
    v.check_id("id", id);
    v.finish()
}

//! Runs `serve`: refuses an open server others can reach, loads the
//! files its flags name, opens the store and serves the demo agents until
//! Ctrl-C or SIGTERM.

use std::sync::Arc;

use tokio::net::TcpListener;

use a2a_lifecycle::agent::demo::{Deployer, demo_router_with};
use a2a_lifecycle::discovery::DiscoveryConfig;
use a2a_lifecycle::discovery::signing::CardSigner;
use a2a_lifecycle::lifecycle::TransitionPolicy;
use a2a_lifecycle::metrics::Metrics;
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::server::{Security, ServerParts, serve, shutdown_signal};

use super::serve_args::ServeArgs;
use super::store::open_store;

pub async fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let ServeArgs {
        listen,
        store,
        lease,
        strict_transitions,
        no_metrics,
        metrics_listen,
        task_timeout,
        retain,
        deployer_approval_delay,
        public_url,
        extended_card,
        bindings,
        cors_origins,
        card_signing_key,
        no_v0_3,
        no_console,
        card_signing_kid,
        card_signing_jku,
        auth,
        insecure_open,
        tls_cert,
        tls_key,
        tls_client_ca,
        default_agent,
        connections,
        push,
    } = args;
    // Secure by default (spec §13.1): a server others can reach
    // must know who calls it.
    if auth.is_none() && tls_client_ca.is_none() && !listen.ip().is_loopback() && !insecure_open {
        return Err(format!(
            "refusing to serve {listen} without --auth: anyone who can reach it could \
             read, cancel and continue every task. Give --auth FILE or --tls-client-ca \
             (README, Security), listen on a loopback address, or pass --insecure-open \
             to serve it open."
        )
        .into());
    }
    let auth = auth
        .map(|path| a2a_lifecycle::auth::Authenticator::load(&path).map(Arc::new))
        .transpose()?;
    let tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => {
            use a2a_lifecycle::connections::{ClientCerts, Tls, TlsFiles};
            // Optional at the TLS layer even with mutual TLS alone:
            // the cards and health stay reachable without a
            // certificate, and the A2A service refuses calls
            // without one (UNAUTHENTICATED, with the reason).
            let clients = match tls_client_ca {
                None => ClientCerts::None,
                Some(_) => ClientCerts::Optional,
            };
            let files = TlsFiles {
                cert,
                key,
                client_ca: tls_client_ca,
            };
            Some(Arc::new(Tls::from_files(files, clients)?))
        }
        _ => None,
    };
    let extended_card = extended_card
        .map(|path| DiscoveryConfig::read_extended_card(&path))
        .transpose()?;
    let signer = card_signing_key
        .map(|path| CardSigner::from_file(&path, card_signing_kid, card_signing_jku))
        .transpose()?
        .map(|signer| {
            tracing::info!(
                kid = signer.kid(),
                algorithm = ?signer.algorithm(),
                "signing the agent cards"
            );
            Arc::new(signer)
        });
    let store = open_store(&store, lease)
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| super::cannot_listen(listen, "--listen", &e))?;
    let operations_listener = match metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| super::cannot_listen(addr, "--metrics-listen", &e))?,
        ),
        None => None,
    };
    let runtime = RuntimeConfig {
        policy: if strict_transitions {
            TransitionPolicy::Strict
        } else {
            TransitionPolicy::Permissive
        },
        task_timeout,
        retain: retain.0,
        metrics: (!no_metrics).then(|| Arc::new(Metrics::new())),
        ..Default::default()
    };
    let agents = demo_router_with(
        Deployer {
            approval_delay: deployer_approval_delay,
        },
        default_agent,
    );
    let parts = ServerParts {
        store,
        agents,
        runtime,
        discovery: DiscoveryConfig {
            public_url,
            extended_card,
            // Declared from --auth when the server starts.
            security: None,
            // Declared from `push` when the server starts.
            push: false,
            bindings,
            // Set from `tls` when the server starts.
            tls: false,
            cors_origins,
            signer,
            no_v0_3,
            no_console,
        },
        connections: connections.limits(),
        security: Security { auth, tls },
        push: push.settings(),
        operations: a2a_lifecycle::operations::Operations {
            listener: operations_listener,
            ..Default::default()
        },
    };
    a2a_lifecycle::connections::raise_descriptor_limit(parts.connections.max_connections);
    reload_on_hangup(parts.security.clone())?;
    serve(listener, parts, shutdown_signal())
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)?;
    Ok(())
}

/// SIGHUP reloads the auth file and the TLS files (key and certificate
/// rotation) without dropping a connection; see [`Security::reload`].
fn reload_on_hangup(security: Security) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                security.reload();
            }
        });
    }
    #[cfg(not(unix))]
    drop(security);
    Ok(())
}

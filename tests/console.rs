//! The console's files as the server sends them (`/console`): embedded,
//! with a strict Content-Security-Policy, revalidated by ETag, within the
//! first-load budget, public under `--auth`, and absent with
//! `--no-console` or without the HTTP+JSON binding it speaks. What the
//! page does in a browser: tests/browser.rs.

use crate::support;

use std::net::SocketAddr;

use a2a_lifecycle::console::{CONTENT_SECURITY_POLICY, MAX_FIRST_LOAD_BYTES};
use support::{KillOnDrop, WAIT, http_get, spawn_serve};

fn serve(args: &[&str]) -> (KillOnDrop, SocketAddr) {
    let mut all = vec!["--store", "memory"];
    all.extend_from_slice(args);
    let (child, url) = spawn_serve(&all);
    let addr = url.trim_start_matches("http://").parse().unwrap();
    (KillOnDrop(child), addr)
}

/// The whole response to a GET, as bytes on the wire (head and body).
async fn wire_bytes(addr: SocketAddr, path: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept-Encoding: gzip, br\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("response timed out")
        .unwrap();
    raw
}

const FILES: [(&str, &str); 3] = [
    ("/console", "text/html"),
    ("/console/app.js", "text/javascript"),
    ("/console/app.css", "text/css"),
];

#[tokio::test(flavor = "multi_thread")]
async fn console_files_are_embedded_and_served_under_a_strict_policy() {
    let (_server, addr) = serve(&[]);
    for (path, kind) in FILES {
        let r = http_get(addr, path, &[]).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(
            r.header("content-type")
                .unwrap_or_default()
                .starts_with(kind),
            "{path}: {:?}",
            r.header("content-type")
        );
        assert_eq!(
            r.header("content-security-policy"),
            Some(CONTENT_SECURITY_POLICY),
            "{path}"
        );
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        // Nothing is loaded from elsewhere: no URL with a host in any file.
        assert!(!r.body.contains("://"), "{path} names another host");
        // Revalidation: the same version is a 304 without a body.
        let etag = r.header("etag").expect("an ETag").to_owned();
        let again = http_get(addr, path, &[("if-none-match", &etag)]).await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.body.is_empty());
    }
    let page = http_get(addr, "/console", &[]).await.body;
    // The tenants, for the page's navigation, escaped inside the attribute.
    assert!(
        page.contains(r#"data-tenants="[&quot;&quot;,&quot;bench&quot;,&quot;code-reviewer&quot;"#),
        "{page}"
    );
    assert!(page.contains(r#"data-auth="""#), "{page}");
    // The CSP forbids inline script: the page has none.
    assert!(!page.contains("<script>"), "{page}");
    assert!(!page.contains("style="), "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn first_load_is_within_its_budget_on_the_wire() {
    let (_server, addr) = serve(&[]);
    let mut total = 0;
    for (path, _) in FILES {
        let raw = wire_bytes(addr, path).await;
        assert!(raw.starts_with(b"HTTP/1.1 200"), "{path}");
        total += raw.len();
    }
    assert!(
        total <= MAX_FIRST_LOAD_BYTES,
        "the console's first load is {total} bytes, over {MAX_FIRST_LOAD_BYTES}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_is_public_under_auth_and_asks_for_a_token() {
    let dir = std::env::temp_dir().join(format!("a2a-console-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let auth = dir.join("auth.toml");
    std::fs::write(
        &auth,
        "[[principal]]\nname = \"p\"\napi_key_sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\ntenants = [\"*\"]\nrole = \"user\"\n",
    )
    .unwrap();
    let (_server, addr) = serve(&["--auth", auth.to_str().unwrap()]);
    let page = http_get(addr, "/console", &[]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(r#"data-auth="bearer""#), "{}", page.body);
    // The data it would show is not public.
    let tasks = http_get(addr, "/tasks", &[("a2a-version", "1.0")]).await;
    assert_eq!(tasks.status, 401, "{}", tasks.body);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn no_console_without_the_flag_or_the_binding_it_speaks() {
    for args in [&["--no-console"][..], &["--bindings", "grpc,jsonrpc"][..]] {
        let (_server, addr) = serve(args);
        for (path, _) in FILES {
            let r = http_get(addr, path, &[]).await;
            assert_ne!(r.status, 200, "{args:?} {path} is served");
            assert!(!r.body.contains("<html"), "{args:?} {path}: {}", r.body);
            assert!(
                r.header("content-security-policy").is_none(),
                "{args:?} {path}"
            );
        }
    }
}

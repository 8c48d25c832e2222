//! The console (`/console`) in a real Chromium, driven over WebDriver
//! (chromedriver): the flows its users go through, against the real
//! binary on an ephemeral port, with other clients (gRPC, HTTP+JSON)
//! changing the same tasks.
//!
//! Needs Debian's `chromium` and `chromium-driver` (or
//! `A2A_TEST_CHROMIUM` / `A2A_TEST_CHROMEDRIVER`). Without them each test
//! says it is skipped and passes, unless `A2A_TEST_BROWSER=required`
//! (`.ci/run` sets it): then a missing browser fails. Screenshots go to
//! `A2A_CONSOLE_SCREENSHOTS` when set (docs/console.md's were taken so),
//! and otherwise under the target directory.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use support::{KillOnDrop, WAIT, spawn_serve, within};

/// One browser at a time: the machine has few cores, and a test's waits
/// should measure the page, not a neighbour's Chromium.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The browser lock: the other tests' turns first (each bounded by its
/// own timeouts, so this is too).
async fn one_browser() -> tokio::sync::MutexGuard<'static, ()> {
    tokio::time::timeout(Duration::from_secs(600), ONE_BROWSER.lock())
        .await
        .expect("the other browser tests did not end within 10 minutes")
}

struct Tools {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

fn find(env: &str, candidates: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        return p.exists().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in candidates {
        let direct = PathBuf::from(name);
        if direct.is_absolute() && direct.exists() {
            return Some(direct);
        }
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser and its driver, or `None` (the test is skipped) when this
/// machine has none and nothing requires them.
fn tools(test: &str) -> Option<Tools> {
    let chromium = find(
        "A2A_TEST_CHROMIUM",
        &["/usr/bin/chromium", "chromium", "chromium-browser"],
    );
    let chromedriver = find(
        "A2A_TEST_CHROMEDRIVER",
        &["/usr/bin/chromedriver", "chromedriver"],
    );
    match (chromium, chromedriver) {
        (Some(chromium), Some(chromedriver)) => Some(Tools {
            chromium,
            chromedriver,
        }),
        _ if std::env::var("A2A_TEST_BROWSER").as_deref() == Ok("required") => panic!(
            "{test}: A2A_TEST_BROWSER=required but Chromium or chromedriver is missing \
             (apt-get install chromium chromium-driver)"
        ),
        _ => {
            // Written to stderr itself, past the test harness's capture:
            // the skip shows in `cargo test`'s output.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "browser test {test} skipped: no Chromium and chromedriver here \
                 (apt-get install chromium chromium-driver; A2A_TEST_BROWSER=required \
                 makes this a failure)"
            );
            None
        }
    }
}

/// A chromedriver process and one Chromium session it drives.
struct Session {
    browser: Browser,
    _driver: KillOnDrop,
    _profile: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn open(tools: &Tools, extra_args: &[&str]) -> Session {
    let port = free_port();
    let mut driver = Command::new(&tools.chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let out = driver.stdout.take().unwrap();
    let driver = KillOnDrop(driver);
    // chromedriver says when it listens.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    support::wait_for_line(&rx, "started successfully");
    std::thread::spawn(move || for _ in rx {});

    let profile =
        std::env::temp_dir().join(format!("a2a-console-profile-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&profile).unwrap();
    let mut args = vec![
        "--headless=new".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--window-size=1280,900".to_owned(),
        format!("--user-data-dir={}", profile.display()),
    ];
    args.extend(extra_args.iter().map(|a| (*a).to_owned()));
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({ "binary": tools.chromium, "args": args }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let browser = within(
        "a Chromium session",
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}")),
    )
    .await
    .expect("a Chromium session");
    Session {
        browser,
        _driver: driver,
        _profile: TempDir(profile),
    }
}

impl Session {
    async fn goto(&self, url: &str) {
        within("navigate", self.browser.goto(url))
            .await
            .unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// Runs `script` in the page (the body of a function).
    async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        within("script", self.browser.execute(script, args))
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// The text of the first element matching `css`, `""` when none.
    async fn text(&self, css: &str) -> String {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
            vec![json!(css)],
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Waits until `script` returns something true (the page changes on
    /// its own: there is no event to wait on from here, so it is asked
    /// every 50 ms), and returns it.
    async fn until(&self, what: &str, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.js(script, args.clone()).await;
            let truthy = match &got {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return got;
            }
            if Instant::now() > deadline {
                let body = self.text("body").await;
                panic!("{what}: not within {WAIT:?}; the page reads:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn until_present(&self, what: &str, css: &str) {
        self.until(
            what,
            "return !!document.querySelector(arguments[0]);",
            vec![json!(css)],
        )
        .await;
    }

    async fn fill(&self, css: &str, text: &str) {
        let e = within("find", self.browser.find(Locator::Css(css)))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        within("type", e.send_keys(text)).await.unwrap();
    }

    async fn click(&self, css: &str) {
        let e = within("find", self.browser.find(Locator::Css(css)))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        within("click", e.click()).await.unwrap();
    }

    async fn hash(&self) -> String {
        self.js("return location.hash;", vec![])
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The task view's state (`data-state` of its badge).
    async fn until_state(&self, state: &str) {
        self.until(
            &format!("the task shows {state}"),
            "const b = document.querySelector('#state [data-state]'); \
             return b && b.dataset.state === arguments[0];",
            vec![json!(state)],
        )
        .await;
    }

    /// The transition log as the page shows it: `STATE cause` per entry.
    async fn timeline(&self) -> Vec<String> {
        let v = self
            .js(
                "return [...document.querySelectorAll('#timeline li[data-state]')]\
                 .map(li => li.dataset.state + ' ' + li.dataset.cause);",
                vec![],
            )
            .await;
        serde_json::from_value(v).unwrap()
    }

    async fn screenshot(&self, name: &str) {
        let png = within("screenshot", self.browser.screenshot())
            .await
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        let mut dirs = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console")];
        if let Some(d) = std::env::var_os("A2A_CONSOLE_SCREENSHOTS") {
            dirs.push(PathBuf::from(d));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        }
    }

    /// Starts a task with the agent whose page is open, from its form.
    async fn start_task(&self, text: &str) {
        self.fill("#start-text", text).await;
        self.click("#start button[type=submit]").await;
    }

    async fn close(&self) {
        within("close the browser", self.browser.clone().close())
            .await
            .unwrap();
    }
}

/// A test's browser on a server of its own (memory store, `serve_args`),
/// holding the browser lock; `None` when the test is skipped. Fields drop
/// in order: the browser, then the server, then the lock.
struct Case {
    s: Session,
    url: String,
    _server: KillOnDrop,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

async fn case(test: &str, serve_args: &[&str], chrome_args: &[&str]) -> Option<Case> {
    let tools = tools(test)?;
    let one = one_browser().await;
    let (server, url) = server(serve_args);
    let s = open(&tools, chrome_args).await;
    Some(Case {
        s,
        url,
        _server: server,
        _one: one,
    })
}

/// `serve` with the memory store and `args`.
fn server(args: &[&str]) -> (KillOnDrop, String) {
    let mut all = vec!["--store", "memory"];
    all.extend_from_slice(args);
    let (child, url) = spawn_serve(&all);
    (KillOnDrop(child), url)
}

async fn grpc(url: &str) -> support::Client {
    within("connect", support::Client::connect(url.to_owned()))
        .await
        .unwrap()
}

/// The code-reviewer flow end to end in the page: start a task on the
/// agent's page, see it wait for input (act), answer, watch it complete,
/// with the review artifact and the transition log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_reviewer_task_is_started_answered_and_completed_in_the_page() {
    let Some(c) = case("code_reviewer", &[], &[]).await else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());
    s.goto(&format!("{url}/console#/code-reviewer/tasks")).await;
    s.until_present("the agent's card", ".card[data-tenant='code-reviewer']")
        .await;
    s.screenshot("agent").await;
    s.start_task("review my change").await;
    s.until(
        "the task's own view",
        "return location.hash.startsWith('#/code-reviewer/tasks/');",
        vec![],
    )
    .await;
    s.until_state("INPUT_REQUIRED").await;
    assert_eq!(s.text("#state [data-next]").await, "act");
    assert!(
        s.text("#why").await.contains("send the diff"),
        "the agent's question is shown: {}",
        s.text("#next").await
    );
    s.screenshot("input-required").await;
    s.fill("#answer-text", "--- a/x\n+++ b/x\n+fixed").await;
    s.click("#answer button[type=submit]").await;
    s.until_state("COMPLETED").await;
    assert_eq!(s.text("#state [data-next]").await, "stop");
    s.until_present("the review artifact", "#artifacts [data-artifact]")
        .await;
    let conversation = s.text("#conversation").await;
    assert!(conversation.contains("review my change"), "{conversation}");
    assert!(conversation.contains("+fixed"), "{conversation}");
    // Every state change, each once, in order, with its cause (the log
    // arrives with GetTask after the last event).
    s.until(
        "the whole transition log",
        "return document.querySelectorAll('#timeline li[data-state]').length >= 4;",
        vec![],
    )
    .await;
    let log = s.timeline().await;
    assert_eq!(
        log,
        [
            "SUBMITTED client",
            "INPUT_REQUIRED agent",
            "WORKING follow-up",
            "COMPLETED agent"
        ],
        "the page's timeline"
    );
    assert!(s.text("#cancel").await.is_empty(), "no cancel once ended");
    s.screenshot("completed").await;

    // The view has a link of its own: a reload opens the same task.
    let hash = s.hash().await;
    within("reload", s.browser.refresh()).await.unwrap();
    s.until_state("COMPLETED").await;
    assert_eq!(s.hash().await, hash);
    s.close().await;
}

/// A slow test-runner task streams its progress into the page, which
/// cancels it; the timeline says the client's cancel ended it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_task_streams_progress_and_is_canceled_from_the_page() {
    let Some(c) = case("slow_task", &[], &[]).await else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());
    s.goto(&format!("{url}/console#/tasks")).await;
    s.start_task("slow tests").await;
    s.until_state("WORKING").await;
    assert_eq!(s.text("#state [data-next]").await, "wait");
    // Progress arrives on the stream: the status message changes while
    // the page is not reloaded.
    let first = s
        .until(
            "a progress message",
            "return document.querySelector('#why') && document.querySelector('#why').textContent;",
            vec![],
        )
        .await;
    let first_status = s.text("#conversation .status").await;
    s.until(
        "a later progress message",
        "const e = document.querySelector('#conversation .status'); \
         return e && e.textContent !== arguments[0];",
        vec![json!(first_status)],
    )
    .await;
    assert!(first.as_str().is_some());
    assert_eq!(s.text("#live").await, "Live.");
    s.screenshot("working").await;
    s.click("#cancel").await;
    s.until_state("CANCELED").await;
    s.until(
        "the cancel in the timeline",
        "return [...document.querySelectorAll('#timeline li')].some(li => li.dataset.cause === 'cancel');",
        vec![],
    )
    .await;
    let log = s.timeline().await;
    assert_eq!(log.first().map(String::as_str), Some("SUBMITTED client"));
    assert_eq!(log.last().map(String::as_str), Some("CANCELED cancel"));
    assert_eq!(s.text("#live").await, "Ended.");
    s.close().await;
}

/// Another client (gRPC) starts and answers a task while the page shows
/// the agent's list and then the task: both change without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_changed_by_another_client_update_without_a_reload() {
    let Some(c) = case("live_updates", &[], &[]).await else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());
    s.goto(&format!("{url}/console#/code-reviewer/tasks")).await;
    s.until_present("the list", "#task-rows").await;
    let mut client = grpc(url).await;
    let task = within(
        "send",
        support::send_text(&mut client, "code-reviewer", "review this"),
    )
    .await;
    let row = format!("#task-rows tr[data-task='{}']", task.id);
    s.until_present("the new task's row", &row).await;
    assert_eq!(
        s.text(&format!("{row} [data-state]")).await,
        "INPUT_REQUIRED"
    );
    s.until(
        "the count of tasks waiting for input",
        "const c = document.querySelector('[data-count=INPUT_REQUIRED]'); \
         return c && c.textContent.endsWith(' 1');",
        vec![],
    )
    .await;
    s.screenshot("list").await;

    // The row follows the task as the other client answers it.
    let mut answer = support::user_message("the diff");
    answer.task_id = task.id.clone();
    within(
        "the other client's answer",
        support::send_task(
            &mut client,
            support::request("code-reviewer", answer, false),
        ),
    )
    .await;
    s.until(
        "the row turning COMPLETED",
        "const b = document.querySelector(arguments[0]); return b && b.textContent === 'COMPLETED';",
        vec![json!(format!("{row} [data-state]"))],
    )
    .await;

    // A task view open while the other client acts.
    let second = within(
        "send",
        support::send_text(&mut client, "code-reviewer", "and this"),
    )
    .await;
    s.goto(&format!("{url}/console#/code-reviewer/tasks/{}", second.id))
        .await;
    s.until_state("INPUT_REQUIRED").await;
    let mut answer = support::user_message("second diff");
    answer.task_id = second.id.clone();
    within(
        "the other client's answer",
        support::send_task(
            &mut client,
            support::request("code-reviewer", answer, false),
        ),
    )
    .await;
    s.until_state("COMPLETED").await;
    s.until(
        "the other client's answer in the conversation",
        "return document.querySelector('#conversation').textContent.includes('second diff');",
        vec![],
    )
    .await;
    // Following a task by id from the header opens it.
    s.goto(&format!("{url}/console#/code-reviewer/tasks")).await;
    s.fill("#follow-id", &task.id).await;
    s.click("#follow button").await;
    s.until_state("COMPLETED").await;
    assert_eq!(s.hash().await, format!("#/code-reviewer/tasks/{}", task.id));
    s.close().await;
}

/// Text a user or agent wrote is shown as text: markup in a message runs
/// nothing and makes no element, and a `javascript:` URL part is no link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_in_messages_stays_text() {
    let Some(c) = case("markup_stays_text", &[], &[]).await else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());
    let mut client = grpc(url).await;
    let xss = "<img src=x onerror=\"window.__xss=1\"><script>window.__xss=2</script>";
    let mut message = support::user_message(xss);
    message.parts.push(a2a_lifecycle::proto::Part {
        content: Some(a2a_lifecycle::proto::part::Content::Url(
            "javascript:window.__xss=3".into(),
        )),
        filename: "click me".into(),
        media_type: "text/plain".into(),
        ..Default::default()
    });
    let task = within(
        "the marked-up message",
        support::send_task(
            &mut client,
            support::request("code-reviewer", message, false),
        ),
    )
    .await;
    s.goto(&format!("{url}/console#/code-reviewer/tasks/{}", task.id))
        .await;
    s.until_state("INPUT_REQUIRED").await;
    s.until(
        "the message in the conversation",
        "return document.querySelector('#conversation').textContent.includes('onerror');",
        vec![],
    )
    .await;
    let conversation = s.text("#conversation").await;
    assert!(
        conversation.contains(xss),
        "shown as written: {conversation}"
    );
    let found = s
        .js(
            "const c = document.querySelector('#conversation'); return {\
               images: c.querySelectorAll('img').length, \
               scripts: c.querySelectorAll('script').length, \
               ran: window.__xss === undefined ? null : window.__xss, \
               hrefs: [...c.querySelectorAll('a')].map(a => a.getAttribute('href')) };",
            vec![],
        )
        .await;
    assert_eq!(found["images"], 0, "{found}");
    assert_eq!(found["scripts"], 0, "{found}");
    assert_eq!(found["ran"], Value::Null, "{found}");
    assert_eq!(found["hrefs"], json!(["#"]), "{found}");
    s.close().await;
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// With `--auth` the page asks for a token and shows what that principal
/// may see: bob never sees alice's task, in the list, its counts or by
/// its id; a wrong token is refused and asked for again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_sees_only_its_own_tasks() {
    let dir = std::env::temp_dir().join(format!("a2a-console-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let auth = dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n\n\
             [[principal]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\ntenants = [\"*\"]\nrole = \"user\"\n",
            sha256_hex("alice-key"),
            sha256_hex("bob-key"),
        ),
    )
    .unwrap();
    let _cleanup = TempDir(dir);
    let Some(c) = case("principals", &["--auth", auth.to_str().unwrap()], &[]).await else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());

    // Alice starts a task over HTTP+JSON.
    let http = reqwest::Client::new();
    let started = within(
        "alice's task",
        http.post(format!("{url}/code-reviewer/message:send"))
            .bearer_auth("alice-key")
            .header("A2A-Version", "1.0")
            .json(
                &json!({"message": {"messageId": "m-alice", "role": "ROLE_USER",
                "parts": [{"text": "alice's secret change"}]}}),
            )
            .send(),
    )
    .await
    .unwrap()
    .error_for_status()
    .unwrap()
    .json();
    let started: Value = within("alice's task's body", started).await.unwrap();
    let alice_task = started["task"]["id"].as_str().unwrap().to_owned();

    s.goto(&format!("{url}/console#/code-reviewer/tasks")).await;
    s.until(
        "the token prompt",
        "return !document.querySelector('#login').hidden;",
        vec![],
    )
    .await;
    s.screenshot("token").await;

    // A wrong token is refused, and asked for again.
    s.fill("#token", "nobody-key").await;
    s.click("#login-form button").await;
    s.until(
        "the refusal",
        "return !document.querySelector('#login').hidden && \
         document.querySelector('#login-error').textContent;",
        vec![],
    )
    .await;

    s.click("#signout").await;
    s.fill("#token", "bob-key").await;
    s.click("#login-form button").await;
    s.until(
        "bob's empty list",
        "const r = document.querySelector('#task-rows'); \
         return r && document.querySelector('[data-count=INPUT_REQUIRED]') && \
           document.querySelector('[data-count=INPUT_REQUIRED]').textContent.endsWith(' 0');",
        vec![],
    )
    .await;
    let rows = s
        .js(
            "return document.querySelectorAll('#task-rows tr').length;",
            vec![],
        )
        .await;
    assert_eq!(rows, 0, "bob sees no task");
    assert!(!s.text("main").await.contains(&alice_task));
    // By its id: exactly as a task that does not exist.
    s.goto(&format!("{url}/console#/code-reviewer/tasks/{alice_task}"))
        .await;
    s.until_present("the refusal", "main [role=alert]").await;
    s.until(
        "task not found",
        "return document.querySelector('main [role=alert]').textContent.includes('TASK_NOT_FOUND');",
        vec![],
    )
    .await;
    assert!(!s.text("#conversation").await.contains("secret"));

    // Alice, in the same tab after forgetting bob's token, sees hers.
    s.click("#signout").await;
    s.fill("#token", "alice-key").await;
    s.click("#login-form button").await;
    s.until_state("INPUT_REQUIRED").await;
    assert!(
        s.text("#conversation")
            .await
            .contains("alice's secret change")
    );
    // The token lives in this tab's session storage only.
    let stored = s
        .js(
            "return [sessionStorage.getItem('a2a-console-token'), localStorage.length, document.cookie];",
            vec![],
        )
        .await;
    assert_eq!(stored, json!(["alice-key", 0, ""]));
    s.close().await;
}

/// A phone's width in the dark scheme: the task view still reads and
/// every control is reachable (no horizontal scrolling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phone_width_and_dark_scheme() {
    let Some(c) = case(
        "phone_dark",
        &[],
        &["--force-dark-mode", "--window-size=390,844"],
    )
    .await
    else {
        return;
    };
    let (s, url) = (&c.s, c.url.as_str());
    let mut client = grpc(url).await;
    let task = within(
        "send",
        support::send_text(&mut client, "deployer", "deploy to prod"),
    )
    .await;
    within("phone size", s.browser.set_window_size(390, 844))
        .await
        .unwrap();
    s.goto(&format!("{url}/console#/deployer/tasks/{}", task.id))
        .await;
    s.until_state("COMPLETED").await;
    s.until_present("the deployment artifact", "#artifacts [data-artifact]")
        .await;
    let layout = s
        .js(
            "return { dark: matchMedia('(prefers-color-scheme: dark)').matches, \
               overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth, \
               bg: getComputedStyle(document.body).backgroundColor };",
            vec![],
        )
        .await;
    assert_eq!(layout["dark"], true, "{layout}");
    assert!(layout["overflow"].as_i64().unwrap() <= 0, "{layout}");
    assert_ne!(
        layout["bg"], "rgb(247, 247, 248)",
        "the dark colours: {layout}"
    );
    s.screenshot("phone-dark").await;
    s.close().await;
}

/// `serve` on `addr` with `store`, the address it listens on once it does.
fn server_at(addr: &str, store: &str) -> (KillOnDrop, String) {
    let (child, url, lines) = support::spawn_serve_on(addr, &[], &["--store", store]);
    std::thread::spawn(move || for _ in lines {});
    (
        KillOnDrop(child),
        url.trim_start_matches("http://").to_owned(),
    )
}

/// The server dies (SIGKILL) under a task view that is streaming: the
/// page says it reconnects, takes the task up again once the server is
/// back (the restarted server failed the orphaned task), shows each
/// message once, and the timeline ends with the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_view_resumes_after_the_server_comes_back() {
    let Some(tools) = tools("resume") else {
        return;
    };
    let _one = one_browser().await;
    let dir = std::env::temp_dir().join(format!("a2a-console-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
    let store = format!("sqlite:{}", dir.join("tasks.db").display());
    let (mut first, addr) = server_at("127.0.0.1:0", &store);
    let url = format!("http://{addr}");
    let s = open(&tools, &[]).await;
    s.goto(&format!("{url}/console#/tasks")).await;
    s.start_task("slow tests").await;
    s.until_state("WORKING").await;
    s.until(
        "progress on the stream",
        "const e = document.querySelector('#why'); return e && e.textContent.startsWith('Progress');",
        vec![],
    )
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    s.until(
        "the page saying it reconnects",
        "return document.querySelector('#live').textContent.includes('reconnecting');",
        vec![],
    )
    .await;
    let (_second, again) = server_at(&addr, &store);
    assert_eq!(again, addr);
    s.until_state("FAILED").await;
    s.until(
        "the sweep in the timeline",
        "const l = [...document.querySelectorAll('#timeline li[data-state]')]; \
         return l.length && l[l.length - 1].dataset.cause === 'orphan-sweep';",
        vec![],
    )
    .await;
    let log = s.timeline().await;
    assert_eq!(
        log,
        ["SUBMITTED client", "WORKING agent", "FAILED orphan-sweep"],
        "the page's timeline"
    );
    let ids = s
        .js(
            "return [...document.querySelectorAll('#conversation [data-message]')].map(m => m.dataset.message);",
            vec![],
        )
        .await;
    let ids: Vec<String> = serde_json::from_value(ids).unwrap();
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a message shown twice: {ids:?}");
    assert!(ids.len() >= 3, "the conversation: {ids:?}");
    s.close().await;
}

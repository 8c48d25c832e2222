//! README.md's and docs/'s shell blocks, run as written, in order, one
//! file at a time, each file on a fresh server: a command the docs give
//! that fails (a flag renamed, a step missing, a tenant forgotten) fails
//! here. A test binary of its own: the blocks use the documented fixed
//! ports (50051, 9090, ...), which no other test may hold meanwhile.
//!
//! Each ```sh block runs unless the line above its fence says why not:
//! `<!-- not run: REASON -->` (set-up, a browser, a long job), or
//! `<!-- needs: TOOL -->` (run when TOOL is on the PATH, or for an
//! upper-case name when that environment variable is set; else reported
//! as skipped). A file's blocks run in one bash session (`set -euo
//! pipefail`) in a fresh directory, with the test build's `a2a-lifecycle`
//! first on the PATH and `cargo run --release --` standing for it. A line
//! starting a server (`serve`, `push listen`) runs in the background: a
//! server already on its port is stopped first, and the next line waits
//! until the port answers; every server is stopped when the file ends.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_a2a-lifecycle");
/// The longest one file's blocks may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(180);

/// Why a block is not run, as its marker says.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Run,
    NotRun(String),
    Needs(String),
}

#[derive(Debug)]
struct Block {
    line: usize,
    body: String,
    marker: Marker,
}

/// The documents whose blocks run: README.md, then docs/*.md by name.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, Path::new(ROOT).join("README.md"));
    docs
}

/// The ```sh blocks of `text`, with their markers.
fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if fence == "```sh" || fence == "```bash" {
            let above = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map_or("", |l| l.trim());
            let marker = if let Some(why) = above
                .strip_prefix("<!-- not run:")
                .and_then(|r| r.strip_suffix("-->"))
            {
                Marker::NotRun(why.trim().to_owned())
            } else if let Some(tool) = above
                .strip_prefix("<!-- needs:")
                .and_then(|r| r.strip_suffix("-->"))
            {
                Marker::Needs(tool.trim().to_owned())
            } else {
                Marker::Run
            };
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && lines[end].trim_start() != "```" {
                end += 1;
            }
            found.push(Block {
                line: i + 1,
                body: lines[start..end].join("\n"),
                marker,
            });
            i = end + 1;
        } else {
            i += 1;
        }
    }
    found
}

/// A block's lines with `\` continuations joined: what bash runs as one
/// command.
fn logical_lines(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(line);
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The port a server-starting command listens on, if `line` starts one.
fn server_port(line: &str) -> Option<u16> {
    let command = line.trim_start();
    let rest = command
        .strip_prefix("a2a-lifecycle ")
        .or_else(|| command.strip_prefix("cargo run --release -- "))?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    let flag_value = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    match words.first().copied() {
        Some("serve") => Some(
            flag_value("--listen")
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(50051),
        ),
        Some("push") if words.get(1) == Some(&"listen") => Some(
            flag_value("--port")
                .and_then(|p| p.parse().ok())
                .unwrap_or(9090),
        ),
        _ => None,
    }
}

/// `line` without a trailing comment (` # ...`) and `&`.
fn foreground(line: &str) -> String {
    let without_comment = match line.find(" # ").or_else(|| line.find("  #")) {
        Some(i) => &line[..i],
        None => line,
    };
    without_comment
        .trim_end()
        .trim_end_matches('&')
        .trim_end()
        .to_owned()
}

const PRELUDE: &str = r#"set -euo pipefail
cargo() {
  if [ "${1:-}" = run ] && [ "${2:-}" = --release ] && [ "${3:-}" = -- ]; then
    shift 3; a2a-lifecycle "$@"
  else
    echo "doc blocks: 'cargo $*' is not run here" >&2; return 1
  fi
}
declare -A serving=()
stop_port() {
  local pid="${serving[$1]:-}"
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "serving[$1]"
  fi
}
# Polls a fixed number of times: the server's own log is the reader's,
# and a port that answers is what the next command needs.
await_port() {
  for _ in $(seq 400); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    if ! kill -0 "${serving[$1]}" 2>/dev/null; then
      echo "doc blocks: the server for port $1 exited" >&2; return 1
    fi
    sleep 0.05
  done
  echo "doc blocks: nothing answers on port $1" >&2; return 1
}
cleanup() { for p in "${!serving[@]}"; do stop_port "$p"; done; }
trap cleanup EXIT
"#;

/// The bash script that runs `blocks` of `file` in order.
fn script(file: &str, blocks: &[Block]) -> (String, Vec<String>) {
    let mut text = PRELUDE.to_owned();
    let mut skipped = Vec::new();
    for block in blocks {
        match &block.marker {
            Marker::NotRun(_) => continue,
            Marker::Needs(need) => {
                // An upper-case name is an environment variable (the
                // PostgreSQL the tests are given), else a command.
                let met = if need
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                {
                    std::env::var_os(need).is_some()
                } else {
                    Command::new("bash")
                        .args(["-c", &format!("command -v {need}")])
                        .output()
                        .is_ok_and(|o| o.status.success())
                };
                if !met {
                    skipped.push(format!("{file}:{}: needs {need}", block.line));
                    continue;
                }
            }
            Marker::Run => {}
        }
        text.push_str(&format!("echo '### {file}:{}' >&2\n", block.line));
        for line in logical_lines(&block.body) {
            match server_port(&line) {
                Some(port) => {
                    // Its log to a file: a server left running must not
                    // hold the runner's pipes open.
                    // The binary itself (not the `cargo` function in a
                    // subshell), so that `$!` is the server's pid.
                    let command = foreground(&line);
                    let command = command
                        .trim_start()
                        .strip_prefix("cargo run --release -- ")
                        .map_or(command.clone(), |rest| format!("a2a-lifecycle {rest}"));
                    text.push_str(&format!(
                        "stop_port {port}\n{command} >>server-{port}.log 2>&1 &\nserving[{port}]=$!\nawait_port {port}\n"
                    ));
                }
                None => {
                    text.push_str(&line);
                    text.push('\n');
                }
            }
        }
    }
    (text, skipped)
}

/// Runs `script` with bash in a fresh directory, in a process group of
/// its own (killed whole at the end, so no server outlives it); its
/// status and output, the servers' logs after it.
fn run(script: &str) -> (bool, String) {
    use std::os::unix::process::CommandExt as _;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("doc-blocks")
        .join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-c", script])
        .current_dir(&dir)
        .env("PATH", path)
        .env("RUST_LOG", "warn")
        .env_remove("A2A_TOKEN")
        .env_remove("A2A_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = child.id() as i32;
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(FILE_TIMEOUT);
    // SAFETY: kill(2) of the group this test made; it may be gone.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let ok = matches!(&status, Ok(Ok(s)) if s.success());
    let timed_out = if status.is_err() {
        format!("the blocks did not finish within {FILE_TIMEOUT:?}\n")
    } else {
        String::new()
    };
    let mut logs = String::new();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("server-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            logs.push_str(&format!("--- {name} ---\n{text}"));
        }
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    // What bash said last, where the tail shown on failure reads it.
    (
        ok,
        format!("{logs}--- stdout ---\n{out}\n--- stderr ---\n{err}{timed_out}"),
    )
}

#[test]
fn every_shell_block_runs_or_says_why_not() {
    let mut count = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for block in blocks(&text) {
            count += 1;
            if let Marker::NotRun(why) = &block.marker {
                assert!(
                    why.len() > 5,
                    "{}:{}: say why the block is not run",
                    doc.display(),
                    block.line
                );
            }
        }
    }
    assert!(count > 20, "read only {count} blocks");
}

/// The commands the blocks use besides the binary.
const TOOLS: [&str; 3] = ["curl", "jq", "openssl"];

#[test]
fn the_readme_and_docs_blocks_run_in_order() {
    for tool in TOOLS {
        let found = Command::new("bash")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "the docs' commands use {tool}: install it (apt-get install {})",
            TOOLS.join(" ")
        );
    }
    let mut failures = Vec::new();
    let mut ran = 0;
    for doc in documents() {
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        let name = name.trim_start_matches('/').to_owned();
        let text = std::fs::read_to_string(&doc).unwrap();
        let blocks = blocks(&text);
        if blocks.iter().all(|b| matches!(b.marker, Marker::NotRun(_))) {
            continue;
        }
        let (script, skipped) = script(&name, &blocks);
        for s in skipped {
            eprintln!("doc blocks skipped: {s}");
        }
        let (ok, output) = run(&script);
        ran += 1;
        if !ok {
            let tail: Vec<&str> = output.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            failures.push(format!("{name}:\n{}", tail.join("\n")));
        }
    }
    assert!(ran >= 3, "ran the blocks of {ran} files only");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_runner_finds_blocks_markers_and_servers() {
    let text = "a\n\n<!-- not run: installs things -->\n```sh\ncargo build\n```\n\n```sh\na2a-lifecycle serve --listen 127.0.0.1:50052 \\\n  --store memory &  # the second\nx\n```\n<!-- needs: grpcurl -->\n```sh\ngrpcurl list\n```\n";
    let found = blocks(text);
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].marker, Marker::NotRun("installs things".into()));
    assert_eq!(found[1].marker, Marker::Run);
    assert_eq!(found[2].marker, Marker::Needs("grpcurl".into()));
    let lines = logical_lines(&found[1].body);
    assert_eq!(lines.len(), 2);
    assert_eq!(server_port(&lines[0]), Some(50052));
    assert_eq!(
        foreground(&lines[0]),
        "a2a-lifecycle serve --listen 127.0.0.1:50052    --store memory"
    );
    assert_eq!(server_port("cargo run --release -- serve"), Some(50051));
    assert_eq!(
        server_port("a2a-lifecycle push listen --port 9191 &"),
        Some(9191)
    );
    assert_eq!(server_port("a2a-lifecycle send x"), None);
}

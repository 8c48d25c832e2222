//! The shape of the code, checked so it stays so:
//!
//! - the top-level modules of the library depend on each other in one
//!   direction (no cycle), and so do the parts of the runtime (its files
//!   other than `runtime/mod.rs`, which holds the state and handles every
//!   part uses);
//! - the library needs none of the benchmark tools' crates, and the
//!   binary's own (command line, log output, allocator) only through the
//!   default `cli` feature;
//! - no `unsafe` in the store;
//! - no file under `src/` longer than [`MAX_FILE_LINES`] outside its test
//!   module, and every file opens with a doc line saying what it owns.
//!
//! Dependencies are read from the source: a file depends on a module it
//! names by path (`crate::store::...`, `use crate::{agent, store}`,
//! `super::live::...`), in code or in doc links, outside its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// The most lines a file under `src/` may hold outside its `#[cfg(test)]`
/// module: past this a file has grown a second job and is split along it
/// (docs/architecture.md). Generated code is in `OUT_DIR`, not `src/`.
const MAX_FILE_LINES: usize = 700;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// A file's source without its `#[cfg(test)]` module: tests may reach
/// anywhere.
fn source_outside_tests(path: &Path) -> String {
    let source = std::fs::read_to_string(path).expect("read source");
    match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => source[..at].to_owned(),
        None => source,
    }
}

/// The modules named after `prefix` (`crate::`, `super::`): `prefix` then
/// an identifier, or a brace group whose top-level items are each a path
/// starting with an identifier.
fn named_after(source: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            for item in items {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// A cycle in `graph`, if any, as the list of its nodes.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(cycle);
        }
    }
    None
}

/// The top-level module a file under `src/` belongs to.
fn top_module(path: &Path) -> Option<String> {
    let relative = path.strip_prefix(SRC).expect("under src");
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (name != "lib" && name != "main").then(|| name.to_owned())
}

#[test]
fn top_level_modules_depend_on_each_other_in_one_direction() {
    let files = rust_files(Path::new(SRC));
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = top_module(file) else {
            continue;
        };
        let uses = named_after(&source_outside_tests(file), "crate::");
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(
            uses.into_iter()
                .filter(|m| modules.contains(m) && *m != module),
        );
    }
    // The layering this keeps, lowest first (README's architecture notes).
    assert!(
        graph["lifecycle"]
            .iter()
            .all(|m| m == "proto" || m == "wkt"),
        "the lifecycle core depends only on the protocol types (and the well-known ones): {:?}",
        graph["lifecycle"]
    );
    assert!(
        !graph["agent"].contains("runtime") && !graph["agent"].contains("service"),
        "the agent API stands alone: {:?}",
        graph["agent"]
    );
    assert!(
        graph.get("wkt").is_none_or(BTreeSet::is_empty),
        "the well-known types stand alone: {:?}",
        graph["wkt"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_runtimes_parts_depend_on_each_other_in_one_direction() {
    let dir = Path::new(SRC).join("runtime");
    let parts: BTreeSet<String> = rust_files(&dir)
        .iter()
        .filter_map(|f| f.file_stem()?.to_str().map(str::to_owned))
        .filter(|name| name != "mod")
        .collect();
    assert!(
        parts.contains("live") && parts.contains("sink"),
        "{parts:?}"
    );
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for part in &parts {
        let source = source_outside_tests(&dir.join(format!("{part}.rs")));
        let mut uses = named_after(&source, "super::");
        uses.extend(named_after(&source, "crate::runtime::"));
        graph.insert(
            part.clone(),
            uses.into_iter()
                .filter(|m| parts.contains(m) && m != part)
                .collect(),
        );
    }
    assert!(
        graph.get("wkt").is_none_or(BTreeSet::is_empty),
        "the well-known types stand alone: {:?}",
        graph["wkt"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("runtime cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_check_finds_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(find_cycle(&graph).expect("a cycle"), ["a", "b", "c", "a"]);
    assert_eq!(
        named_after(
            "use crate::{agent::X, store, lifecycle::{A, B}};",
            "crate::"
        ),
        ["agent", "lifecycle", "store"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
}

/// The `[dependencies]` table of the library's manifest: name -> its line.
fn library_dependencies() -> BTreeMap<String, String> {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("read Cargo.toml");
    let table = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .expect("a [dependencies] table");
    let table = table.split("\n[").next().unwrap_or(table);
    table
        .lines()
        .filter_map(|line| {
            let (name, _) = line.split_once('=')?;
            Some((name.trim().to_owned(), line.to_owned()))
        })
        .collect()
}

#[test]
fn the_library_needs_no_tool_or_binary_only_crate() {
    let dependencies = library_dependencies();
    assert!(
        !dependencies.contains_key("hdrhistogram"),
        "hdrhistogram belongs to the bench crate"
    );
    for binary_only in [
        "clap",
        "tracing-subscriber",
        "mimalloc",
        "opentelemetry_sdk",
        "opentelemetry-otlp",
        "prometheus-parse",
    ] {
        let line = dependencies
            .get(binary_only)
            .unwrap_or_else(|| panic!("{binary_only} is a dependency"));
        assert!(
            line.contains("optional = true"),
            "{binary_only} must be optional (the `cli` feature): {line}"
        );
    }
    let files = rust_files(Path::new(SRC));
    // The binary's files: main.rs and its modules under src/cli/.
    let binary = |f: &&PathBuf| f.ends_with("main.rs") || f.starts_with(Path::new(SRC).join("cli"));
    for file in files.iter().filter(|f| !binary(f)) {
        let source = std::fs::read_to_string(file).expect("read");
        for binary_only in [
            "clap::",
            "tracing_subscriber::",
            "mimalloc::",
            "opentelemetry_sdk::",
            "opentelemetry_otlp::",
            "prometheus_parse::",
        ] {
            assert!(
                !source.contains(binary_only),
                "{} uses {binary_only}, which only the binary has",
                file.display()
            );
        }
    }
}

#[test]
fn the_store_has_no_unsafe_code() {
    for file in rust_files(&Path::new(SRC).join("store")) {
        let source = std::fs::read_to_string(&file).expect("read");
        assert!(
            !source.contains("unsafe "),
            "{} has unsafe code",
            file.display()
        );
    }
}

/// With `autotests = false` a file dropped into `tests/` and named nowhere
/// would never be compiled, its tests silently not run: every file there is
/// a module of the `integration` binary (`mod name;` in `tests/main.rs`) or
/// a `[[test]]` of its own in `Cargo.toml`, never both.
#[test]
fn every_test_file_is_compiled_once() {
    let root = env!("CARGO_MANIFEST_DIR");
    let tests = Path::new(root).join("tests");
    let main = std::fs::read_to_string(tests.join("main.rs")).expect("read tests/main.rs");
    let modules: BTreeSet<String> = main
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect();
    let manifest = std::fs::read_to_string(Path::new(root).join("Cargo.toml")).expect("read");
    let binaries: BTreeSet<String> = manifest
        .lines()
        .filter_map(|line| line.strip_prefix("path = \"tests/")?.strip_suffix(".rs\""))
        .map(str::to_owned)
        .collect();
    assert!(binaries.contains("main"), "tests/main.rs is no [[test]]");
    assert!(
        modules.contains("support") && binaries.len() > 1,
        "read no modules or binaries"
    );
    for entry in std::fs::read_dir(&tests).expect("read tests/") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let file = path.extension().is_some_and(|e| e == "rs");
        let folder_module = path.join("mod.rs").exists();
        if !(file || folder_module) || name == "main" {
            continue;
        }
        let (module, binary) = (modules.contains(&name), binaries.contains(&name));
        // A folder beside a binary of the same name holds that binary's
        // modules (`tests/faults/`).
        if folder_module || !file {
            assert!(module, "tests/{name}/ is not a module of tests/main.rs");
            continue;
        }
        assert!(
            module != binary,
            "tests/{name}.rs must be either `mod {name};` in tests/main.rs or a \
             [[test]] in Cargo.toml (module: {module}, binary: {binary})"
        );
    }
}

/// Files over [`MAX_FILE_LINES`], with their length outside tests.
fn files_over_the_limit(files: &[PathBuf]) -> Vec<(usize, String)> {
    let mut over: Vec<(usize, String)> = files
        .iter()
        .map(|file| {
            let lines = source_outside_tests(file).lines().count();
            let relative = file.strip_prefix(SRC).unwrap_or(file);
            (lines, relative.display().to_string())
        })
        .filter(|(lines, _)| *lines > MAX_FILE_LINES)
        .collect();
    over.sort_by(|a, b| b.cmp(a));
    over
}

#[test]
fn no_file_in_src_is_over_the_line_limit() {
    let files = rust_files(Path::new(SRC));
    assert!(files.len() > 50, "read only {} files", files.len());
    let over = files_over_the_limit(&files);
    assert!(
        over.is_empty(),
        "files over {MAX_FILE_LINES} lines outside their tests (split each along its jobs, \
         one job per file): {over:?}"
    );
}

#[test]
fn the_line_limit_check_counts_lines_outside_tests() {
    let dir = std::env::temp_dir().join(format!("a2a-structure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let long = dir.join("long.rs");
    let code = "fn f() {}\n".repeat(MAX_FILE_LINES + 1);
    std::fs::write(&long, format!("//! Long.\n{code}")).expect("write");
    let tested = dir.join("tested.rs");
    let tests = "fn t() {}\n".repeat(MAX_FILE_LINES * 2);
    std::fs::write(
        &tested,
        format!("//! Short, long tests.\nfn f() {{}}\n#[cfg(test)]\nmod tests {{\n{tests}}}\n"),
    )
    .expect("write");
    let over = files_over_the_limit(&[long.clone(), tested]);
    std::fs::remove_dir_all(&dir).expect("clean up");
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(over[0].0, MAX_FILE_LINES + 2);
}

/// `cargo doc` reads as a map: every file under `src/` opens with a
/// module doc line (`//! ...`) that says what it owns.
#[test]
fn every_file_opens_with_a_doc_line() {
    for file in rust_files(Path::new(SRC)) {
        let source = std::fs::read_to_string(&file).expect("read");
        let first = source.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("//! ") && first.len() > 12,
            "{} does not open with a `//!` line saying what it owns: {first:?}",
            file.display()
        );
    }
}

/// The `.rs` files docs/architecture.md's map names: its code block that
/// starts with `src/`, one entry per line, two spaces of indent per level
/// below `src/`, a folder's name ending in `/`, then the entry's job.
fn files_in_the_map(doc: &str) -> BTreeSet<String> {
    let block = doc
        .split("```")
        .find(|block| block.trim_start().starts_with("src/"))
        .expect("docs/architecture.md has a code block that starts with `src/`");
    let mut folders: Vec<String> = Vec::new();
    let mut files = BTreeSet::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let indent = line.len() - line.trim_start().len();
        assert!(indent % 2 == 0, "odd indent in the map: {line:?}");
        let name = line.split_whitespace().next().expect("an entry");
        folders.truncate(indent / 2);
        let path = format!("{}{name}", folders.concat());
        if name.ends_with('/') {
            folders.push(name.to_owned());
        } else {
            assert!(name.ends_with(".rs"), "not a file or folder: {line:?}");
            files.insert(path);
        }
    }
    files
}

/// docs/architecture.md's map of `src/` names every file there, and
/// nothing that is not there, so it matches the tree.
#[test]
fn the_architecture_map_matches_the_tree() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
        .expect("read docs/architecture.md");
    let mapped = files_in_the_map(&doc);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree: BTreeSet<String> = rust_files(Path::new(SRC))
        .iter()
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    let missing: Vec<_> = tree.difference(&mapped).collect();
    let gone: Vec<_> = mapped.difference(&tree).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/architecture.md's map of src/ is out of date: not in the map: {missing:?}; \
         in the map but not in src/: {gone:?}"
    );
}

#[test]
fn the_map_reader_reads_nested_folders() {
    let doc = "x\n```\nsrc/\n  lib.rs   the crate\n  a/       a folder\n    mod.rs  its root\n    b/\n      c.rs  deep\n  d.rs  back up\n```\n";
    let files: Vec<String> = files_in_the_map(doc).into_iter().collect();
    assert_eq!(
        files,
        ["src/a/b/c.rs", "src/a/mod.rs", "src/d.rs", "src/lib.rs"]
    );
}

/// The types, traits and aliases a source declares at its top level
/// (not a trait's or an impl's associated types, nor a function's own).
fn declared_types(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in source
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
    {
        let mut words = line.split_whitespace().peekable();
        // Visibility first (`pub`, `pub(crate)`, `pub(super)`), if any.
        if words.peek().is_some_and(|w| w.starts_with("pub")) {
            words.next();
        }
        let (Some(kind), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        if matches!(kind, "struct" | "enum" | "trait" | "type" | "union") {
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

/// A type's name means one thing in the crate: two types of one name (a
/// struct in one module, an enum in another) make every reader ask which.
#[test]
fn every_type_name_is_unique_in_the_crate() {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in rust_files(Path::new(SRC)) {
        let relative = file.strip_prefix(SRC).unwrap().display().to_string();
        for name in declared_types(&source_outside_tests(&file)) {
            seen.entry(name).or_default().push(relative.clone());
        }
    }
    assert!(seen.len() > 100, "read only {} type names", seen.len());
    let twice: Vec<_> = seen.iter().filter(|(_, files)| files.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "type names declared more than once: {twice:?}"
    );
}

#[test]
fn the_type_reader_finds_declarations() {
    let source = "pub struct A {\n}\npub(crate) enum B { X }\ntype C = u8;\nimpl S for A {\n    type Error = u8;\n}\nfn struct_like() {}\n// struct D\ntrait E {}\n";
    assert_eq!(declared_types(source), ["A", "B", "C", "E"]);
}

/// The docs and README name only source files that exist: a file split or
/// renamed takes its mentions along.
#[test]
fn the_docs_name_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root.join("README.md"));
    assert!(docs.len() > 3, "{docs:?}");
    let mut stale = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("read doc");
        for (at, _) in text.match_indices("src/") {
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '/' | '.'))
                .collect();
            let path = path.trim_end_matches('.');
            let preceded_by_word = text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '/' | '-'));
            if !preceded_by_word && path.ends_with(".rs") && !root.join(path).exists() {
                stale.push(format!("{}: {path}", doc.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "docs name files that do not exist: {stale:?}"
    );
}

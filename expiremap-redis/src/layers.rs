//! The crate's layers, checked: each module names (`crate::` paths in
//! code, comments left out) only modules listed before it in [`LAYERS`],
//! so no module reaches up and no two import each other. A cheap guard
//! (it reads the files under `src/`); ARCHITECTURE.md draws the layers.

use std::fs;
use std::path::Path;

/// The modules from the bottom up, by layer. A module may name the
/// modules listed before it, in its layer or below. The top layer is one
/// room in several files: the crate root (`lib`, whose items such as
/// `NearCache` a `crate::Name` path names) and the files that extend
/// `NearCache` name each other freely.
const LAYERS: &[(&str, &[&str])] = &[
    ("the crate's errors and counts", &["error", "monitor"]),
    ("bytes and TLS", &["wire"]),
    ("the lease waits", &["waiters"]),
    ("dialing and the handshake", &["connect"]),
    ("slots and redirects", &["slots"]),
    (
        "the ops and their replies",
        &["codec", "reply", "script", "op"],
    ),
    ("one connection", &["link", "expirations"]),
    ("the cluster's links", &["cluster"]),
    ("fleet-wide loading", &["lease"]),
];

/// The top layer (see [`LAYERS`]).
const TOP: &[&str] = &["prefix", "lib", "builder", "load", "nonblocking", "layers"];

/// Where `module` stands: its place in [`LAYERS`] (`usize::MAX` for the
/// top layer), or `None` if it is in no layer.
fn rank(module: &str) -> Option<usize> {
    if TOP.contains(&module) {
        return Some(usize::MAX);
    }
    LAYERS
        .iter()
        .flat_map(|(_, modules)| modules.iter())
        .position(|m| *m == module)
}

/// `text` without comments: lines that start with `//` are dropped, and
/// the rest of a line from a `//` on (a string with `//` in it loses its
/// tail too, which only hides paths from the check, never adds one).
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The first segment of each path a `crate::` in `code` names: the
/// module, or for an item of the crate root, `lib`. A braced group names
/// the first segment of each of its members.
fn named(code: &str) -> Vec<String> {
    const PREFIX: &str = concat!("crate", "::");
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let first = |s: &str| -> String { s.trim().chars().take_while(|&c| is_ident(c)).collect() };
    let mut out = Vec::new();
    for (at, _) in code.match_indices(PREFIX) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == '$') {
            continue;
        }
        let rest = &code[at + PREFIX.len()..];
        let names: Vec<String> = match rest.strip_prefix('{') {
            Some(group) => {
                let (mut depth, mut end) = (1, group.len());
                for (i, c) in group.char_indices() {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                let mut items = Vec::new();
                let (mut depth, mut start) = (0, 0);
                for (i, c) in group[..end].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(first(&group[start..i]));
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                items.push(first(&group[start..end]));
                items
            }
            None => vec![first(rest)],
        };
        for n in names.into_iter().filter(|n| !n.is_empty()) {
            let module = match n.chars().next() {
                Some(c) if c.is_ascii_lowercase() => n,
                _ => "lib".to_string(),
            };
            out.push(module);
        }
    }
    out
}

/// What `module`'s `text` names against the layers: one message per
/// path that reaches up (or sideways to a later module of its layer), or
/// names a module in no layer.
fn arrows(module: &str, text: &str) -> Vec<String> {
    let Some(own) = rank(module) else {
        return vec![format!("`{module}` is in no layer of LAYERS")];
    };
    let mut bad = Vec::new();
    for target in named(&code(text)) {
        if target == module {
            continue;
        }
        match rank(&target) {
            None => bad.push(format!("`{module}` names `{target}`, which is in no layer")),
            Some(usize::MAX) if own == usize::MAX => {}
            Some(r) if r < own => {}
            Some(_) => bad.push(format!("`{module}` names `{target}`, above it")),
        }
    }
    bad
}

/// Every `.rs` file under `dir`, with the module it belongs to: its first
/// path segment under `src/` (`link/reader.rs` is `link`'s; `lib.rs` the
/// root's).
fn files(dir: &Path, module: Option<&str>, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let owner = module.unwrap_or(stem).to_string();
        if path.is_dir() {
            files(&path, Some(&owner), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("a source file");
            out.push((owner, text));
        }
    }
}

#[test]
fn every_module_names_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, None, &mut all);
    assert!(all.len() > 20, "{} files under src/", all.len());
    let bad: Vec<String> = all.iter().flat_map(|(m, text)| arrows(m, text)).collect();
    assert!(
        bad.is_empty(),
        "arrows against the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_back_arrow_or_a_circle_is_caught() {
    assert!(arrows("op", "use crate::reply;\nuse crate::error::Error;").is_empty());
    // Up a layer, in a braced group over lines, through the crate root.
    assert_eq!(arrows("wire", "use crate::connect::Config;").len(), 1);
    assert_eq!(
        arrows("link", "use crate::{\n    codec,\n    lease::Release,\n};").len(),
        1
    );
    assert_eq!(
        arrows("cluster", "fn f(c: &crate::NearCache<u8, u8>) {}").len(),
        1
    );
    // Sideways within a layer, to a module listed later.
    assert_eq!(arrows("reply", "let x = crate::op::PUT;").len(), 1);
    // A comment, a doc link and another crate's path are no arrows.
    assert!(
        arrows(
            "wire",
            "/// [`crate::link`]\n// crate::lease\nuse expiremap::crate_x;"
        )
        .is_empty()
    );
    assert_eq!(arrows("nowhere", "").len(), 1);
}

//! The repository stands alone: no tracked file points outside it, and no relative link in
//! a Markdown file is dead. A clone has nothing but the repository.

use crate::support::OutputWithin as _;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The folder the design notes once lived in, next to the repository (spelled in two parts
/// so that this file does not match itself).
const OUTSIDE: &str = concat!("..", "/shared");

/// Every tracked `.md`, `.rs`, `.toml` and `.json` file, as a path from the root, with its text.
fn tracked_texts() -> Vec<(String, String)> {
    let out =
        Command::new("git").args(["ls-files"]).current_dir(ROOT).output_within().expect("git ls-files runs");
    assert!(out.status.success(), "git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    let names = String::from_utf8(out.stdout).expect("git ls-files prints UTF-8 paths");
    names
        .lines()
        .filter(|f| [".md", ".rs", ".toml", ".json"].iter().any(|ext| f.ends_with(ext)))
        // A tracked file deleted in the working tree has nothing to check.
        .filter_map(|f| Some((f.to_string(), std::fs::read_to_string(Path::new(ROOT).join(f)).ok()?)))
        .collect()
}

/// The targets of Markdown links `[text](target)` that name a relative path: no URL, no
/// `mailto:`, no Rust path (`crate::x`), no anchor alone; without `#anchor` or title.
fn relative_links(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find([')', ' ', '\n'])?];
            let target = target.split('#').next().unwrap_or("").trim_matches(['<', '>']);
            (!target.is_empty() && !target.contains(':') && !target.starts_with('/')).then_some(target)
        })
        .collect()
}

/// `target`, relative to the file `file`, as a path from the root; `None` when it climbs
/// out of the repository.
fn resolve(file: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = file.split('/').collect();
    parts.pop(); // the file's own name
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(parts.join("/"))
}

#[test]
fn no_tracked_file_points_outside_the_repository() {
    let mut bad = Vec::new();
    for (file, text) in tracked_texts() {
        if text.contains(OUTSIDE) {
            bad.push(format!("{file}: mentions {OUTSIDE}"));
        }
        for target in relative_links(&text) {
            if resolve(&file, target).is_none() {
                bad.push(format!("{file}: link ({target}) leads outside the repository"));
            }
        }
    }
    assert!(bad.is_empty(), "paths outside the repository:\n{}", bad.join("\n"));
}

#[test]
fn relative_links_in_markdown_lead_to_files_that_exist() {
    let mut dead = Vec::new();
    // Rust doc comments link to items (`[Foo](Bar)`), not files: Markdown files only.
    for (file, text) in tracked_texts().into_iter().filter(|(f, _)| f.ends_with(".md")) {
        for target in relative_links(&text) {
            match resolve(&file, target) {
                Some(path) if Path::new(ROOT).join(&path).exists() => {}
                // Leaving the repository is the other test's finding.
                None => {}
                Some(path) => dead.push(format!("{file}: link ({target}) to {path}, which does not exist")),
            }
        }
    }
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

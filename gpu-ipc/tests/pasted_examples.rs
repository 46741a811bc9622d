//! The Rust examples of README.md and docs/interop.md are what users paste: the doc tests compile them
//! (`ReadmeDocTests`, `InteropDocTests` in src/lib.rs), and this test makes sure what compiles is all there is to
//! paste: no rustdoc hidden line (`# ...`), which the doc test would see and a reader's copy would not, and no
//! block the doc tests skip (`ignore`).

use std::path::Path;

/// The Rust blocks of a Markdown file: (line of the opening fence, info string, lines).
fn rust_blocks(markdown: &str) -> Vec<(usize, String, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, Vec<String>)> = None;
    for (n, line) in markdown.lines().enumerate() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match open.take() {
                Some(block) => blocks.push(block),
                None => open = Some((n + 1, info.trim().to_owned(), Vec::new())),
            }
        } else if let Some((_, _, lines)) = open.as_mut() {
            lines.push(line.to_owned());
        }
    }
    blocks.retain(|(_, info, _)| info.split(',').next() == Some("rust"));
    blocks
}

/// `file` of the checkout, found at run time (cargo and cargo-nextest set `CARGO_MANIFEST_DIR` to this package's
/// directory, nextest to the remapped tree), so the suite runs from a checkout at another path than its build's.
fn checkout_file(file: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|| panic!("CARGO_MANIFEST_DIR is not set: run the tests with cargo or cargo-nextest"));
    Path::new(&dir).join("..").join(file)
}

/// What a reader's copy of `file` would lack or skip, one line each.
fn problems(file: &str) -> Vec<String> {
    let path = checkout_file(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut found = Vec::new();
    for (fence, info, lines) in rust_blocks(&text) {
        if info.split(',').any(|attr| attr == "ignore") {
            found.push(format!("{file}:{fence}: `{info}` is not compiled by the doc tests"));
        }
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            // rustdoc hides `#` alone and `# ...`; `#[...]` and `#![...]` are attributes, shown as written.
            if code == "#" || code.starts_with("# ") {
                found.push(format!("{file}:{}: hidden line `{code}`", fence + 1 + i));
            }
        }
    }
    found
}

#[test]
fn readme_and_interop_examples_compile_as_pasted() {
    let found: Vec<String> = ["README.md", "docs/interop.md"].iter().flat_map(|file| problems(file)).collect();
    assert!(found.is_empty(), "examples that differ from what the doc tests compile:\n{}", found.join("\n"));
}

#[test]
fn both_files_have_rust_examples_to_check() {
    for file in ["README.md", "docs/interop.md"] {
        let path = checkout_file(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!rust_blocks(&text).is_empty(), "{file} has no Rust example: this test checks nothing there");
    }
}

#[test]
fn a_hidden_line_and_an_ignored_block_are_found() {
    let blocks = rust_blocks("text\n```rust,ignore\nlet a = 1;\n# let b = 2;\n```\n```sh\n# a comment\n```\n");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].0, 2);
    assert_eq!(blocks[0].1, "rust,ignore");
    assert_eq!(blocks[0].2, vec!["let a = 1;".to_owned(), "# let b = 2;".to_owned()]);
}

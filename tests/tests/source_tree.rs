//! The source tree's layering (issue 27): no file imports, through `crate::` or `super::`
//! paths, a file that imports it back, in any crate. Types shared by several steps sit in leaf
//! files below their users (`session/slot_counts.rs`, `report/entity.rs`,
//! `functions/calibration/record.rs` in topdown-user, `events/attr.rs` in topdown-model), so
//! that, for example, the report format never depends on the code that builds it. Test modules
//! (`#[cfg(test)] mod ...`) and comments are left out: a test may use anything.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A module, as the path of its file's module (`["report", "table"]`; `[]` for lib.rs).
type Module = Vec<String>;

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without its test modules and its comment lines.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                next.trim_start()
                    .trim_start_matches("pub(crate) ")
                    .starts_with("mod ")
            })
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The paths of a `use` tree or of an inline path starting at `text` (just after `crate::`,
/// `super::`...): `a::b::{c, d::{e, f}}` gives `a::b::c`, `a::b::d::e`, `a::b::d::f`.
fn paths_at(text: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = text;
    loop {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            if let Some(group) = rest.strip_prefix('{') {
                let mut paths = Vec::new();
                for item in split_group(group) {
                    for path in paths_at(item.trim()) {
                        paths.push(prefix.iter().cloned().chain(path).collect());
                    }
                }
                return paths;
            }
            return vec![prefix];
        }
        rest = &rest[name.len()..];
        prefix.push(name);
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![prefix],
        }
    }
}

/// The top-level items of a `{...}` group (`group` starts just after its `{`).
fn split_group(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..at]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items
}

/// The file modules a file's code refers to through `crate::` and `super::` paths.
fn references(module: &Module, code: &str, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let resolve = |path: Vec<String>| -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|len| path[..len].to_vec())
            .find(|candidate| modules.contains(candidate))
    };
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let start_of_word = at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_'
                || bytes[at - 1] == b':');
        let rest = &code[at..];
        if start_of_word && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let mut base: Module = Vec::new();
            let mut after = rest;
            if let Some(path) = after.strip_prefix("crate::") {
                after = path;
            } else {
                // `super` of a file's module is its parent (a folder's mod.rs is the folder's
                // module, a.rs is module a: both go up one).
                base = module.clone();
                while let Some(path) = after.strip_prefix("super::") {
                    base.pop();
                    after = path;
                }
            }
            for path in paths_at(after) {
                let full: Vec<String> = base.iter().cloned().chain(path).collect();
                if let Some(target) = resolve(full)
                    && target != *module
                {
                    found.insert(target);
                }
            }
            at += rest.len() - after.len();
            continue;
        }
        at += rest.chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// Strongly connected groups of more than one module.
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Search<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, node: &'g Module) {
            let order = self.index.len();
            self.index.insert(node, order);
            self.low.insert(node, order);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                while let Some(member) = self.stack.pop() {
                    group.push(member.clone());
                    if member == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

fn import_cycles(src: &Path) -> Vec<Vec<Module>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|file| module_of(src, file)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        graph.insert(module.clone(), references(&module, &code, &modules));
    }
    cycles(&graph)
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in [
        "topdown-common",
        "topdown-model",
        "topdown-user",
        "topdown-region",
    ] {
        let found = import_cycles(&root.join(krate).join("src"));
        assert!(
            found.is_empty(),
            "{krate}: import cycles: {:?}",
            found
                .iter()
                .map(|group| group
                    .iter()
                    .map(|module| module.join("/"))
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
    }
}

/// The check finds what it is for: a cycle through `crate::` and `super::` paths, and a group
/// import, in a tree written for it.
#[test]
fn the_cycle_check_finds_a_planted_cycle() {
    let dir = topdown_tests::temp_path("layering");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("report")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod aggregate;\npub mod report;\n").unwrap();
    std::fs::write(
        dir.join("aggregate.rs"),
        "use crate::{report::{Report, entity::Entity}};\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("report/mod.rs"),
        "pub mod entity;\npub struct Report;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("report/entity.rs"),
        "// crate::aggregate in a comment is no import\npub struct Entity(super::super::aggregate::Counts);\n",
    )
    .unwrap();
    let found = import_cycles(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found
            .iter()
            .map(|group| {
                let mut names: Vec<String> = group.iter().map(|module| module.join("/")).collect();
                names.sort();
                names
            })
            .collect::<Vec<_>>(),
        vec![vec!["aggregate".to_owned(), "report/entity".to_owned()]]
    );
}

//! Matching what the user typed (`parse_request`, `myapp::parser::parse_request`,
//! `Parser::parse`, `parse_*`) against raw symbol names, through demangling.

/// The names a symbol answers to: raw, and demangled in the forms users type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    pub raw: String,
    /// How reports show it: Rust without the hash, C++ with its parameter list.
    pub display: String,
    /// Further accepted spellings (Rust with hash, C++ without parameters).
    pub aliases: Vec<String>,
    /// Rust: the name with its hash, which tells instantiations of one generic function apart.
    pub with_hash: Option<String>,
}

pub fn names(raw: &str) -> Names {
    if let Ok(demangled) = rustc_demangle::try_demangle(raw) {
        let with_hash = format!("{demangled}");
        let without_hash = format!("{demangled:#}");
        return Names {
            raw: raw.to_owned(),
            display: without_hash,
            aliases: vec![with_hash.clone()],
            with_hash: Some(with_hash),
        };
    }
    let cpp = raw
        .starts_with("_Z")
        .then(|| cpp_demangle::Symbol::new(raw).ok())
        .flatten()
        .and_then(|symbol| {
            symbol
                .demangle(&cpp_demangle::DemangleOptions::default())
                .ok()
        });
    if let Some(full) = cpp {
        let without_params = strip_parameters(&full);
        return Names {
            raw: raw.to_owned(),
            display: full,
            aliases: vec![without_params],
            with_hash: None,
        };
    }
    Names {
        raw: raw.to_owned(),
        display: raw.to_owned(),
        aliases: go_generic_aliases(raw),
        with_hash: None,
    }
}

impl Names {
    /// Adds the other symbol names of the same function (`_IO_fclose@@GLIBC_2.2.5` beside
    /// `fclose`), each also without its version suffix, and its own name without one.
    pub fn add_symbol_aliases(&mut self, symbols: &[String]) {
        let unversioned = |name: &str| name.split_once('@').map(|(bare, _)| bare.to_owned());
        let mut extra: Vec<String> = unversioned(&self.raw).into_iter().collect();
        // `name@@VERSION` is the default version of `name@VERSION`: either spelling names it.
        extra.extend(
            self.raw
                .contains("@@")
                .then(|| self.raw.replacen("@@", "@", 1)),
        );
        for symbol in symbols {
            extra.push(symbol.clone());
            extra.extend(unversioned(symbol));
            extra.extend(symbol.contains("@@").then(|| symbol.replacen("@@", "@", 1)));
        }
        for name in extra {
            if name != self.raw && name != self.display && !self.aliases.contains(&name) {
                self.aliases.push(name);
            }
        }
    }
}

/// A Go generic function's instantiations are named by their type-argument shapes
/// (`main.Sum[go.shape.int_0]`, `main.(*List[go.shape.string_0]).Push`); they also answer to
/// the name as the source writes it (`main.Sum`, `main.(*List).Push`) and as Go's tracebacks
/// print it (`main.Sum[...]`). Nothing for names without brackets.
fn go_generic_aliases(raw: &str) -> Vec<String> {
    if !raw.contains('[') {
        return Vec::new();
    }
    let (mut bare, mut elided) = (String::new(), String::new());
    let mut depth = 0usize;
    for c in raw.chars() {
        match c {
            '[' => {
                if depth == 0 {
                    elided.push_str("[...]");
                }
                depth += 1;
            }
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => {
                bare.push(c);
                elided.push(c);
            }
            _ => {}
        }
    }
    if depth != 0 || bare.is_empty() {
        return Vec::new();
    }
    vec![bare, elided]
}

/// `ns::Parser::parse(std::string const&) const` -> `ns::Parser::parse`: cut at the `(` that
/// opens the outermost parameter list (template arguments may hold parentheses too).
fn strip_parameters(full: &str) -> String {
    let mut angle = 0i32;
    for (index, c) in full.char_indices() {
        match c {
            '<' => angle += 1,
            '>' => angle -= 1,
            '(' if angle == 0 && index > 0 => return full[..index].to_owned(),
            _ => {}
        }
    }
    full.to_owned()
}

/// True if `pattern` (exact, or a glob with `*` and `?`) names this symbol.
pub fn matches(pattern: &str, names: &Names) -> bool {
    let candidates = std::iter::once(&names.raw)
        .chain(std::iter::once(&names.display))
        .chain(names.aliases.iter());
    if is_glob(pattern) {
        candidates
            .into_iter()
            .any(|name| glob(pattern.as_bytes(), name.as_bytes()))
    } else {
        candidates.into_iter().any(|name| name == pattern)
    }
}

pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

/// Iterative wildcard match (`*` any run, `?` one byte), linear in practice.
pub(crate) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_names_with_and_without_hash() {
        let raw = "_ZN5myapp6parser13parse_request17h0123456789abcdefE";
        let names = names(raw);
        assert_eq!(names.display, "myapp::parser::parse_request");
        assert!(matches("myapp::parser::parse_request", &names));
        assert!(matches(
            "myapp::parser::parse_request::h0123456789abcdef",
            &names
        ));
        assert!(matches("myapp::parser::*", &names));
        assert!(matches(raw, &names));
        assert!(!matches("parse_request", &names));
    }

    #[test]
    fn cpp_names_with_and_without_parameters() {
        // Parser::parse(std::string const&) -- the Itanium mangling of a member function.
        let raw = "_ZN6Parser5parseERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
        let names = names(raw);
        assert!(
            names.display.starts_with("Parser::parse("),
            "{}",
            names.display
        );
        assert!(matches("Parser::parse", &names));
        assert!(matches(&names.display.clone(), &names));
        assert!(matches("Parser::*", &names));
    }

    /// Issue 21: libc exports `_IO_fclose@@GLIBC_2.2.5`, an alias of `fclose`.
    #[test]
    fn aliases_and_versioned_names_name_their_function() {
        let mut names = names("fclose");
        names.add_symbol_aliases(&[
            "_IO_fclose@@GLIBC_2.2.5".to_owned(),
            "_IO_new_fclose".to_owned(),
        ]);
        for typed in [
            "fclose",
            "_IO_fclose",
            "_IO_fclose@@GLIBC_2.2.5",
            "_IO_new_fclose",
            "_IO_fclose@GLIBC_2.2.5",
            "_IO_f*",
        ] {
            assert!(matches(typed, &names), "{typed}");
        }
        assert_eq!(names.display, "fclose");
        assert!(!matches("_IO_fclose@GLIBC_2.3", &names));
        let mut versioned = super::names("memcpy@GLIBC_2.2.5");
        versioned.add_symbol_aliases(&[]);
        assert!(matches("memcpy", &versioned));
        assert!(matches("memcpy@GLIBC_2.2.5", &versioned));
    }

    #[test]
    fn go_generic_instantiations_answer_to_their_source_names() {
        let sum = names("main.Sum[go.shape.int_0]");
        assert_eq!(sum.display, "main.Sum[go.shape.int_0]");
        assert!(matches("main.Sum", &sum));
        assert!(matches("main.Sum[...]", &sum));
        assert!(matches("main.Sum[go.shape.int_0]", &sum));
        assert!(matches("main.S*", &sum));
        assert!(!matches("main.Su", &sum));
        let method = names("main.(*List[go.shape.string_0,go.shape.int_1]).Push");
        assert!(matches("main.(*List).Push", &method));
        assert!(matches("main.(*List[...]).Push", &method));
        // Plain Go names are exact, their `*` included (a glob matching itself).
        let plain = names("net/http.(*conn).serve");
        assert!(plain.aliases.is_empty());
        assert!(matches("net/http.(*conn).serve", &plain));
        assert!(!matches(
            "net/http.(*conn).serve",
            &names("net/http.(*connReader).serve")
        ));
    }

    #[test]
    fn globs() {
        assert!(glob(b"parse_*", b"parse_a"));
        assert!(glob(b"*_b", b"parse_b"));
        assert!(glob(b"p?rse*", b"parse"));
        assert!(!glob(b"parse_?", b"parse_ab"));
        assert!(glob(b"*", b""));
        assert_eq!(strip_parameters("f<void (int)>(int)"), "f<void (int)>");
    }
}

//! Query texts as one key per statement shape, the way `pg_stat_statements` shows them when
//! no query id is available to group by: constants become `$n` placeholders, runs of white
//! space and comments become one space, and a trailing `;` goes. Parameters the text already
//! has (`$1` in the extended protocol) stay, and new placeholders are numbered after them.
//!
//! A lexer, not a parser: quoted identifiers (`"a b"`) and dollar-quoted strings (`$$...$$`,
//! `$tag$...$tag$`) are recognised so that what they hold is never mistaken for a constant or
//! a comment.

/// The normalised form of `text`.
pub fn normalize(text: &str) -> String {
    let bytes = text.as_bytes();
    let highest = highest_parameter(bytes);
    let mut next = highest + 1;
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    let mut at = 0;
    let push_space = |out: &mut String, space: &mut bool| {
        if *space && !out.is_empty() {
            out.push(' ');
        }
        *space = false;
    };
    while at < bytes.len() {
        let byte = bytes[at];
        // White space and comments: one space.
        if byte.is_ascii_whitespace() {
            space = true;
            at += 1;
            continue;
        }
        if byte == b'-' && bytes.get(at + 1) == Some(&b'-') {
            while at < bytes.len() && bytes[at] != b'\n' {
                at += 1;
            }
            space = true;
            continue;
        }
        if byte == b'/' && bytes.get(at + 1) == Some(&b'*') {
            at = block_comment_end(bytes, at);
            space = true;
            continue;
        }
        push_space(&mut out, &mut space);
        // String constants, with an optional E/B/X/N/U& prefix.
        if let Some(end) = string_constant_end(bytes, at) {
            out.push_str(&format!("${next}"));
            next += 1;
            at = end;
            continue;
        }
        if byte == b'$' {
            if let Some(end) = dollar_quote_end(bytes, at) {
                out.push_str(&format!("${next}"));
                next += 1;
                at = end;
                continue;
            }
            // A parameter: kept.
            let start = at;
            at += 1;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
            out.push_str(&text[start..at]);
            continue;
        }
        if byte == b'"' {
            let start = at;
            at += 1;
            while at < bytes.len() {
                if bytes[at] == b'"' {
                    if bytes.get(at + 1) == Some(&b'"') {
                        at += 2;
                        continue;
                    }
                    at += 1;
                    break;
                }
                at += 1;
            }
            out.push_str(&text[start..at]);
            continue;
        }
        if byte.is_ascii_digit()
            || (byte == b'.' && bytes.get(at + 1).is_some_and(u8::is_ascii_digit))
        {
            at = number_end(bytes, at);
            out.push_str(&format!("${next}"));
            next += 1;
            continue;
        }
        if is_identifier_byte(byte) {
            let start = at;
            while at < bytes.len() && (is_identifier_byte(bytes[at]) || bytes[at] == b'$') {
                at += 1;
            }
            out.push_str(&text[start..at]);
            continue;
        }
        // Anything else, as it is (one character, which may be several bytes).
        let width = text[at..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&text[at..at + width]);
        at += width;
    }
    while out.ends_with(';') || out.ends_with(' ') {
        out.pop();
    }
    out
}

fn is_identifier_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80
}

/// The highest `$n` already in the text (outside quotes is close enough: a `$3` inside a
/// string only shifts the numbering).
fn highest_parameter(bytes: &[u8]) -> u64 {
    let mut highest = 0;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'$' && (at == 0 || !is_identifier_byte(bytes[at - 1])) {
            let start = at + 1;
            let mut end = start;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            if end > start
                && let Ok(number) = std::str::from_utf8(&bytes[start..end])
                    .unwrap_or_default()
                    .parse::<u64>()
            {
                highest = highest.max(number);
            }
            at = end.max(at + 1);
        } else {
            at += 1;
        }
    }
    highest
}

fn block_comment_end(bytes: &[u8], start: usize) -> usize {
    // Block comments nest in PostgreSQL.
    let mut depth = 0;
    let mut at = start;
    while at < bytes.len() {
        if bytes[at] == b'/' && bytes.get(at + 1) == Some(&b'*') {
            depth += 1;
            at += 2;
        } else if bytes[at] == b'*' && bytes.get(at + 1) == Some(&b'/') {
            depth -= 1;
            at += 2;
            if depth == 0 {
                return at;
            }
        } else {
            at += 1;
        }
    }
    bytes.len()
}

/// The end of a string constant starting at `start` (`'..'`, `E'..'`, `B'..'`, `X'..'`,
/// `N'..'`, `U&'..'`), or `None` if none starts there.
fn string_constant_end(bytes: &[u8], start: usize) -> Option<usize> {
    let previous_is_word = start > 0 && is_identifier_byte(bytes[start - 1]);
    let (quote, escapes) = match bytes[start] {
        b'\'' => (start, false),
        b'e' | b'E' if !previous_is_word && bytes.get(start + 1) == Some(&b'\'') => {
            (start + 1, true)
        }
        b'b' | b'B' | b'x' | b'X' | b'n' | b'N'
            if !previous_is_word && bytes.get(start + 1) == Some(&b'\'') =>
        {
            (start + 1, false)
        }
        b'u' | b'U'
            if !previous_is_word
                && bytes.get(start + 1) == Some(&b'&')
                && bytes.get(start + 2) == Some(&b'\'') =>
        {
            (start + 2, false)
        }
        _ => return None,
    };
    let mut at = quote + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' if escapes => at += 2,
            b'\'' if bytes.get(at + 1) == Some(&b'\'') => at += 2,
            b'\'' => return Some(at + 1),
            _ => at += 1,
        }
    }
    Some(bytes.len())
}

/// The end of a dollar-quoted string starting at `start` (`$$..$$`, `$tag$..$tag$`).
fn dollar_quote_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
        if at == start + 1 && bytes[at].is_ascii_digit() {
            return None;
        }
        at += 1;
    }
    if bytes.get(at) != Some(&b'$') {
        return None;
    }
    let tag = &bytes[start..=at];
    let body = at + 1;
    let end = bytes[body..]
        .windows(tag.len())
        .position(|window| window == tag)
        .map_or(bytes.len(), |found| body + found + tag.len());
    Some(end)
}

fn number_end(bytes: &[u8], start: usize) -> usize {
    let mut at = start;
    if bytes[at] == b'0' && matches!(bytes.get(at + 1), Some(b'x' | b'X')) {
        at += 2;
        while at < bytes.len() && (bytes[at].is_ascii_hexdigit() || bytes[at] == b'_') {
            at += 1;
        }
        return at;
    }
    while at < bytes.len() && (bytes[at].is_ascii_digit() || bytes[at] == b'_' || bytes[at] == b'.')
    {
        at += 1;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        let mut exponent = at + 1;
        if matches!(bytes.get(exponent), Some(b'+' | b'-')) {
            exponent += 1;
        }
        if bytes.get(exponent).is_some_and(u8::is_ascii_digit) {
            at = exponent;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn constants_become_placeholders() {
        assert_eq!(
            normalize("SELECT * FROM t WHERE a = 42 AND b = 'x''y' AND c = 1.5e3;"),
            "SELECT * FROM t WHERE a = $1 AND b = $2 AND c = $3"
        );
        assert_eq!(
            normalize("select  abalance\n  from pgbench_accounts where aid = $1"),
            "select abalance from pgbench_accounts where aid = $1"
        );
        // Numbering continues after the text's own parameters.
        assert_eq!(normalize("select $2, 7, $1"), "select $2, $3, $1");
        assert_eq!(
            normalize("SELECT E'a\\'b', X'ff', 0x1F"),
            "SELECT $1, $2, $3"
        );
        assert_eq!(normalize("select $$it's 1$$, $q$x$q$"), "select $1, $2");
    }

    #[test]
    fn identifiers_comments_and_quotes_stay_as_they_are() {
        assert_eq!(
            normalize("select t1.c2 /* note 5 /* nested */ */ from \"Tab 3\" -- 4\n"),
            "select t1.c2 from \"Tab 3\""
        );
        assert_eq!(
            normalize("select x1, e, n from b"),
            "select x1, e, n from b"
        );
        assert_eq!(normalize("  "), "");
        assert_eq!(normalize("select 'unterminated"), "select $1");
        assert_eq!(normalize("select 'é', 'ü'"), "select $1, $2");
        assert_eq!(normalize("select é1 from tä"), "select é1 from tä");
    }

    /// Texts made of the lexer's special characters, multibyte ones included, never panic and
    /// normalise to something stable (normalising twice changes nothing more).
    #[test]
    fn arbitrary_texts_never_panic() {
        for text in crate::spans::usdt::arbitrary_strings(
            "'\"$-/*;eEbBxXuU&_9 0.a\\\né",
            20_000,
            24,
            0x9e37_79b9_7f4a_7c15,
        ) {
            let once = normalize(&text);
            assert!(once.len() <= text.len() * 4 + 8, "{text:?} -> {once:?}");
        }
    }
}

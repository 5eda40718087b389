//! The tokens of XLA's HLO text, as far as sharding attributes use them: XLA's lexer rules for
//! spaces, comments, names, numbers and strings, so that text XLA reads is read alike.

/// One token; positions are byte offsets into the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token<'a> {
    LBrace,
    RBrace,
    LSquare,
    RSquare,
    LParen,
    RParen,
    Comma,
    /// `<=`, which opens an iota device order.
    Leq,
    /// An integer as written: `-` and the digits. Its value is read where it is used, since
    /// what fits depends on the use.
    Int(&'a str),
    /// A name: `[A-Za-z_][A-Za-z0-9_.-]*`.
    Ident(&'a str),
    /// A name followed at once by `=` (`devices=`); the `=` is part of the token.
    Attr(&'a str),
    /// A quoted string whose escapes are valid.
    Str,
    Eof,
    /// Text that starts no token, or a malformed one; says what was wrong.
    Error(&'static str),
}

pub(crate) struct Lexer<'a> {
    text: &'a str,
    pos: usize,
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        &self.text.as_bytes()[self.pos..]
    }

    /// Skips spaces and comments; an unterminated `/*` is left for `next` to reject. As in XLA,
    /// whose lexer reads a NUL byte as the end of the text, a NUL ends a comment unterminated,
    /// and a line comment ends at a carriage return too.
    fn skip_space(&mut self) {
        loop {
            let rest = self.bytes();
            match rest {
                [b' ' | b'\t' | b'\n' | b'\r', ..] => self.pos += 1,
                [b'/', b'/', ..] => {
                    let end = rest.iter().position(|&c| matches!(c, b'\n' | b'\r' | 0));
                    self.pos += end.unwrap_or(rest.len());
                }
                [b'/', b'*', tail @ ..] => {
                    let end = tail.windows(2).position(|w| w == b"*/");
                    match end.filter(|&end| !tail[..end].contains(&0)) {
                        Some(end) => self.pos += 2 + end + 2,
                        None => return,
                    }
                }
                _ => return,
            }
        }
    }

    /// The next token and where it starts.
    pub(crate) fn next(&mut self) -> (Token<'a>, usize) {
        self.skip_space();
        let start = self.pos;
        let rest = self.bytes();
        let Some(&first) = rest.first() else {
            return (Token::Eof, start);
        };
        let single = match first {
            b'{' => Some(Token::LBrace),
            b'}' => Some(Token::RBrace),
            b'[' => Some(Token::LSquare),
            b']' => Some(Token::RSquare),
            b'(' => Some(Token::LParen),
            b')' => Some(Token::RParen),
            b',' => Some(Token::Comma),
            _ => None,
        };
        if let Some(token) = single {
            self.pos += 1;
            return (token, start);
        }
        let token = match first {
            b'<' if rest.get(1) == Some(&b'=') => {
                self.pos += 2;
                Token::Leq
            }
            b'"' | b'\'' => self.string(first),
            b'-' | b'0'..=b'9' => self.int(),
            c if is_name_start(c) => {
                let len = rest.iter().take_while(|&&c| is_name_char(c)).count();
                let name = &self.text[start..start + len];
                self.pos += len;
                if self.bytes().first() == Some(&b'=') {
                    self.pos += 1;
                    Token::Attr(name)
                } else {
                    Token::Ident(name)
                }
            }
            b'/' => Token::Error("an unterminated comment"),
            _ => Token::Error("a character that starts no token"),
        };
        (token, start)
    }

    /// `-?[0-9]+`. As in XLA, a number may run straight into a name (`3replicated` is `3` and
    /// `replicated`), but not into what XLA reads as a float or a shape pattern (`1.5`, `1e3`,
    /// `2x4`, `1_2`).
    fn int(&mut self) -> Token<'a> {
        let start = self.pos;
        let rest = self.bytes();
        let sign = usize::from(rest[0] == b'-');
        let digits = rest[sign..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return Token::Error("a digit after '-'");
        }
        let end = sign + digits;
        let next = rest.get(end).copied();
        let after = rest.get(end + 1).copied();
        let pattern = match next {
            Some(b'.') => true,
            Some(b'e' | b'E') => matches!(after, Some(b'0'..=b'9' | b'+' | b'-')),
            Some(b'x' | b'_') => after.is_some_and(|c| c.is_ascii_digit()),
            _ => false,
        };
        if pattern {
            return Token::Error("an integer");
        }
        self.pos += end;
        Token::Int(&self.text[start..start + end])
    }

    /// A string quoted by `quote`; a backslash escapes the next character, and the escapes must
    /// be ones that C unescaping reads (as XLA's `absl::CUnescape` does).
    fn string(&mut self, quote: u8) -> Token<'a> {
        let rest = self.bytes();
        let mut i = 1;
        while i < rest.len() {
            match rest[i] {
                b'\\' => i += 2,
                c if c == quote => {
                    let body = &rest[1..i];
                    self.pos += i + 1;
                    return if valid_escapes(body) {
                        Token::Str
                    } else {
                        Token::Error("a string with valid escapes")
                    };
                }
                _ => i += 1,
            }
        }
        Token::Error("a closing quote")
    }
}

fn hex_value(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |acc, &c| {
        let d = char::from(c).to_digit(16)?;
        acc.checked_mul(16)?.checked_add(d)
    })
}

/// Whether every escape in a string body is one that C unescaping accepts: `\n`-style letters,
/// up to three octal digits, `\x` with hex digits (all that follow) below 0x100, `\u` with 4 and
/// `\U` with 8 hex digits naming a Unicode scalar value.
fn valid_escapes(body: &[u8]) -> bool {
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(&c) = body.get(i + 1) else {
            return false;
        };
        i += 2;
        match c {
            b'a' | b'b' | b'f' | b'n' | b'r' | b't' | b'v' | b'\\' | b'\'' | b'"' | b'?' => {}
            b'0'..=b'7' => {
                let more = body[i..]
                    .iter()
                    .take(2)
                    .take_while(|c| (b'0'..=b'7').contains(c))
                    .count();
                let value = body[i - 1..i + more]
                    .iter()
                    .fold(0u32, |acc, &d| acc * 8 + u32::from(d - b'0'));
                if value > 0xff {
                    return false;
                }
                i += more;
            }
            b'x' => {
                let len = body[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_hexdigit())
                    .count();
                // As in C, `\x` with no digits is left alone, and the digits run on.
                if len > 0 && hex_value(&body[i..i + len]).is_none_or(|v| v > 0xff) {
                    return false;
                }
                i += len;
            }
            b'u' | b'U' => {
                let len = if c == b'u' { 4 } else { 8 };
                let digits = body.get(i..i + len);
                let value = digits
                    .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
                    .and_then(hex_value);
                if value.and_then(char::from_u32).is_none() {
                    return false;
                }
                i += len;
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<Token<'_>> {
        let mut lexer = Lexer::new(text);
        let mut out = Vec::new();
        loop {
            let (token, _) = lexer.next();
            out.push(token);
            if matches!(token, Token::Eof | Token::Error(_)) {
                return out;
            }
        }
    }

    #[test]
    fn names_numbers_and_punctuation() {
        assert_eq!(
            tokens("{devices=[2,007]<=[4]T(1,0) /* x */ shard_as 3}"),
            vec![
                Token::LBrace,
                Token::Attr("devices"),
                Token::LSquare,
                Token::Int("2"),
                Token::Comma,
                Token::Int("007"),
                Token::RSquare,
                Token::Leq,
                Token::LSquare,
                Token::Int("4"),
                Token::RSquare,
                Token::Ident("T"),
                Token::LParen,
                Token::Int("1"),
                Token::Comma,
                Token::Int("0"),
                Token::RParen,
                Token::Ident("shard_as"),
                Token::Int("3"),
                Token::RBrace,
                Token::Eof
            ]
        );
        assert_eq!(
            tokens("3replicated // to the end\n-0"),
            vec![
                Token::Int("3"),
                Token::Ident("replicated"),
                Token::Int("-0"),
                Token::Eof
            ]
        );
        assert_eq!(
            tokens("devices ="),
            vec![
                Token::Ident("devices"),
                Token::Error("a character that starts no token")
            ]
        );
    }

    #[test]
    fn malformed_tokens_are_errors() {
        for text in [
            "1.5", "1e3", "2x4", "1_2", "-", "/* open", "/", "é", "\"open", "< =", "/* \0 */",
            "// a\0b",
        ] {
            assert!(
                matches!(tokens(text).last(), Some(Token::Error(_))),
                "{text}: {:?}",
                tokens(text)
            );
        }
    }

    #[test]
    fn a_line_comment_ends_at_a_carriage_return() {
        assert_eq!(tokens("// a\rb"), vec![Token::Ident("b"), Token::Eof]);
    }

    #[test]
    fn string_escapes_follow_c_unescaping() {
        for good in [
            r#""a\nb""#,
            r#""\"""#,
            r"'\''",
            r#""\101\0\377""#,
            r#""\x41z""#,
            r#""\x""#,
            r#""\u00e9""#,
            r#""\U0001F600""#,
            "\"raw\nline\"",
            r#""\1234""#,
        ] {
            assert_eq!(tokens(good), vec![Token::Str, Token::Eof], "{good}");
        }
        for bad in [
            r#""\q""#,
            r#""\8""#,
            r#""\400""#,
            r#""\x41b""#,
            r#""\xfff""#,
            r#""\u00""#,
            r#""\uD800""#,
            r#""\U00110000""#,
            r#""abc\""#,
        ] {
            assert!(matches!(tokens(bad)[0], Token::Error(_)), "{bad}");
        }
    }
}

//! Checks of a module's text that XLA's own parsers leave to assertions or to the stack:
//! `compile_hlo` takes text from other frontends, and XLA aborts the process on a parameter
//! number beyond its computation's parameters or on an entry layout of another parameter
//! count, and overflows its stack on brackets nested some thousands deep (HLO shapes, MLIR
//! regions). Each check names the line (1-based) where the text goes wrong.

use std::fmt;

/// How deeply brackets may nest in a module's text. Real modules nest a few dozen levels (tuple
/// shapes, regions of control flow); XLA's recursive parsers crash some thousands deep, sooner
/// on a small thread stack.
pub const MAX_NESTING: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrecheckError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for PrecheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for PrecheckError {}

fn error(line: usize, message: impl Into<String>) -> PrecheckError {
    PrecheckError {
        line,
        message: message.into(),
    }
}

/// The text with string literals and comments blanked to spaces (newlines kept, so that lines
/// keep their numbers): what the checks read is never inside either. An unterminated string or
/// comment runs to the end, as its parser would reject it anyway.
fn significant(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                blank(&mut out, start, i);
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let start = i;
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                blank(&mut out, start, i);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let start = i;
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(bytes.len());
                blank(&mut out, start, i);
            }
            _ => i += 1,
        }
    }
    out
}

/// The line of byte offset `at`.
fn line_of(text: &[u8], at: usize) -> usize {
    text[..at].split(|&b| b == b'\n').count()
}

/// Checks that brackets (`(`, `[`, `{`, and `<` where `angles`) nest at most `MAX_NESTING`
/// deep. A `>` of `->` closes nothing.
fn check_nesting(text: &[u8], angles: bool) -> Result<(), PrecheckError> {
    let mut depth = 0usize;
    for (i, &b) in text.iter().enumerate() {
        let opens = matches!(b, b'(' | b'[' | b'{') || (angles && b == b'<');
        let closes = matches!(b, b')' | b']' | b'}')
            || (angles && b == b'>' && (i == 0 || text[i - 1] != b'-'));
        if opens {
            depth += 1;
            if depth > MAX_NESTING {
                return Err(error(
                    line_of(text, i),
                    format!("brackets nest deeper than {MAX_NESTING} levels"),
                ));
            }
        } else if closes {
            depth = depth.saturating_sub(1);
        }
    }
    Ok(())
}

/// Checks StableHLO/MLIR text before MLIR parses it.
pub fn check_mlir_text(text: &str) -> Result<(), PrecheckError> {
    check_nesting(&significant(text), true)
}

/// The byte range of the bracketed group that opens at `open` (which holds `(`, `[` or `{`),
/// inside the brackets; None if it does not close.
fn group(text: &[u8], open: usize) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    for (i, &b) in text.iter().enumerate().skip(open) {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some((open + 1, i));
                }
            }
            _ => {}
        }
    }
    None
}

/// The parts of `text` separated by commas outside brackets, trimmed; none for blank text.
fn top_level_items(text: &[u8]) -> Vec<&[u8]> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, &b) in text.iter().enumerate() {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                items.push(trim(&text[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = trim(&text[start..]);
    if !(items.is_empty() && last.is_empty()) {
        items.push(last);
    }
    items
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => &[],
    }
}

/// A shape as compared here: its text without layouts (`{1,0}`) or spaces.
fn bare_shape(shape: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(shape.len());
    let mut braces = 0usize;
    for &b in shape {
        match b {
            b'{' => braces += 1,
            b'}' => braces = braces.saturating_sub(1),
            _ if braces > 0 || b.is_ascii_whitespace() => {}
            _ => out.push(b),
        }
    }
    out
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'%')
}

/// One computation of an HLO module: where it starts, its signature's parameter shapes (if it
/// has a signature) and its `parameter(n)` instructions.
struct Computation {
    line: usize,
    entry: bool,
    signature: Option<Vec<Vec<u8>>>,
    /// Each parameter instruction: its line, number, shape, and whether its sharding is manual.
    parameters: Vec<(usize, i64, Vec<u8>, bool)>,
}

/// The computation that a line opens (`[ENTRY] %name (p: shape, ...) -> shape {`), if it does.
fn computation_header(line: &[u8], number: usize) -> Option<Computation> {
    let text = trim(line);
    if text.last() != Some(&b'{') || text.contains(&b'=') {
        return None;
    }
    let (entry, rest) = match text.strip_prefix(b"ENTRY") {
        Some(rest) if rest.first().is_some_and(u8::is_ascii_whitespace) => (true, trim(rest)),
        _ => (false, text),
    };
    let name_end = rest.iter().position(|&b| !is_name_char(b))?;
    if name_end == 0 {
        return None;
    }
    let after_name = &rest[name_end..];
    let signature = match after_name.iter().position(|b| !b.is_ascii_whitespace()) {
        Some(at) if after_name[at] == b'(' => {
            let (from, to) = group(after_name, at)?;
            let params = top_level_items(&after_name[from..to])
                .into_iter()
                .map(|p| {
                    let shape = p.iter().position(|&b| b == b':').map_or(p, |c| &p[c + 1..]);
                    bare_shape(shape)
                })
                .collect();
            Some(params)
        }
        _ => None,
    };
    Some(Computation {
        line: number,
        entry,
        signature,
        parameters: Vec::new(),
    })
}

/// The parameter instruction on a line (`%p = shape parameter(n), ...`): its number (None when
/// not an integer), shape, and whether its sharding is `{manual}`.
fn parameter_instruction(line: &[u8]) -> Option<(Option<i64>, Vec<u8>, bool)> {
    let eq = line.iter().position(|&b| b == b'=')?;
    let rhs = &line[eq + 1..];
    let at = find_word(rhs, b"parameter(")?;
    let shape = bare_shape(&rhs[..at]);
    let (from, to) = group(rhs, at + b"parameter".len())?;
    let number = std::str::from_utf8(trim(&rhs[from..to])).ok()?.parse().ok();
    let rest = &rhs[to..];
    let manual = find_word(rest, b"sharding=")
        .map(|s| trim(&rest[s + b"sharding=".len()..]))
        .is_some_and(|value| value.starts_with(b"{manual"));
    Some((number, shape, manual))
}

/// Where `word` occurs in `text` not preceded by a name character.
fn find_word(text: &[u8], word: &[u8]) -> Option<usize> {
    (0..text.len().saturating_sub(word.len() - 1))
        .find(|&i| text[i..].starts_with(word) && (i == 0 || !is_name_char(text[i - 1])))
}

/// Checks HLO text before XLA's parser reads it: bracket nesting; in each computation,
/// parameter numbers that are its parameters, each once; in the entry computation, no
/// `{manual}` parameter sharding (whose data lies nowhere that `compile_hlo` could place it);
/// and an `entry_computation_layout` of the entry's parameters.
pub fn check_hlo_text(text: &str) -> Result<(), PrecheckError> {
    let text = significant(text);
    check_nesting(&text, false)?;
    let mut computations: Vec<Computation> = Vec::new();
    let mut open: Option<Computation> = None;
    let mut header_layout: Option<(usize, Vec<Vec<u8>>)> = None;
    for (index, line) in text.split(|&b| b == b'\n').enumerate() {
        let number = index + 1;
        let trimmed = trim(line);
        if trimmed.starts_with(b"HloModule") && computations.is_empty() && open.is_none() {
            header_layout = entry_layout(trimmed).map(|params| (number, params));
            continue;
        }
        match &mut open {
            None => open = computation_header(line, number),
            Some(computation) => {
                if trimmed == b"}" {
                    computations.extend(open.take());
                } else if let Some((n, shape, manual)) = parameter_instruction(line) {
                    let Some(n) = n else {
                        return Err(error(number, "a parameter number that is not an integer"));
                    };
                    computation.parameters.push((number, n, shape, manual));
                }
            }
        }
    }
    computations.extend(open);
    for computation in &computations {
        check_parameters(computation)?;
    }
    if let (Some((line, layout)), Some(entry)) =
        (header_layout, computations.iter().find(|c| c.entry))
    {
        let mut shapes: Vec<(i64, &Vec<u8>)> = entry
            .parameters
            .iter()
            .map(|(_, n, s, _)| (*n, s))
            .collect();
        shapes.sort_unstable();
        let entry_shapes: Vec<&Vec<u8>> = match &entry.signature {
            Some(signature) => signature.iter().collect(),
            None => shapes.into_iter().map(|(_, s)| s).collect(),
        };
        if layout.len() != entry_shapes.len() {
            return Err(error(
                line,
                format!(
                    "the entry_computation_layout has {} parameters, the entry computation {}",
                    layout.len(),
                    entry_shapes.len()
                ),
            ));
        }
        for (i, (given, own)) in layout.iter().zip(entry_shapes).enumerate() {
            if given != own {
                return Err(error(
                    line,
                    format!(
                        "the entry_computation_layout gives parameter {i} the shape {}, the \
                         entry computation {}",
                        String::from_utf8_lossy(given),
                        String::from_utf8_lossy(own)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The parameter shapes of the header's `entry_computation_layout={(...)->...}`, if it has one.
fn entry_layout(header: &[u8]) -> Option<Vec<Vec<u8>>> {
    let at = find_word(header, b"entry_computation_layout=")?;
    let brace = at + b"entry_computation_layout=".len();
    if header.get(brace) != Some(&b'{') {
        return None;
    }
    let (from, to) = group(header, brace)?;
    let inner = &header[from..to];
    let paren = inner.iter().position(|&b| b == b'(')?;
    let (from, to) = group(inner, paren)?;
    Some(
        top_level_items(&inner[from..to])
            .into_iter()
            .map(bare_shape)
            .collect(),
    )
}

fn check_parameters(computation: &Computation) -> Result<(), PrecheckError> {
    let count = computation
        .signature
        .as_ref()
        .map_or(computation.parameters.len(), Vec::len);
    let mut seen = vec![false; count];
    for &(line, n, ref shape, manual) in &computation.parameters {
        let Some(slot) = usize::try_from(n).ok().and_then(|n| seen.get_mut(n)) else {
            return Err(error(
                line,
                format!("parameter({n}) in a computation of {count} parameters"),
            ));
        };
        if std::mem::replace(slot, true) {
            return Err(error(line, format!("parameter({n}) is declared twice")));
        }
        if let Some(declared) = computation.signature.as_ref().map(|s| &s[n as usize]) {
            if declared != shape {
                return Err(error(
                    line,
                    format!(
                        "parameter({n}) has the shape {}, where its computation declares {}",
                        String::from_utf8_lossy(shape),
                        String::from_utf8_lossy(declared)
                    ),
                ));
            }
        }
        if manual && computation.entry {
            return Err(error(
                line,
                format!(
                    "entry parameter({n}) has the sharding {{manual}}, which says nothing of \
                     where its data lies"
                ),
            ));
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(error(
            computation.line,
            format!("the computation has no parameter({missing}) instruction"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD: &str = "HloModule add, entry_computation_layout={(f32[8,4]{1,0}, f32[8,4]{1,0})->(f32[8,4]{1,0})}

%add.3 (x.4: f32[8,4], y.5: f32[8,4]) -> f32[8,4] {
  %x.4 = f32[8,4]{1,0} parameter(0)
  %y.5 = f32[8,4]{1,0} parameter(1)
  ROOT %add.6 = f32[8,4]{1,0} add(f32[8,4]{1,0} %x.4, f32[8,4]{1,0} %y.5)
}

ENTRY %main.9 (p0.1: f32[8,4], p1.2: f32[8,4]) -> (f32[8,4]) {
  %p0.1 = f32[8,4]{1,0} parameter(0), sharding={devices=[2,1]0,1}, metadata={op_name=\"parameter(7)\"}
  %p1.2 = f32[8,4]{1,0} parameter(1), sharding={devices=[2,1]0,1}
  %call.7 = f32[8,4]{1,0} call(f32[8,4]{1,0} %p0.1, f32[8,4]{1,0} %p1.2), to_apply=%add.3
  ROOT %tuple.8 = (f32[8,4]{1,0}) tuple(f32[8,4]{1,0} %call.7)
}
";

    fn line_of_error(text: &str) -> usize {
        check_hlo_text(text).unwrap_err().line
    }

    #[test]
    fn a_well_formed_module_passes() {
        assert_eq!(check_hlo_text(ADD), Ok(()));
        // Without signatures, header layout or shardings, as some frontends write it.
        let bare = "HloModule m\n\nENTRY %main {\n  %a = f32[2] parameter(0)\n  ROOT %n = f32[2] negate(%a)\n}\n";
        assert_eq!(check_hlo_text(bare), Ok(()));
    }

    #[test]
    fn a_parameter_beyond_the_computation_is_named() {
        let text = ADD.replace(
            "%y.5 = f32[8,4]{1,0} parameter(1)",
            "%y.5 = f32[8,4]{1,0} parameter(5)",
        );
        let err = check_hlo_text(&text).unwrap_err();
        assert_eq!(err.line, 5);
        assert!(
            err.message.contains("parameter(5) in a computation of 2"),
            "{err}"
        );
        let text = ADD.replace("parameter(1), sharding", "parameter(-1), sharding");
        assert_eq!(line_of_error(&text), 11);
        let text = ADD.replace("parameter(1), sharding", "parameter(0), sharding");
        assert!(check_hlo_text(&text).unwrap_err().message.contains("twice"));
    }

    #[test]
    fn a_manual_entry_parameter_is_named() {
        let text = ADD.replace(
            "parameter(1), sharding={devices=[2,1]0,1}",
            "parameter(1), sharding={manual}",
        );
        let err = check_hlo_text(&text).unwrap_err();
        assert_eq!(err.line, 11);
        assert!(err.message.contains("{manual}"), "{err}");
    }

    #[test]
    fn an_entry_layout_that_disagrees_is_named() {
        let three = ADD.replace(
            "{(f32[8,4]{1,0}, f32[8,4]{1,0})->",
            "{(f32[8,4]{1,0}, f32[8,4]{1,0}, f32[8,4]{1,0})->",
        );
        let err = check_hlo_text(&three).unwrap_err();
        assert_eq!(err.line, 1);
        assert!(
            err.message
                .contains("3 parameters, the entry computation 2"),
            "{err}"
        );
        let other = ADD.replace(
            "{(f32[8,4]{1,0}, f32[8,4]{1,0})->",
            "{(f32[8,4]{1,0}, s32[2]{0})->",
        );
        assert_eq!(line_of_error(&other), 1);
    }

    #[test]
    fn deep_brackets_are_named_where_they_pass_the_limit() {
        for n in [MAX_NESTING, 10_000, 100_000] {
            let deep = format!("{}f32[8,4]{{1,0}}{}", "(".repeat(n), ")".repeat(n));
            let text = ADD.replace(
                "ROOT %tuple.8 = (f32[8,4]{1,0})",
                &format!("ROOT %tuple.8 = {deep}"),
            );
            let err = check_hlo_text(&text).unwrap_err();
            assert_eq!(err.line, 13, "{n}");
            assert!(err.message.contains("nest deeper"), "{err}");
        }
        // Brackets inside strings and comments do not count.
        let quoted = ADD.replace("\"parameter(7)\"", &format!("\"{}\"", "(".repeat(1000)));
        assert_ne!(quoted, ADD);
        assert_eq!(check_hlo_text(&quoted), Ok(()));
        let commented = ADD.replace("\n\nENTRY", &format!("\n/* {} */\nENTRY", "{".repeat(1000)));
        assert_eq!(check_hlo_text(&commented), Ok(()));
        let regions = |n: usize| {
            let mut inner = "%0 = stablehlo.constant dense<1.0> : tensor<f32>".to_owned();
            for _ in 0..n {
                inner = format!("\"stablehlo.optimization_barrier\"() ({{{inner}}}) : () -> ()");
            }
            format!("module @m {{\n  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {{\n  {inner}\n    return %a : tensor<2xf32>\n  }}\n}}\n")
        };
        assert_eq!(check_mlir_text(&regions(20)), Ok(()));
        assert_eq!(check_mlir_text(&regions(5000)).unwrap_err().line, 3);
        let types = format!("{}tensor<2xf32>{}", "tuple<".repeat(300), ">".repeat(300));
        assert_eq!(check_mlir_text(&types).unwrap_err().line, 1);
    }

    /// A small deterministic generator, so that the property runs without dependencies.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// `text` mutated as a fuzzer would: bytes replaced, inserted, removed, spans repeated.
    fn mutate(rng: &mut Rng, text: &str) -> String {
        const ALPHABET: &[u8] = b"(){}[]<>,=%:\"/*\\\n 0123456789-parametrENTRYmanual";
        let mut bytes = text.as_bytes().to_vec();
        for _ in 0..=rng.below(6) {
            let at = rng.below(bytes.len() + 1);
            match rng.below(5) {
                0 if at < bytes.len() => bytes[at] = ALPHABET[rng.below(ALPHABET.len())],
                1 => bytes.insert(at, ALPHABET[rng.below(ALPHABET.len())]),
                2 if at < bytes.len() => {
                    bytes.remove(at);
                }
                3 => {
                    let end = (at + 1 + rng.below(12)).min(bytes.len());
                    let repeated = bytes[at.min(end)..end].repeat(rng.below(3000));
                    bytes.splice(at..at, repeated);
                }
                _ => {
                    let digit = b'0' + rng.below(10) as u8;
                    bytes.insert(at, digit);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn mutated_modules_never_panic_and_errors_name_a_line_of_the_text() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mlir = "module @m {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n    return %a : tensor<2xf32>\n  }\n}\n";
        for _ in 0..3000 {
            for (text, check) in [
                (mutate(&mut rng, ADD), check_hlo_text as fn(&str) -> _),
                (mutate(&mut rng, mlir), check_mlir_text),
            ] {
                if let Err(err) = check(&text) {
                    let lines = text.split('\n').count();
                    assert!((1..=lines).contains(&err.line), "{err} of {lines} lines");
                }
            }
        }
    }
}

//! GBNF (llama.cpp's EBNF dialect, the `ebnf` format SGLang documents) to llguidance Lark.
//!
//! GBNF rules are `name ::= alternatives`, ending at the end of the line unless a group or a
//! `|` continues them. Items are string literals (`"..."`), character classes (`[a-z]`,
//! `[^"\\]`), `.` (any character), rule names, groups `( ... )` and the repetitions `*`, `+`,
//! `?`, `{m}`, `{m,}`, `{m,n}`; `#` starts a comment. `<token>` references a special token.
//! The `root` rule is where the language starts.
//!
//! Rules that use only literals, classes and other such rules (no recursion) become Lark
//! terminals (uppercase names, compiled into one regular expression); the others stay rules.
//! As in llguidance's own converter, the result follows llguidance's lexer: terminals do not
//! backtrack into each other once a longer lexeme has matched.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Deepest nesting of groups and repetitions in one rule. The parser and the emitter recurse
/// once per level, and llguidance's Lark parser refuses expressions nested about 30 deep
/// anyway, so deeper grammars are refused here with the position where the limit was passed.
pub const MAX_NESTING: usize = 24;

/// Converts a GBNF grammar with a `root` rule into llguidance's Lark dialect. Errors name the
/// line and column.
pub fn gbnf_to_lark(text: &str) -> Result<String, String> {
    let mut parser = Parser::new(text);
    let rules = parser.parse_grammar()?;
    emit(&rules, &parser.chars)
}

/// Whether `text` is already Lark rather than GBNF: it has a `start:` rule or begins with an
/// `%llguidance` header, and no `::=`.
pub(crate) fn looks_like_lark(text: &str) -> bool {
    if text.contains("::=") {
        return false;
    }
    let trimmed = text.trim_start();
    trimmed.starts_with("%llguidance")
        || text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("start:") || l.starts_with("start :")
        })
}

#[derive(Debug, Clone)]
enum Node {
    Literal(String),
    Class {
        negated: bool,
        items: Vec<(char, char)>,
    },
    Any,
    Ref {
        name: String,
        /// Character offset of the name, for messages.
        pos: usize,
    },
    Special(String),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

struct Rule {
    name: String,
    body: Node,
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    /// Groups open around the current position.
    depth: usize,
    _text: &'a str,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            chars: text.chars().collect(),
            pos: 0,
            depth: 0,
            _text: text,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, off: usize) -> Option<char> {
        self.chars.get(self.pos + off).copied()
    }

    fn location(&self) -> (usize, usize) {
        location(&self.chars, self.pos)
    }

    fn error(&self, message: impl std::fmt::Display) -> String {
        let (line, column) = self.location();
        format!("GBNF line {line} column {column}: {message}")
    }

    /// Skips blanks and comments, and newlines too when `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' || c == '\r' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn parse_grammar(&mut self) -> Result<Vec<Rule>, String> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut seen = HashSet::new();
        self.skip_space(true);
        while self.peek().is_some() {
            let rule = self.parse_rule()?;
            if !seen.insert(rule.name.clone()) {
                return Err(format!("GBNF: rule '{}' is defined twice", rule.name));
            }
            rules.push(rule);
            self.skip_space(true);
        }
        if rules.is_empty() {
            return Err("GBNF: the grammar is empty".into());
        }
        Ok(rules)
    }

    fn parse_name(&mut self) -> Result<String, String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(match self.peek() {
                Some(c) => format!("expected a rule name, found '{c}'"),
                None => "expected a rule name, found the end".to_string(),
            }));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn parse_rule(&mut self) -> Result<Rule, String> {
        let name = self.parse_name()?;
        self.skip_space(false);
        if !(self.peek() == Some(':')
            && self.peek_at(1) == Some(':')
            && self.peek_at(2) == Some('='))
        {
            return Err(self.error(format!("expected '::=' after rule name '{name}'")));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.parse_alternatives(false)?;
        self.skip_space(false);
        match self.peek() {
            None | Some('\n') | Some('\r') => Ok(Rule { name, body }),
            Some(c) => Err(self.error(format!("unexpected '{c}'"))),
        }
    }

    fn parse_alternatives(&mut self, nested: bool) -> Result<Node, String> {
        let mut alts = vec![self.parse_sequence(nested)?];
        loop {
            self.skip_space(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.parse_sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.remove(0)
        } else {
            Node::Alt(alts)
        })
    }

    fn too_deep(&self) -> String {
        self.error(format!(
            "groups and repetitions are nested more than {MAX_NESTING} deep (the limit)"
        ))
    }

    fn parse_sequence(&mut self, nested: bool) -> Result<Node, String> {
        let mut items: Vec<Node> = Vec::new();
        // Repetition operators applied to the last item so far (`"a"*?` nests two).
        let mut repeats = 0;
        loop {
            self.skip_space(nested);
            let Some(c) = self.peek() else { break };
            let item = match c {
                '"' => self.parse_literal()?,
                '[' => self.parse_class()?,
                '(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(self.too_deep());
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    let inner = self.parse_alternatives(true);
                    self.depth -= 1;
                    let inner = inner?;
                    self.skip_space(true);
                    if self.peek() != Some(')') {
                        return Err(self.error("expected ')'"));
                    }
                    self.pos += 1;
                    inner
                }
                '.' => {
                    self.pos += 1;
                    Node::Any
                }
                '<' => self.parse_special()?,
                '*' | '+' | '?' | '{' => {
                    let Some(last) = items.pop() else {
                        return Err(self.error(format!("'{c}' has nothing to repeat")));
                    };
                    repeats += 1;
                    if self.depth + repeats > MAX_NESTING {
                        return Err(self.too_deep());
                    }
                    let repeated = self.parse_repetition(last)?;
                    items.push(repeated);
                    continue;
                }
                c if is_word_char(c) => {
                    // Only the offset: a line and column cost a scan of the text, which is
                    // only worth it for an error.
                    let pos = self.pos;
                    let name = self.parse_name()?;
                    Node::Ref { name, pos }
                }
                _ => break,
            };
            repeats = 0;
            items.push(item);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Node::Seq(items)
        })
    }

    fn parse_repetition(&mut self, node: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => {
                self.pos += 1;
                (0, None)
            }
            Some('+') => {
                self.pos += 1;
                (1, None)
            }
            Some('?') => {
                self.pos += 1;
                (0, Some(1))
            }
            _ => {
                // '{'
                self.pos += 1;
                self.skip_space(true);
                let min = self.parse_count()?;
                self.skip_space(true);
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.pos += 1;
                        self.skip_space(true);
                        if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.parse_count()?)
                        } else {
                            None
                        }
                    }
                    _ => return Err(self.error("expected ',' or '}' in a repetition")),
                };
                self.skip_space(true);
                if self.peek() != Some('}') {
                    return Err(self.error("expected '}' to close the repetition"));
                }
                self.pos += 1;
                if max.is_some_and(|max| max < min) {
                    return Err(self.error("repetition maximum is below its minimum"));
                }
                (min, max)
            }
        };
        Ok(Node::Repeat {
            node: Box::new(node),
            min,
            max,
        })
    }

    fn parse_count(&mut self) -> Result<u32, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        digits
            .parse::<u32>()
            .map_err(|_| self.error("expected a repetition count"))
    }

    /// One character of a literal or class, escapes decoded.
    fn parse_char(&mut self) -> Result<char, String> {
        let Some(c) = self.peek() else {
            return Err(self.error("unexpected end inside a literal or class"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return Err(self.error("incomplete escape"));
        };
        self.pos += 1;
        let hex_len = match e {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            '0' => return Ok('\0'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' | '\'' => return Ok(e),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            other => return Err(self.error(format!("unknown escape '\\{other}'"))),
        };
        let end = self.pos + hex_len;
        if end > self.chars.len() {
            return Err(self.error("incomplete hex escape"));
        }
        let hex: String = self.chars[self.pos..end].iter().collect();
        let value = u32::from_str_radix(&hex, 16)
            .map_err(|_| self.error(format!("invalid hex escape '{hex}'")))?;
        self.pos = end;
        char::from_u32(value).ok_or_else(|| self.error(format!("invalid character U+{value:X}")))
    }

    fn parse_literal(&mut self) -> Result<Node, String> {
        self.pos += 1; // opening quote
        let mut s = String::new();
        loop {
            if self.peek() == Some('"') {
                self.pos += 1;
                return Ok(Node::Literal(s));
            }
            if matches!(self.peek(), Some('\n') | None) {
                return Err(self.error("unterminated string literal"));
            }
            s.push(self.parse_char()?);
        }
    }

    fn parse_class(&mut self) -> Result<Node, String> {
        self.pos += 1; // '['
        let negated = if self.peek() == Some('^') {
            self.pos += 1;
            true
        } else {
            false
        };
        let mut items = Vec::new();
        loop {
            match self.peek() {
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                None | Some('\n') => return Err(self.error("unterminated character class")),
                _ => {}
            }
            let lo = self.parse_char()?;
            let hi = if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                self.pos += 1;
                self.parse_char()?
            } else {
                lo
            };
            if hi < lo {
                return Err(self.error(format!("invalid class range '{lo}-{hi}'")));
            }
            items.push((lo, hi));
        }
        if items.is_empty() {
            return Err(self.error("empty character class"));
        }
        Ok(Node::Class { negated, items })
    }

    fn parse_special(&mut self) -> Result<Node, String> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            self.pos += 1;
            if c == '>' {
                let token: String = self.chars[start..self.pos].iter().collect();
                if token.len() <= 2 || token.chars().any(char::is_whitespace) {
                    break;
                }
                return Ok(Node::Special(token));
            }
            if c.is_whitespace() {
                break;
            }
        }
        self.pos = start;
        Err(self.error("expected a special token like <|end|>"))
    }
}

/// Line and column (from 1) of character `pos` of `chars`.
fn location(chars: &[char], pos: usize) -> (usize, usize) {
    let mut line = 1;
    let mut column = 1;
    for &c in &chars[..pos.min(chars.len())] {
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    (line, column)
}

/// Lark text for one GBNF rule body.
struct Emitter<'a> {
    names: &'a HashMap<String, String>,
    /// The grammar's text, for the positions in messages.
    chars: &'a [char],
}

impl Emitter<'_> {
    fn node(&self, node: &Node, out: &mut String, top: bool) -> Result<(), String> {
        match node {
            Node::Literal(s) => push_literal(out, s),
            Node::Class { negated, items } => {
                out.push_str("/[");
                if *negated {
                    out.push('^');
                }
                for &(lo, hi) in items {
                    push_class_char(out, lo);
                    if hi != lo {
                        out.push('-');
                        push_class_char(out, hi);
                    }
                }
                out.push_str("]/");
            }
            Node::Any => out.push_str("/(?s:.)/"),
            Node::Ref { name, pos } => match self.names.get(name) {
                Some(mapped) => out.push_str(mapped),
                None => {
                    let (line, column) = location(self.chars, *pos);
                    return Err(format!(
                        "GBNF line {line} column {column}: undefined rule '{name}'"
                    ));
                }
            },
            Node::Special(token) => out.push_str(token),
            Node::Seq(items) => {
                if items.is_empty() {
                    out.push_str("\"\"");
                }
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    self.atom(item, out, false)?;
                }
            }
            Node::Alt(alts) => {
                if !top {
                    out.push('(');
                }
                for (i, alt) in alts.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    self.node(alt, out, false)?;
                }
                if !top {
                    out.push(')');
                }
            }
            Node::Repeat { node, min, max } => {
                self.atom(node, out, true)?;
                match (min, max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (m, None) => {
                        let _ = write!(out, "{{{m},}}");
                    }
                    (m, Some(n)) if m == n => {
                        let _ = write!(out, "{{{m}}}");
                    }
                    (m, Some(n)) => {
                        let _ = write!(out, "{{{m},{n}}}");
                    }
                }
            }
        }
        Ok(())
    }

    /// A node as an item of a sequence or, when `repeated`, the operand of a repetition;
    /// parenthesised where the operator would bind differently.
    fn atom(&self, node: &Node, out: &mut String, repeated: bool) -> Result<(), String> {
        let needs_parens = match node {
            Node::Seq(items) => items.len() != 1,
            Node::Repeat { .. } => repeated,
            _ => false,
        };
        if needs_parens {
            out.push('(');
            self.node(node, out, false)?;
            out.push(')');
        } else {
            // Alternatives parenthesise themselves when not at the top.
            self.node(node, out, false)?;
        }
        Ok(())
    }
}

/// A Lark string literal (JSON string syntax; control characters and DEL escaped).
fn push_literal(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A character inside a regex class: alphanumerics as is, everything else as `\x{..}`.
fn push_class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    }
}

/// Adds the rules `node` refers to into `refs`; false when `node` holds something a terminal
/// cannot (a special token).
fn terminal_refs<'a>(node: &'a Node, refs: &mut HashSet<&'a str>) -> bool {
    match node {
        Node::Literal(_) | Node::Class { .. } | Node::Any => true,
        Node::Special(_) => false,
        Node::Ref { name, .. } => {
            refs.insert(name);
            true
        }
        Node::Seq(items) | Node::Alt(items) => items.iter().all(|n| terminal_refs(n, refs)),
        Node::Repeat { node, .. } => terminal_refs(node, refs),
    }
}

/// Largest terminal, in regex atoms with the terminals it refers to written out and counted
/// repetitions multiplied. A terminal is compiled into one regular expression; a chain of
/// rules that each add to the next (`a ::= b "x"`, `b ::= c "x"`, ...) would make one of
/// unbounded size that takes llguidance minutes to build. Past this size a rule stays a
/// rule, which matches the same text.
pub const MAX_TERMINAL_SIZE: usize = 1024;

/// Size of `node` as a terminal (see [`MAX_TERMINAL_SIZE`]), given the sizes of the
/// terminals it refers to; saturates.
fn terminal_size(node: &Node, sizes: &HashMap<&str, usize>) -> usize {
    match node {
        Node::Literal(s) => s.len().max(1),
        Node::Class { .. } | Node::Any | Node::Special(_) => 1,
        Node::Ref { name, .. } => sizes.get(name.as_str()).copied().unwrap_or(usize::MAX),
        Node::Seq(items) | Node::Alt(items) => items
            .iter()
            .fold(1usize, |acc, n| acc.saturating_add(terminal_size(n, sizes))),
        Node::Repeat { node, min, max } => {
            let copies = max.unwrap_or(*min).max(*min).max(1) as usize;
            terminal_size(node, sizes).saturating_mul(copies)
        }
    }
}

/// The rules that can be terminals: not `root` (the start symbol), no special tokens, every
/// rule they refer to a terminal too (so recursive rules never qualify), and no larger than
/// [`MAX_TERMINAL_SIZE`]. Found by propagating from the rules that refer to none, in time
/// linear in the grammar.
fn terminal_rules(rules: &[Rule]) -> HashSet<String> {
    let mut waiting_on: Vec<usize> = Vec::with_capacity(rules.len());
    let mut dependents: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut ready: Vec<usize> = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let mut refs = HashSet::new();
        let ok = terminal_refs(&r.body, &mut refs) && r.name != "root";
        // A rule that cannot be a terminal waits forever.
        waiting_on.push(if ok { refs.len() } else { usize::MAX });
        for name in refs {
            dependents.entry(name).or_default().push(i);
        }
        if ok && waiting_on[i] == 0 {
            ready.push(i);
        }
    }
    let mut terminal = HashSet::new();
    let mut sizes: HashMap<&str, usize> = HashMap::new();
    while let Some(i) = ready.pop() {
        let size = terminal_size(&rules[i].body, &sizes);
        if size > MAX_TERMINAL_SIZE {
            // Stays a rule; so do the rules built on it.
            continue;
        }
        sizes.insert(rules[i].name.as_str(), size);
        terminal.insert(rules[i].name.clone());
        for &j in dependents.get(rules[i].name.as_str()).into_iter().flatten() {
            if waiting_on[j] != usize::MAX {
                waiting_on[j] -= 1;
                if waiting_on[j] == 0 {
                    ready.push(j);
                }
            }
        }
    }
    terminal
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn emit(rules: &[Rule], chars: &[char]) -> Result<String, String> {
    if !rules.iter().any(|r| r.name == "root") {
        return Err("GBNF: the grammar has no 'root' rule".into());
    }
    let terminal = terminal_rules(rules);
    let mut names: HashMap<String, String> = HashMap::new();
    let mut used: HashSet<String> = HashSet::from(["start".to_string()]);
    // Next suffix to try per base name: names that sanitize alike take turns, not a scan.
    let mut next_suffix: HashMap<String, usize> = HashMap::new();
    for r in rules {
        let mapped = if r.name == "root" {
            "start".to_string()
        } else {
            let base = if terminal.contains(&r.name) {
                format!("T_{}", sanitize(&r.name).to_ascii_uppercase())
            } else {
                format!("r_{}", sanitize(&r.name).to_ascii_lowercase())
            };
            let mut candidate = base.clone();
            let n = next_suffix.entry(base.clone()).or_insert(2);
            while used.contains(&candidate) {
                candidate = format!("{base}_{n}");
                *n += 1;
            }
            candidate
        };
        used.insert(mapped.clone());
        names.insert(r.name.clone(), mapped);
    }
    let emitter = Emitter {
        names: &names,
        chars,
    };
    let mut out = String::from("%llguidance {}\n");
    for r in rules {
        out.push_str(&names[&r.name]);
        out.push_str(": ");
        emitter.node(&r.body, &mut out, true)?;
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn converts_alternatives_and_terminals() {
        let lark = gbnf_to_lark("root ::= \"yes\" | \"no\"").expect("converts");
        assert_eq!(lark, "%llguidance {}\nstart: \"yes\" | \"no\"\n");

        let lark = gbnf_to_lark(
            "root ::= item (\",\" item)*  # a list\nitem ::= [a-z]+ | num\nnum ::= [0-9]{1,3}\n",
        )
        .expect("converts");
        assert_eq!(
            lark,
            "%llguidance {}\nstart: T_ITEM (\",\" T_ITEM)*\nT_ITEM: /[a-z]/+ | T_NUM\nT_NUM: /[0-9]/{1,3}\n"
        );
    }

    #[test]
    fn recursive_rules_stay_rules_and_groups_span_lines() {
        let lark = gbnf_to_lark("root ::= expr\nexpr ::= (\n  \"(\" expr \")\"\n  | \"x\"\n)\n")
            .expect("converts");
        assert_eq!(
            lark,
            "%llguidance {}\nstart: r_expr\nr_expr: \"(\" r_expr \")\" | \"x\"\n"
        );
    }

    #[test]
    fn escapes_and_negated_classes() {
        let lark = gbnf_to_lark(r#"root ::= "\"" [^"\\\x00-\x1f]* "\"" "\n""#).expect("converts");
        assert_eq!(
            lark,
            "%llguidance {}\nstart: \"\\\"\" /[^\\x{22}\\x{5C}\\x{0}-\\x{1F}]/* \"\\\"\" \"\\n\"\n"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let err = gbnf_to_lark("root ::= foo").expect_err("undefined");
        assert!(err.contains("undefined rule 'foo'"), "{err}");
        let err = gbnf_to_lark("item ::= \"a\"").expect_err("no root");
        assert!(err.contains("no 'root' rule"), "{err}");
        let err = gbnf_to_lark("root ::= \"a").expect_err("unterminated");
        assert!(err.contains("unterminated"), "{err}");
        let err = gbnf_to_lark("root = \"a\"").expect_err("bad arrow");
        assert!(err.contains("::="), "{err}");
        let err = gbnf_to_lark("root ::= [z-a]").expect_err("bad range");
        assert!(err.contains("range"), "{err}");
        let err = gbnf_to_lark("root ::= \"a\"{3,1}").expect_err("bad repetition");
        assert!(err.contains("maximum"), "{err}");
        assert!(gbnf_to_lark("").is_err());
    }

    #[test]
    fn nesting_is_bounded() {
        let nested =
            |depth: usize| format!("root ::= {}\"a\"{}", "(".repeat(depth), ")".repeat(depth));
        // At the limit the grammar converts; one deeper, or thousands deeper, is an error that
        // names the limit (this ran the parser off the stack before the limit existed).
        assert!(gbnf_to_lark(&nested(MAX_NESTING)).is_ok());
        for depth in [MAX_NESTING + 1, 3_000, 100_000] {
            let err = gbnf_to_lark(&nested(depth)).expect_err("too deep");
            assert!(err.contains("nested more than 24 deep"), "{err}");
            assert!(err.contains("line 1 column"), "{err}");
        }
        // Stacked repetition operators nest too.
        let stars = format!("root ::= \"a\"{}", "*".repeat(100_000));
        let err = gbnf_to_lark(&stars).expect_err("too many repetitions");
        assert!(err.contains("nested more than"), "{err}");
        // Unbalanced deep input fails on the limit before it fails on the missing ')'.
        let open = format!("root ::= {}", "(".repeat(50_000));
        assert!(
            gbnf_to_lark(&open)
                .expect_err("too deep")
                .contains("nested")
        );
    }

    #[test]
    fn long_rule_chains_and_alike_names_convert_in_linear_time() {
        // 50,000 rules in a chain, listed from the root down: each is a terminal only once
        // the next one is (a pass per rule took quadratic time here).
        let n = 50_000;
        let mut text = String::from("root ::= r0\n");
        for i in 0..n {
            text.push_str(&format!("r{i} ::= r{} \"x\"\n", i + 1));
        }
        text.push_str(&format!("r{n} ::= \"a\"\n"));
        let lark = gbnf_to_lark(&text).expect("converts");
        // Terminals stop growing at the size limit: the rules above it stay rules.
        assert!(lark.contains("start: r_r0\n"), "{}", &lark[..200]);
        assert!(lark.contains("r_r0: r_r1 \"x\"\n"), "{}", &lark[..200]);
        let last = format!("T_R{n}: \"a\"\n");
        assert!(lark.contains(&last), "{last}");
        let terminals = lark.lines().filter(|l| l.starts_with("T_")).count();
        assert!(
            terminals > 100 && terminals <= MAX_TERMINAL_SIZE,
            "{terminals} terminals"
        );
        // A repetition counts its copies.
        let lark = gbnf_to_lark("root ::= big small\nbig ::= [a-z]{2000}\nsmall ::= [a-z]{20}\n")
            .expect("converts");
        assert!(lark.contains("start: r_big T_SMALL"), "{lark}");
        // Names that sanitize alike get distinct suffixes.
        let lark =
            gbnf_to_lark("root ::= a-b a_b A-b\na-b ::= \"1\"\na_b ::= \"2\"\nA-b ::= \"3\"\n")
                .expect("converts");
        assert!(lark.contains("start: T_A_B T_A_B_2 T_A_B_3"), "{lark}");
    }

    #[test]
    fn lark_is_recognised() {
        assert!(looks_like_lark("start: \"a\""));
        assert!(looks_like_lark("%llguidance {}\nstart: x\nx: \"a\""));
        assert!(!looks_like_lark("root ::= \"a\""));
    }
}

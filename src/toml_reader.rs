//! A reader over spanned TOML that collects *every* problem with its file and line.
//!
//! serde stops at the first error; device files and configuration must report all of
//! them at once. Both are therefore read through [`Table`], which records each key it
//! is asked for, type-checks it, and at [`Table::finish`] reports every key nobody asked
//! for as unknown.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Device files, configuration and token files are read whole; none is anywhere near this.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Reads a text file a person wrote: only a regular file (a FIFO would block, a link to
/// `/dev/zero` never end), of at most [`MAX_FILE_BYTES`], in UTF-8. The error is a short
/// sentence for the person.
pub fn read_text_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {}", e.kind()))?;
    if !meta.is_file() {
        return Err(
            "not a regular file (a folder, device, pipe or socket); fieldgate reads only regular files"
                .into(),
        );
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("{} bytes is more than the {MAX_FILE_BYTES} a file may have", meta.len()));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {}", e.kind()))?;
    let mut bytes = Vec::new();
    // The file may have grown since it was looked at.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {}", e.kind()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("more than the {MAX_FILE_BYTES} bytes a file may have"));
    }
    String::from_utf8(bytes).map_err(|_| "not valid UTF-8".to_string())
}

/// One problem in one input, with the line it is on (0 when there is no line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub source: String,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.source, self.message)
        } else {
            write!(f, "{}:{}: {}", self.source, self.line, self.message)
        }
    }
}

/// One TOML input (a file or an environment variable) and the problems found in it.
pub struct Doc {
    name: String,
    line_starts: Vec<usize>,
    problems: RefCell<Vec<Problem>>,
}

impl Doc {
    pub fn new(name: impl Into<String>, text: &str) -> Doc {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Doc { name: name.into(), line_starts, problems: RefCell::new(Vec::new()) }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The 1-based line of a byte offset.
    pub fn line(&self, offset: usize) -> usize {
        match self.line_starts.binary_search(&offset) {
            Ok(i) => i + 1,
            Err(i) => i,
        }
    }

    pub fn problem(&self, span: Option<Range<usize>>, message: impl Into<String>) {
        let line = span.map_or(0, |s| self.line(s.start));
        self.problems.borrow_mut().push(Problem { source: self.name.clone(), line, message: message.into() });
    }

    pub fn has_problems(&self) -> bool {
        !self.problems.borrow().is_empty()
    }

    pub fn into_problems(self) -> Vec<Problem> {
        self.problems.into_inner()
    }

    /// Parses `text`, recording every syntax error. Returns `None` when nothing usable
    /// was parsed.
    pub fn parse<'i>(&self, text: &'i str) -> Option<Spanned<DeTable<'i>>> {
        let (table, errors) = DeTable::parse_recoverable(text);
        for e in &errors {
            // The parser's own message is about TOML syntax, never device data.
            let msg = e.message().lines().next().unwrap_or("invalid TOML").trim();
            self.problem(e.span(), format!("invalid TOML: {msg}"));
        }
        if errors.is_empty() { Some(table) } else { None }
    }
}

/// A TOML value's type, as people write it.
pub fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A table being read. Every accessor marks its key as known.
pub struct Table<'a, 'i> {
    doc: &'a Doc,
    table: &'a DeTable<'i>,
    span: Range<usize>,
    /// Where this table is, for messages: "" for the root, "[serial]", "sensor A_LINE1_001".
    path: String,
    known: RefCell<BTreeSet<&'static str>>,
}

impl<'a, 'i> Table<'a, 'i> {
    pub fn root(doc: &'a Doc, table: &'a Spanned<DeTable<'i>>) -> Self {
        Table::new(doc, table.get_ref(), table.span(), String::new())
    }

    fn new(doc: &'a Doc, table: &'a DeTable<'i>, span: Range<usize>, path: String) -> Self {
        Table { doc, table, span, path, known: RefCell::new(BTreeSet::new()) }
    }

    pub fn doc(&self) -> &'a Doc {
        self.doc
    }

    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    pub fn set_path(&mut self, path: String) {
        self.path = path;
    }

    fn at(&self, key: &str) -> String {
        if self.path.is_empty() { format!("`{key}`") } else { format!("`{key}` in {}", self.path) }
    }

    /// Records a problem on the line of `key` (or of this table when it is absent).
    pub fn problem(&self, key: &str, message: impl fmt::Display) {
        let span = self.key_span(key).unwrap_or_else(|| self.span.clone());
        self.doc.problem(Some(span), format!("{}: {message}", self.at(key)));
    }

    /// Records a problem about this table as a whole.
    pub fn table_problem(&self, message: impl fmt::Display) {
        let what = if self.path.is_empty() { String::new() } else { format!("{}: ", self.path) };
        self.doc.problem(Some(self.span.clone()), format!("{what}{message}"));
    }

    pub fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.table.get_key_value(key).map(|(k, _)| k.span())
    }

    pub fn has(&self, key: &'static str) -> bool {
        self.known.borrow_mut().insert(key);
        self.table.contains_key(key)
    }

    fn get(&self, key: &'static str) -> Option<&'a Spanned<DeValue<'i>>> {
        self.known.borrow_mut().insert(key);
        self.table.get(key)
    }

    fn wrong_type(&self, key: &str, want: &str, got: &DeValue<'_>) {
        self.problem(key, format!("must be {want}, found {}", type_name(got)));
    }

    fn missing(&self, key: &str) {
        let span = self.span.clone();
        let at = if self.path.is_empty() { String::new() } else { format!(" in {}", self.path) };
        self.doc.problem(Some(span), format!("missing required key `{key}`{at}"));
    }

    pub fn str(&self, key: &'static str) -> Option<&'a str> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.wrong_type(key, "a string", other);
                None
            }
        }
    }

    /// A string a person will read: no control, bidirectional or invisible formatting
    /// characters (`plain.rs`); one that holds any is a problem saying which and where.
    pub fn text(&self, key: &'static str) -> Option<&'a str> {
        let s = self.str(key)?;
        match s.chars().enumerate().find(|(_, c)| crate::plain::is_hidden(*c)) {
            None => Some(s),
            Some((at, c)) => {
                self.problem(
                    key,
                    format!(
                        "must be plain text: it holds U+{:04X} (a control or invisible formatting character) at character {}",
                        u32::from(c),
                        at + 1
                    ),
                );
                None
            }
        }
    }

    pub fn req_text(&self, key: &'static str) -> Option<&'a str> {
        if self.require(key) { self.text(key) } else { None }
    }

    /// Reports `key` as missing when it is absent; true when present.
    pub fn require(&self, key: &'static str) -> bool {
        let present = self.has(key);
        if !present {
            self.missing(key);
        }
        present
    }

    pub fn req_str(&self, key: &'static str) -> Option<&'a str> {
        if self.require(key) { self.str(key) } else { None }
    }

    pub fn req_choice(&self, key: &'static str, allowed: &[&'static str]) -> Option<&'static str> {
        if self.require(key) { self.choice(key, allowed) } else { None }
    }

    /// One of a closed vocabulary's names, as its value.
    pub fn pick<T: strum::VariantNames + std::str::FromStr>(&self, key: &'static str) -> Option<T> {
        self.choice(key, T::VARIANTS).and_then(|s| s.parse().ok())
    }

    pub fn req_pick<T: strum::VariantNames + std::str::FromStr>(&self, key: &'static str) -> Option<T> {
        if self.require(key) { self.pick(key) } else { None }
    }

    /// A string that must be one of `allowed`.
    pub fn choice(&self, key: &'static str, allowed: &[&'static str]) -> Option<&'static str> {
        let s = self.str(key)?;
        match allowed.iter().find(|a| **a == s) {
            Some(a) => Some(a),
            None => {
                self.problem(key, format!("must be one of {}, found {s:?}", allowed.join(", ")));
                None
            }
        }
    }

    /// An integer within `range`.
    pub fn int(&self, key: &'static str, range: std::ops::RangeInclusive<i64>) -> Option<i64> {
        let v = self.get(key)?;
        let DeValue::Integer(i) = v.get_ref() else {
            self.wrong_type(key, "an integer", v.get_ref());
            return None;
        };
        match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if range.contains(&n) => Some(n),
            _ => {
                self.problem(
                    key,
                    format!("must be between {} and {}, found {i}", range.start(), range.end()),
                );
                None
            }
        }
    }

    /// A finite number; integers are accepted as floats.
    pub fn float(&self, key: &'static str) -> Option<f64> {
        let v = self.get(key)?;
        let n = match v.get_ref() {
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok().map(|n| n as f64),
            other => {
                self.wrong_type(key, "a number", other);
                return None;
            }
        };
        match n {
            Some(n) if n.is_finite() => Some(n),
            _ => {
                self.problem(key, "must be a finite number");
                None
            }
        }
    }

    /// An array of strings.
    pub fn strings(&self, key: &'static str) -> Option<Vec<String>> {
        let v = self.get(key)?;
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong_type(key, "an array of strings", v.get_ref());
            return None;
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push(s.to_string()),
                other => {
                    self.wrong_type(key, "an array of strings", other);
                    return None;
                }
            }
        }
        Some(out)
    }

    pub fn bool(&self, key: &'static str) -> Option<bool> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.wrong_type(key, "a boolean", other);
                None
            }
        }
    }

    /// A sub-table (`[key]` or an inline table).
    pub fn table(&self, key: &'static str) -> Option<Table<'a, 'i>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Table(t) => {
                let path = match self.path.strip_prefix('[').and_then(|p| p.strip_suffix(']')) {
                    _ if self.path.is_empty() => format!("[{key}]"),
                    Some(inner) => format!("[{inner}.{key}]"),
                    None => format!("{}.{key}", self.path),
                };
                Some(Table::new(self.doc, t, v.span(), path))
            }
            other => {
                self.wrong_type(key, "a table", other);
                None
            }
        }
    }

    /// An array of tables (`[[key]]`).
    pub fn tables(&self, key: &'static str) -> Vec<Table<'a, 'i>> {
        let Some(v) = self.get(key) else { return Vec::new() };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong_type(key, "an array of tables", v.get_ref());
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match item.get_ref() {
                DeValue::Table(t) => {
                    out.push(Table::new(self.doc, t, item.span(), format!("{key}[{}]", i + 1)))
                }
                other => self.doc.problem(
                    Some(item.span()),
                    format!("`{key}` entries must be tables, found {}", type_name(other)),
                ),
            }
        }
        out
    }

    /// Reports every key in this table that no accessor asked for.
    pub fn finish(&self) {
        let known = self.known.borrow();
        for (k, _) in self.table.iter() {
            let name: &str = k.get_ref();
            if known.contains(name) {
                continue;
            }
            let hint = crate::suggest::closest(name, known.iter().copied())
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            let at = if self.path.is_empty() { String::new() } else { format!(" in {}", self.path) };
            self.doc.problem(Some(k.span()), format!("unknown key `{name}`{at}{hint}"));
        }
    }
}

//! What a framework had live at the failing allocation: a torch
//! attribution record (`memprobe.torch_attribution/1`, kind `oom`) given by
//! the reporter as JSON. It is checked here — strict JSON, an object with
//! that schema, at most [`MAX_LIVE_BLOCKS_BYTES`] — and embedded as written;
//! the summary names its largest blocks and the fragmentation by segment.
//! A record that fails a check is left out with the reason: the report is
//! written all the same.

use std::collections::BTreeMap;

/// The `schema` a live-blocks record must carry.
pub const LIVE_BLOCKS_SCHEMA: &str = "memprobe.torch_attribution/1";

/// The largest live-blocks record embedded, bytes (the record's own bound).
pub const MAX_LIVE_BLOCKS_BYTES: usize = 256 * 1024;

/// Nesting beyond this is refused: the parser recurses.
const MAX_DEPTH: usize = 64;

/// One live block, as the summary names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its bytes.
    pub bytes: u64,
    /// `file:line function` of its innermost frame, or the forward module
    /// for a frameless backward block; `None` when neither is given.
    pub site: Option<String>,
}

/// Reserved minus allocated over the caching allocator's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragmentation {
    /// Segments listed.
    pub segments: u64,
    /// Their bytes.
    pub reserved_bytes: u64,
    /// Bytes of them handed out.
    pub allocated_bytes: u64,
    /// The most free in one segment (what one allocation could get there).
    pub largest_free_bytes: u64,
}

/// A checked live-blocks record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveBlocks {
    /// The record as given (checked to be one JSON object).
    pub json: String,
    /// The failing request as the record gives it.
    pub requested_bytes: Option<u64>,
    /// Blocks listed.
    pub block_count: u64,
    /// The largest blocks, largest first (at most [`TOP_BLOCKS`]).
    pub top: Vec<LiveBlock>,
    /// By segment, when the record lists segments.
    pub fragmentation: Option<Fragmentation>,
}

/// Blocks the summary names.
pub const TOP_BLOCKS: usize = 3;

impl LiveBlocks {
    /// Checks `text` and keeps what the summary shows; the error says why
    /// it is refused.
    pub fn from_json(text: &str) -> Result<LiveBlocks, String> {
        if text.len() > MAX_LIVE_BLOCKS_BYTES {
            return Err(format!(
                "the live-blocks record has {} bytes, more than the {MAX_LIVE_BLOCKS_BYTES} allowed",
                text.len()
            ));
        }
        let mut p = Parser {
            s: text.as_bytes(),
            at: 0,
        };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.at != p.s.len() {
            return Err(format!(
                "the live-blocks record is not JSON: text after the value at byte {}",
                p.at
            ));
        }
        let Value::Object(o) = &v else {
            return Err("the live-blocks record is not a JSON object".into());
        };
        match o.get("schema") {
            Some(Value::Str(s)) if s == LIVE_BLOCKS_SCHEMA => {}
            Some(Value::Str(s)) => {
                return Err(format!(
                    "the live-blocks record's schema is {s:?}, not {LIVE_BLOCKS_SCHEMA:?}"
                ))
            }
            _ => {
                return Err(format!(
                    "the live-blocks record has no \"schema\": {LIVE_BLOCKS_SCHEMA:?}"
                ))
            }
        }
        let blocks = match o.get("blocks") {
            Some(Value::Array(a)) => a.as_slice(),
            _ => &[],
        };
        let mut top: Vec<LiveBlock> = blocks.iter().filter_map(block).collect();
        top.sort_by_key(|b| std::cmp::Reverse(b.bytes));
        top.truncate(TOP_BLOCKS);
        let fragmentation = match o.get("segments") {
            Some(Value::Array(segs)) => Some(fragmentation(segs)),
            _ => None,
        };
        Ok(LiveBlocks {
            json: compact(text),
            requested_bytes: o.get("requested_bytes").and_then(Value::as_u64),
            block_count: blocks.len() as u64,
            top,
            fragmentation,
        })
    }
}

/// `text` (checked JSON) without the whitespace between tokens: the report
/// is one line for readers of JSON lines.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_str, mut escaped) = (false, false);
    for c in text.chars() {
        if in_str {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_str = c == '"';
            out.push(c);
        }
    }
    out
}

fn block(v: &Value) -> Option<LiveBlock> {
    let Value::Object(b) = v else { return None };
    let bytes = b.get("bytes").and_then(Value::as_u64)?;
    let frame = match b.get("frames") {
        Some(Value::Array(f)) => f.first(),
        _ => None,
    };
    let site = match frame {
        Some(Value::Object(f)) => {
            let file = f.get("file").and_then(Value::as_str).unwrap_or("?");
            let line = f.get("line").and_then(Value::as_u64);
            let func = f.get("function").and_then(Value::as_str);
            let mut s = match line {
                Some(l) => format!("{file}:{l}"),
                None => file.to_owned(),
            };
            if let Some(func) = func {
                s.push(' ');
                s.push_str(func);
            }
            Some(s)
        }
        _ => b
            .get("module")
            .and_then(Value::as_str)
            .map(|m| format!("backward of {m}")),
    };
    Some(LiveBlock { bytes, site })
}

fn fragmentation(segs: &[Value]) -> Fragmentation {
    let mut f = Fragmentation {
        segments: 0,
        reserved_bytes: 0,
        allocated_bytes: 0,
        largest_free_bytes: 0,
    };
    for s in segs {
        let Value::Object(s) = s else { continue };
        let (Some(bytes), Some(allocated)) = (
            s.get("bytes").and_then(Value::as_u64),
            s.get("allocated").and_then(Value::as_u64),
        ) else {
            continue;
        };
        f.segments += 1;
        f.reserved_bytes = f.reserved_bytes.saturating_add(bytes);
        f.allocated_bytes = f.allocated_bytes.saturating_add(allocated.min(bytes));
        f.largest_free_bytes = f.largest_free_bytes.max(bytes.saturating_sub(allocated));
    }
    f
}

/// The parsed record; numbers keep only what a whole byte count needs.
enum Value {
    Null,
    Bool,
    /// A non-negative integer that fits u64; other numbers are `Other`.
    Uint(u64),
    Other,
    Str(String),
    Array(Vec<Value>),
    Object(BTreeMap<String, Value>),
}

impl Value {
    fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Uint(n) => Some(*n),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A strict JSON reader (RFC 8259): the core has no JSON dependency.
struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> String {
        let at = self.at;
        if at >= self.s.len() && what != "unexpected end" {
            return format!(
                "the live-blocks record is not JSON: unexpected end at byte {at} ({what})"
            );
        }
        format!("the live-blocks record is not JSON: {what} at byte {at}")
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.at..].starts_with(lit) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting deeper than 64"));
        }
        match self.s.get(self.at) {
            None => Err(self.err("unexpected end")),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::Str),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat(b"null") => Ok(Value::Null),
            _ if self.eat(b"true") || self.eat(b"false") => Ok(Value::Bool),
            _ => Err(self.err("unexpected character")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1;
        let mut o = BTreeMap::new();
        self.ws();
        if self.eat(b"}") {
            return Ok(Value::Object(o));
        }
        loop {
            self.ws();
            if self.s.get(self.at) != Some(&b'"') {
                return Err(self.err("expected a key"));
            }
            let k = self.string()?;
            self.ws();
            if !self.eat(b":") {
                return Err(self.err("expected ':'"));
            }
            self.ws();
            let v = self.value(depth + 1)?;
            o.insert(k, v);
            self.ws();
            if self.eat(b"}") {
                return Ok(Value::Object(o));
            }
            if !self.eat(b",") {
                return Err(self.err("expected ',' or '}'"));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1;
        let mut a = Vec::new();
        self.ws();
        if self.eat(b"]") {
            return Ok(Value::Array(a));
        }
        loop {
            self.ws();
            a.push(self.value(depth + 1)?);
            self.ws();
            if self.eat(b"]") {
                return Ok(Value::Array(a));
            }
            if !self.eat(b",") {
                return Err(self.err("expected ',' or ']'"));
            }
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.at;
        let neg = self.eat(b"-");
        let digits = |p: &mut Self| {
            let from = p.at;
            while let Some(b'0'..=b'9') = p.s.get(p.at) {
                p.at += 1;
            }
            p.at - from
        };
        let int_start = self.at;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            return Err(self.err("bad number"));
        }
        let mut integral = !neg;
        if self.eat(b".") {
            integral = false;
            if digits(self) == 0 {
                return Err(self.err("bad number"));
            }
        }
        if let Some(b'e' | b'E') = self.s.get(self.at) {
            self.at += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.s.get(self.at) {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(self.err("bad number"));
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
        Ok(match text.parse::<u64>() {
            Ok(v) if integral => Value::Uint(v),
            _ => Value::Other,
        })
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.at..self.at + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| self.err("bad \\u escape"))?;
        self.at += 4;
        Ok(h)
    }

    fn string(&mut self) -> Result<String, String> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while let Some(&c) = self.s.get(self.at) {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The input is a &str and the run stops at ASCII: whole characters.
            out.push_str(std::str::from_utf8(&self.s[start..self.at]).unwrap_or(""));
            match self.s.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let e = self.s.get(self.at).copied();
                    self.at += 1;
                    match e {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if !self.eat(b"\\u") {
                                    return Err(self.err("lone surrogate"));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("lone surrogate"));
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.ok_or_else(|| self.err("lone surrogate"))?);
                        }
                        _ => return Err(self.err("bad escape")),
                    }
                }
                Some(_) => return Err(self.err("control character in a string")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(extra: &str) -> String {
        format!(
            r#"{{"schema":"memprobe.torch_attribution/1","kind":"oom","requested_bytes":4096,
            "blocks":[{{"bytes":100,"frames":[{{"file":"a.py","line":3,"function":"f"}}]}},
                      {{"bytes":300,"frames":[],"module":"Linear"}},
                      {{"bytes":200,"frames":[{{"file":"b.py","line":9,"function":"g"}}]}},
                      {{"bytes":50,"frames":[]}}]{extra}}}"#
        )
    }

    #[test]
    fn reads_the_top_blocks_and_fragmentation() {
        let r = LiveBlocks::from_json(&record(
            r#","segments":[{"address":1,"bytes":1000,"allocated":400,"stream":0},
                            {"address":2,"bytes":500,"allocated":500,"stream":0}]"#,
        ))
        .unwrap();
        assert_eq!(r.requested_bytes, Some(4096));
        assert_eq!(r.block_count, 4);
        let sites: Vec<_> = r.top.iter().map(|b| (b.bytes, b.site.clone())).collect();
        assert_eq!(
            sites,
            vec![
                (300, Some("backward of Linear".into())),
                (200, Some("b.py:9 g".into())),
                (100, Some("a.py:3 f".into())),
            ]
        );
        let f = r.fragmentation.unwrap();
        assert_eq!(
            (
                f.segments,
                f.reserved_bytes,
                f.allocated_bytes,
                f.largest_free_bytes
            ),
            (2, 1500, 900, 600)
        );
    }

    #[test]
    fn no_segments_no_fragmentation() {
        let r = LiveBlocks::from_json(&record(r#","segments":null"#)).unwrap();
        assert!(r.fragmentation.is_none());
    }

    #[test]
    fn refuses_what_is_not_a_record() {
        for (text, why) in [
            ("", "unexpected end"),
            ("{", "expected a key"),
            ("[1,2]", "not a JSON object"),
            ("{\"schema\":\"x/1\"}", "schema is \"x/1\""),
            ("{\"kind\":\"oom\"}", "has no \"schema\""),
            ("{\"schema\":1}", "has no \"schema\""),
            ("{} {}", "text after the value"),
            ("{\"a\":01}", "bad number"),
            ("{\"a\":\"\\x\"}", "bad escape"),
            ("{\"a\":\"\\ud800\"}", "lone surrogate"),
            ("{\"a\":tru}", "unexpected character"),
            ("{\"a\":\"\n\"}", "control character"),
        ] {
            let e = LiveBlocks::from_json(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(LiveBlocks::from_json(&deep)
            .unwrap_err()
            .contains("nesting"));
        let big = format!(
            "{{\"schema\":\"{LIVE_BLOCKS_SCHEMA}\",\"pad\":\"{}\"}}",
            "x".repeat(MAX_LIVE_BLOCKS_BYTES)
        );
        assert!(LiveBlocks::from_json(&big)
            .unwrap_err()
            .contains("more than"));
    }

    #[test]
    fn reads_escapes_and_numbers() {
        let r = LiveBlocks::from_json(
            r#"{"schema":"memprobe.torch_attribution\/1","x":[-1,1.5e3,0,true,false,null],
               "blocks":[{"bytes":7,"frames":[{"file":"\u00e9\ud83d\ude00.py","line":1}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.top[0].site.as_deref(), Some("é😀.py:1"));
        assert!(r
            .json
            .starts_with(r#"{"schema":"memprobe.torch_attribution\/1","x":[-1,"#));
        assert!(!r.json.contains('\n'));
        let spaced = LiveBlocks::from_json(&record(r#","note":"a \" b""#)).unwrap();
        assert!(
            spaced.json.contains(r#""note":"a \" b""#),
            "{}",
            spaced.json
        );
        assert_eq!(r.requested_bytes, None);
    }
}

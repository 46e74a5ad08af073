//! A structural pre-scan of the JSON text: finds the top-level keys and the byte range of every
//! element of the `nodes` array without building anything. The ranges let the node records be
//! parsed independently (and in parallel), and give exact byte offsets for errors.

use memchr::memchr2;

#[derive(Debug)]
pub(crate) struct Scan {
    /// Top-level keys other than `nodes`, with their raw value byte ranges.
    pub top: Vec<(String, std::ops::Range<usize>)>,
    /// Byte range of each element of the `nodes` array.
    pub nodes: Vec<std::ops::Range<usize>>,
    pub saw_nodes: bool,
}

#[derive(Debug)]
pub(crate) enum ScanError {
    /// Input ended inside a structure; `in_nodes` says whether inside the nodes array.
    Eof {
        offset: usize,
        in_nodes: bool,
    },
    Syntax {
        offset: usize,
        msg: &'static str,
    },
    /// The parallel node parser could not confirm its split points: use the serial path.
    Fallback,
}

pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// Skips a string starting at the opening quote; returns the index after the closing quote.
/// Most ET strings are short (types, devices, names): a plain loop beats a SIMD search set-up
/// for the first bytes; long ones (op schemas) switch to memchr.
#[inline]
fn skip_string(b: &[u8], mut i: usize) -> Result<usize, ScanError> {
    i += 1;
    let short_end = (i + 24).min(b.len());
    while i < short_end {
        match b[i] {
            b'"' => return Ok(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    loop {
        if i >= b.len() {
            return Err(ScanError::Eof {
                offset: b.len(),
                in_nodes: false,
            });
        }
        match memchr2(b'"', b'\\', &b[i..]) {
            None => {
                return Err(ScanError::Eof {
                    offset: b.len(),
                    in_nodes: false,
                })
            }
            Some(k) => {
                i += k;
                if b[i] == b'\\' {
                    i += 2;
                } else {
                    return Ok(i + 1);
                }
            }
        }
    }
}

/// Byte classes for the structural scan: 0 plain, 1 quote, 2 open, 3 close.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = 1;
    t[b'{' as usize] = 2;
    t[b'[' as usize] = 2;
    t[b'}' as usize] = 3;
    t[b']' as usize] = 3;
    t
};

/// Skips one JSON value starting at `i` (no leading whitespace); returns the index after it.
/// Checks bracket matching; scalars are only delimited here and validated by the real parser.
pub(crate) fn skip_value(b: &[u8], mut i: usize) -> Result<usize, ScanError> {
    match b.get(i) {
        None => {
            return Err(ScanError::Eof {
                offset: b.len(),
                in_nodes: false,
            })
        }
        Some(b'"') => return skip_string(b, i),
        Some(b'{' | b'[') => {}
        Some(_) => {
            // A bare scalar: runs until a delimiter.
            let start = i;
            while i < b.len() && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            {
                i += 1;
            }
            if i == start {
                return Err(ScanError::Syntax {
                    offset: i,
                    msg: "expected a value",
                });
            }
            return Ok(i);
        }
    }
    // Bracket kinds as a bit stack (1 = object), 128 levels inline; deeper nesting spills.
    let mut bits: u128 = 0;
    let mut depth: usize = 0;
    let mut spill: Vec<bool> = Vec::new();
    loop {
        let Some(&c) = b.get(i) else {
            return Err(ScanError::Eof {
                offset: b.len(),
                in_nodes: false,
            });
        };
        match CLASS[c as usize] {
            0 => i += 1,
            1 => i = skip_string(b, i)?,
            2 => {
                let obj = c == b'{';
                if depth < 128 {
                    bits = (bits << 1) | obj as u128;
                } else {
                    spill.push(obj);
                }
                depth += 1;
                i += 1;
            }
            _ => {
                if depth == 0 {
                    return Err(ScanError::Syntax {
                        offset: i,
                        msg: "mismatched bracket",
                    });
                }
                depth -= 1;
                let obj = if depth >= 128 {
                    spill.pop().unwrap_or(false)
                } else {
                    let o = bits & 1 == 1;
                    bits >>= 1;
                    o
                };
                if obj != (c == b'}') {
                    return Err(ScanError::Syntax {
                        offset: i,
                        msg: "mismatched bracket",
                    });
                }
                i += 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
        }
    }
}

fn read_key(b: &[u8], i: usize) -> Result<(String, usize), ScanError> {
    if b.get(i) != Some(&b'"') {
        return Err(if i >= b.len() {
            ScanError::Eof {
                offset: i,
                in_nodes: false,
            }
        } else {
            ScanError::Syntax {
                offset: i,
                msg: "expected a key string",
            }
        });
    }
    let end = skip_string(b, i)?;
    let key = serde_json::from_slice::<String>(&b[i..end]).map_err(|_| ScanError::Syntax {
        offset: i,
        msg: "invalid key string",
    })?;
    Ok((key, end))
}

pub(crate) fn scan(b: &[u8]) -> Result<Scan, ScanError> {
    let mut nodes = Vec::new();
    let (top, saw_nodes) = scan_with(b, |open| {
        let mut i = ws(b, open + 1);
        if b.get(i) == Some(&b']') {
            return Ok(i + 1);
        }
        loop {
            i = ws(b, i);
            let start = i;
            let end = skip_value(b, i).map_err(|e| match e {
                ScanError::Eof { offset, .. } => ScanError::Eof {
                    offset,
                    in_nodes: true,
                },
                other => other,
            })?;
            nodes.push(start..end);
            i = ws(b, end);
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b']') => return Ok(i + 1),
                None => {
                    return Err(ScanError::Eof {
                        offset: i,
                        in_nodes: true,
                    })
                }
                Some(_) => {
                    return Err(ScanError::Syntax {
                        offset: i,
                        msg: "expected ',' or ']' after a node",
                    })
                }
            }
        }
    })?;
    Ok(Scan {
        top,
        nodes,
        saw_nodes,
    })
}

/// Scans the top-level object; `on_nodes` handles the `nodes` array from its `[` and returns
/// the index after its `]`. Returns the other keys' value ranges and whether `nodes` was seen.
#[allow(clippy::type_complexity)]
pub(crate) fn scan_with(
    b: &[u8],
    mut on_nodes: impl FnMut(usize) -> Result<usize, ScanError>,
) -> Result<(Vec<(String, std::ops::Range<usize>)>, bool), ScanError> {
    let mut top = Vec::new();
    let mut saw_nodes = false;
    let mut i = ws(b, 0);
    // A UTF-8 byte-order mark is tolerated.
    if b[i..].starts_with(&[0xEF, 0xBB, 0xBF]) {
        i = ws(b, i + 3);
    }
    match b.get(i) {
        Some(b'{') => i += 1,
        None => {
            return Err(ScanError::Eof {
                offset: i,
                in_nodes: false,
            })
        }
        Some(_) => {
            return Err(ScanError::Syntax {
                offset: i,
                msg: "expected '{' at the start of a trace",
            })
        }
    }
    i = ws(b, i);
    if b.get(i) == Some(&b'}') {
        return Ok((top, saw_nodes));
    }
    loop {
        i = ws(b, i);
        let (key, after) = read_key(b, i)?;
        i = ws(b, after);
        match b.get(i) {
            Some(b':') => i = ws(b, i + 1),
            None => {
                return Err(ScanError::Eof {
                    offset: i,
                    in_nodes: false,
                })
            }
            Some(_) => {
                return Err(ScanError::Syntax {
                    offset: i,
                    msg: "expected ':'",
                })
            }
        }
        if key == "nodes" && b.get(i) == Some(&b'[') && !saw_nodes {
            saw_nodes = true;
            i = on_nodes(i)?;
        } else {
            let end = skip_value(b, i)?;
            top.push((key, i..end));
            i = end;
        }
        i = ws(b, i);
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => {
                i = ws(b, i + 1);
                if i != b.len() {
                    return Err(ScanError::Syntax {
                        offset: i,
                        msg: "trailing data after the trace object",
                    });
                }
                return Ok((top, saw_nodes));
            }
            None => {
                return Err(ScanError::Eof {
                    offset: i,
                    in_nodes: false,
                })
            }
            Some(_) => {
                return Err(ScanError::Syntax {
                    offset: i,
                    msg: "expected ',' or '}'",
                })
            }
        }
    }
}

/// A likely start of an array element at or after `from`: a `{` preceded by `,` and a `}`
/// (whitespace allowed). Only a guess: the parser confirms it by arriving there.
pub(crate) fn find_boundary(b: &[u8], from: usize, limit: usize) -> Option<usize> {
    let end = (from + limit).min(b.len());
    let mut p = from;
    while p < end {
        let k = memchr::memchr(b'{', &b[p..end])?;
        let at = p + k;
        let mut q = at;
        while q > 0 && b[q - 1].is_ascii_whitespace() {
            q -= 1;
        }
        if q > 0 && b[q - 1] == b',' {
            q -= 1;
            while q > 0 && b[q - 1].is_ascii_whitespace() {
                q -= 1;
            }
            if q > 0 && b[q - 1] == b'}' {
                return Some(at);
            }
        }
        p = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nodes_and_top_keys() {
        let s = br#" {"schema": "1.0.1", "nodes": [ {"id": 1, "name": "a]}\"x"} , {"id":2}], "pid": 3} "#;
        let r = scan(s).unwrap();
        assert_eq!(r.nodes.len(), 2);
        assert_eq!(&s[r.nodes[0].clone()], br#"{"id": 1, "name": "a]}\"x"}"#);
        assert_eq!(
            r.top.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["schema", "pid"]
        );
    }

    #[test]
    fn truncation_is_reported_inside_nodes() {
        let s = br#"{"schema": "1.0.1", "nodes": [{"id": 1}, {"id": 2, "na"#;
        match scan(s) {
            Err(ScanError::Eof { in_nodes: true, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            scan(b"[1,2]"),
            Err(ScanError::Syntax { offset: 0, .. })
        ));
        assert!(matches!(
            scan(br#"{"nodes": [{"id": 1]}"#),
            Err(ScanError::Syntax { .. })
        ));
    }
}

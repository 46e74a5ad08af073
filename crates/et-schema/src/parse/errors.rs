//! The parser's errors: the structural scan's and serde_json's turned into [`Error`]s that name
//! the file, the offset, the node and the field.

use super::node::{FieldName, NodeAcc};
use crate::error::{clip, Error, MSG_MAX};
use crate::intern::Interner;
use crate::scan::{self, ScanError};

/// The scan's error as the crate's [`Error`], naming `source`.
pub(super) fn scan_error(e: ScanError, bytes: &[u8], source: &str) -> Error {
    match e {
        ScanError::Syntax { offset: 0, .. } if looks_like_chakra(bytes) => Error::NotATrace {
            path: source.to_string(),
            msg: "it is a Chakra protobuf trace (binary, as `export --chakra` writes for \
                  simulators): give the JSON execution trace it was made from"
                .into(),
        },
        ScanError::Syntax { offset, msg } => Error::Syntax {
            path: source.to_string(),
            offset: offset as u64,
            msg: msg.to_string(),
        },
        ScanError::Fallback => Error::Syntax {
            path: source.to_string(),
            offset: 0,
            msg: "internal: unconfirmed split".into(),
        },
        ScanError::Eof { offset, in_nodes } => {
            let (complete, last) = if in_nodes {
                complete_nodes_before(bytes, offset)
            } else {
                (0, String::new())
            };
            if offset == 0 || bytes.iter().all(|c| c.is_ascii_whitespace()) {
                return Error::NotATrace {
                    path: source.to_string(),
                    msg: "the input is empty".into(),
                };
            }
            Error::Truncated {
                path: source.to_string(),
                offset: offset as u64,
                context: if in_nodes {
                    "the nodes array"
                } else {
                    "the top-level object"
                },
                complete,
                last,
            }
        }
    }
}

/// A Chakra execution trace's start: a length-delimited protobuf message (a varint length,
/// then a length-delimited field) of global metadata: its version (`0.0.4`, as `export
/// --chakra` writes it) or its attributes (`schema`, as Chakra's own converter writes them).
fn looks_like_chakra(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(64)];
    // JSON: an object, an array, whitespace, or a UTF-8 byte order mark first.
    if head.starts_with(b"\xef\xbb\xbf")
        || head
            .first()
            .is_none_or(|&b| b == b'{' || b == b'[' || b.is_ascii_whitespace())
    {
        return false;
    }
    // The message's length: a varint of at most 4 bytes.
    let Some(len_bytes) = head.iter().take(4).position(|&b| b < 0x80) else {
        return false;
    };
    let key = head.get(len_bytes + 1).copied().unwrap_or(0);
    let field = key >> 3;
    key & 0x07 == 2
        && (1..=15).contains(&field)
        && (memchr::memmem::find(head, b"0.0.").is_some()
            || memchr::memmem::find(head, b"schema").is_some())
}

/// For a truncated file: counts the complete node records before the cut and finds the last id.
fn complete_nodes_before(bytes: &[u8], _offset: usize) -> (usize, String) {
    // Re-scan the nodes array up to the cut, collecting complete elements.
    let Some(pos) = memchr::memmem::find(bytes, b"\"nodes\"") else {
        return (0, String::new());
    };
    let Some(open) = bytes[pos..].iter().position(|&c| c == b'[') else {
        return (0, String::new());
    };
    let mut i = pos + open + 1;
    let mut count = 0;
    let mut last = None;
    loop {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
            i += 1;
        }
        match scan::skip_value(bytes, i) {
            Ok(end) => {
                #[derive(serde::Deserialize)]
                struct Id {
                    id: Option<u64>,
                }
                if let Ok(Id { id: Some(id) }) = serde_json::from_slice::<Id>(&bytes[i..end]) {
                    last = Some(id);
                }
                count += 1;
                i = end;
            }
            Err(_) => break,
        }
    }
    (
        count,
        last.map_or(String::new(), |id| format!(", the last one id {id}")),
    )
}

/// A parser's message fit for an error: serde_json quotes whole input strings (a 2 GiB one
/// too), so long messages keep their start and end; the recursion limit is said in words.
pub(crate) fn serde_message(msg: &str) -> String {
    let msg = msg.rsplit_once(" at line ").map_or(msg, |(m, _)| m);
    if msg.starts_with("recursion limit exceeded") {
        return format!(
            "values nested deeper than {} levels (recursion limit exceeded)",
            crate::MAX_NESTING
        );
    }
    if msg.len() <= MSG_MAX {
        return msg.to_string();
    }
    let mut head = MSG_MAX * 3 / 4;
    while !msg.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = msg.len() - MSG_MAX / 4;
    while !msg.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{} [... {} bytes ...] {}",
        &msg[..head],
        tail - head,
        &msg[tail..]
    )
}

/// serde_json's error in the node record `text` (at `start` in the file) as the crate's
/// [`Error`]: the offset in the file, the field being read and the node's id when known.
pub(super) fn node_error(
    e: serde_json::Error,
    text: &[u8],
    start: usize,
    acc: &NodeAcc,
    strings: &Interner,
    source: &str,
) -> Error {
    // serde_json reports line/column within the record; turn that into a file offset.
    let (line, col) = (e.line(), e.column());
    let mut off = 0usize;
    let mut l = 1;
    while l < line {
        match memchr::memchr(b'\n', &text[off..]) {
            Some(k) => off += k + 1,
            None => break,
        }
        l += 1;
    }
    let offset = (start + off + col.saturating_sub(1)) as u64;
    let mut msg = serde_message(&e.to_string());
    // The field whose value was being read, if the error is inside one.
    let field = match acc.field {
        FieldName::None => None,
        FieldName::Known(f) => Some(f),
        FieldName::Other(sym) => Some(strings.get(sym)),
    };
    if let Some(f) = field {
        msg = format!("field \"{}\": {msg}", clip(f, MSG_MAX));
    }
    let id = acc.id.or_else(|| {
        #[derive(serde::Deserialize)]
        struct Id {
            id: Option<u64>,
        }
        serde_json::from_slice::<Id>(text).ok().and_then(|x| x.id)
    });
    if e.is_syntax() || e.is_eof() {
        Error::Syntax {
            path: source.to_string(),
            offset,
            msg: match id {
                Some(i) => format!("in node {i}, {msg}"),
                None => msg,
            },
        }
    } else {
        Error::Node {
            path: source.to_string(),
            node_id: id,
            offset,
            msg,
        }
    }
}

#[cfg(test)]
mod chakra_tests {
    use super::looks_like_chakra;

    /// Chakra's own converter's output (its first bytes, from mlcommons/chakra's
    /// tests/data/feeder_tests_trace.tar.gz): metadata attributes, no version field; and ours,
    /// the version first. JSON, even one naming a schema, is neither.
    #[test]
    fn chakra_files_are_told_from_json_by_their_first_bytes() {
        assert!(looks_like_chakra(
            b"\x5e\x12\x10\x0a\x06schema\xea\x01\x051.0.1\x12\x09\x0a\x03pid"
        ));
        assert!(looks_like_chakra(b"\x07\x0a\x050.0.4"));
        assert!(!looks_like_chakra(br#"{"schema": "1.0.1", "nodes": []}"#));
        assert!(!looks_like_chakra(b"  \n{\"schema\": \"0.0.4\"}"));
        assert!(!looks_like_chakra(b""));
        assert!(!looks_like_chakra(b"\xef\xbb\xbf{\"schema\": \"1.0.1\"}"));
    }
}

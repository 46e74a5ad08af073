//! `generate --anonymize`: nothing proprietary leaves in a package. Annotation, module, file and
//! attribute names are replaced by keyed hashes (stable within a package, so ranks and scopes
//! still agree; unrecoverable without the key); operator names, schemas, shapes and the
//! collectives' group names are kept, since the replay needs them.

use et_schema::{Trace, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

/// Names PyTorch itself writes, kept as they are.
fn kept(name: &str) -> bool {
    name.contains("::")
        || name.starts_with("[pytorch|profiler|execution_")
        || name.starts_with("ProfilerStep#")
        || name == et_graph::summary::PROCESS_GROUP_INIT
        || name == "record_param_comms"
        || name.starts_with("nccl:")
        || name.starts_with("gloo:")
        || is_autograd_node(name)
}

/// Autograd's own function names (`AddmmBackward0`): PyTorch's, not the model's.
fn is_autograd_node(name: &str) -> bool {
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
    base.len() < name.len()
        && base.ends_with("Backward")
        && base.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Attributes the replay reads (collectives and their groups), kept.
const KEPT_ATTRS: &[&str] = &[
    "pg_name",
    "pg_desc",
    "collective_name",
    "dtype",
    "in_split_size",
    "out_split_size",
];

/// What was replaced: counts per kind, and (for the person who generated the package only)
/// the mapping from original names to their hashes.
#[derive(Debug, Default)]
pub struct Anonymized {
    pub replaced: BTreeMap<String, usize>,
    pub map: BTreeMap<String, String>,
}

/// Replaces the proprietary names of `t` by keyed hashes (`anon_<12 hex>`).
pub fn anonymize(t: &mut Trace, key: &[u8]) -> Anonymized {
    let mut out = Anonymized::default();
    let mut memo: HashMap<String, et_schema::Sym> = HashMap::new();
    let mut hashed = |t: &mut Trace, name: &str, kind: &str, out: &mut Anonymized| {
        if let Some(&s) = memo.get(name) {
            return s;
        }
        let mut h = Sha256::new();
        h.update(key);
        h.update(name.as_bytes());
        let hex: String = h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let new = format!("anon_{hex}");
        *out.replaced.entry(kind.to_string()).or_default() += 1;
        out.map.insert(name.to_string(), new.clone());
        let s = t.strings.intern(&new);
        memo.insert(name.to_string(), s);
        s
    };
    // Operator base names (`detach` of `aten::detach`): autograd records some ops under them.
    let op_bases: std::collections::HashSet<String> = t
        .nodes
        .iter()
        .filter_map(|n| t.name(n).split_once("::").map(|(_, b)| b.to_string()))
        .collect();
    for i in 0..t.nodes.len() {
        let name = t.name(&t.nodes[i]).to_string();
        let is_op = t.nodes[i].op_schema.is_some_and(|s| !t.str(s).is_empty());
        if !kept(&name) && !is_op && !op_bases.contains(&name) {
            let kind = if name.starts_with("nn.Module") {
                "module"
            } else {
                "annotation"
            };
            t.nodes[i].name = hashed(t, &name, kind, &mut out);
        }
        if let Some(f) = t.nodes[i].kernel_file {
            let f = t.str(f).to_string();
            if !f.is_empty() {
                t.nodes[i].kernel_file = Some(hashed(t, &f, "file", &mut out));
            }
        }
    }
    for k in 0..t.extra_attrs.len() {
        let e = t.extra_attrs[k];
        let attr = t.str(e.name).to_string();
        if let Value::Str(s) = e.value {
            let v = t.str(s).to_string();
            if !KEPT_ATTRS.contains(&attr.as_str()) && !v.is_empty() {
                t.extra_attrs[k].value = Value::Str(hashed(t, &v, "attribute", &mut out));
            }
        }
    }
    // The same names passed as string arguments (record_function's enter ops carry them).
    for k in 0..t.args.len() {
        if let Value::Str(s) = t.args[k].value {
            if let Some(&new) = memo.get(t.str(s)) {
                t.args[k].value = Value::Str(new);
            }
        }
    }
    for k in 0..t.items.len() {
        if let Value::Str(s) = t.items[k] {
            if let Some(&new) = memo.get(t.str(s)) {
                t.items[k] = Value::Str(new);
            }
        }
    }
    // When and where it was captured.
    t.meta.time = None;
    t.meta.extra.retain(|(k, _)| k == "schema");
    out
}

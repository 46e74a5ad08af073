use super::errors::serde_message;
use super::input::{default_max_decompressed, parse_size};
use super::seeds::{field, field_name, Word, ATTR_WORDS};
use super::*;
use crate::error::MSG_MAX;
use crate::intern::Interner;

#[test]
fn sizes_in_the_environment_read_as_binary_multiples() {
    assert_eq!(parse_size("17179869184"), Some(16 << 30));
    assert_eq!(parse_size("16G"), Some(16 << 30));
    assert_eq!(parse_size(" 16 GiB "), Some(16 << 30));
    assert_eq!(parse_size("512m"), Some(512 << 20));
    assert_eq!(parse_size("1.5K"), Some(1536));
    assert_eq!(parse_size("0"), Some(0));
    for bad in ["", "lots", "-1G", "1Q", "99999999999999T", "1e9"] {
        assert_eq!(parse_size(bad), None, "{bad}");
    }
}

#[test]
fn the_default_decompression_limit_follows_the_compressed_size() {
    // Small files: the floor; bombs (~1000x) of a few MB stop at 1 GiB.
    assert_eq!(default_max_decompressed(32), 1 << 30);
    assert_eq!(default_max_decompressed(4 << 20), 1 << 30);
    // Real traces compress 10-30x: well inside 128x.
    assert_eq!(default_max_decompressed(64 << 20), 8 << 30);
    assert_eq!(default_max_decompressed(1 << 40), DEFAULT_MAX_DECOMPRESSED);
    let (limit, why) = ReadOptions {
        max_decompressed: Some(5),
    }
    .limit(100)
    .unwrap();
    assert_eq!((limit, why.as_str()), (5, "the limit set by the caller"));
}

#[test]
fn serde_messages_are_cut_in_the_middle_and_name_the_depth_limit() {
    let long = format!(
        "invalid type: string \"{}\", expected u64",
        "9".repeat(1 << 20)
    );
    let m = serde_message(&long);
    assert!(m.len() < 2 * MSG_MAX, "{}", m.len());
    assert!(m.starts_with("invalid type: string \"999"), "{m}");
    assert!(m.ends_with("\", expected u64"), "{m}");
    assert!(
        serde_message("recursion limit exceeded at line 1 column 300")
            .contains("nested deeper than 128 levels")
    );
    assert_eq!(
        serde_message("expected value at line 3 column 4"),
        "expected value"
    );
}

#[test]
fn attribute_words_are_their_own_index() {
    let mut strings = Interner::default();
    for (i, w) in ATTR_WORDS.iter().enumerate() {
        assert!(
            matches!(Word::of(w, &mut strings), Word::Known(k) if k as usize == i),
            "{w}"
        );
    }
    assert!(matches!(Word::of("rf_i", &mut strings), Word::Other(_)));
}

#[test]
fn field_names_are_the_keys_they_come_from() {
    for k in [
        "id",
        "name",
        "ctrl_deps",
        "parent",
        "rf_id",
        "fw_parent",
        "seq_id",
        "scope",
        "tid",
        "fw_tid",
        "op_schema",
        "kernel_backend",
        "kernel_file",
        "inputs",
        "outputs",
        "input_shapes",
        "input_types",
        "input_strides",
        "output_shapes",
        "output_types",
        "output_strides",
        "attrs",
    ] {
        assert_eq!(field_name(field(k)), k);
    }
}
